"""The test app's label."""

from __future__ import annotations

from django.apps import AppConfig


class FencingTestAppConfig(AppConfig):
    name = "tests.django.testapp"
    label = "fencing_testapp"
    default_auto_field = "django.db.models.BigAutoField"
