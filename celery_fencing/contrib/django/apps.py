"""App configuration: the label ``celery_fencing`` names the app in migrations and ``migrate``."""

from __future__ import annotations

from django.apps import AppConfig


class CeleryFencingConfig(AppConfig):  # type: ignore[misc]
    """``"celery_fencing.contrib.django"`` in ``INSTALLED_APPS``."""

    name = "celery_fencing.contrib.django"
    label = "celery_fencing"
    verbose_name = "celery-fencing"
    default_auto_field = "django.db.models.BigAutoField"
