"""The worker app of the integration tests (:mod:`tests.celery.app_under_test`), in the Django test project.

For ``celery -A tests.celery.backends.django_worker worker`` with the
``fenced+django-db`` backend: Django is set up first, from the environment
the test session's ``django_project`` fixture set (:mod:`tests.django.settings`).
"""

from __future__ import annotations

from tests.django.adapters import setup_django

setup_django()

from tests.celery.app_under_test import app  # noqa: E402

__all__ = ["app"]
