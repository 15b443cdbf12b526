"""The ledger app's configuration."""

from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "examples.django.ledger"
    label = "ledger"
    default_auto_field = "django.db.models.BigAutoField"
