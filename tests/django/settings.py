"""A minimal Django project for the gate tests: SQLite as ``default``, PostgreSQL as ``postgres``.

Read from the environment, so spawned child processes configure themselves the
same way: ``FENCING_DJANGO_SQLITE`` (a file path), ``FENCING_DJANGO_POSTGRES``
(a SQLAlchemy-style URL) and ``FENCING_DJANGO_SCHEMA`` (this session's own
PostgreSQL schema: concurrent test runs never share tables).
``FENCING_DJANGO_RESULTS`` names the alias django-celery-results' rows go to
(``default`` unless set; see :mod:`tests.django.routers`).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_pg = urlsplit(os.environ["FENCING_DJANGO_POSTGRES"])

SECRET_KEY = "tests-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["celery_fencing.contrib.django", "django_celery_results", "tests.django.testapp"]
DATABASE_ROUTERS = ["tests.django.routers.ResultsRouter"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["FENCING_DJANGO_SQLITE"],
        "OPTIONS": {"timeout": 30},
    },
    "postgres": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _pg.path.lstrip("/"),
        "USER": _pg.username or "postgres",
        "PASSWORD": _pg.password or "",
        "HOST": _pg.hostname or "127.0.0.1",
        "PORT": str(_pg.port or 5432),
        "OPTIONS": {
            "connect_timeout": 5,
            # Bounded lock waits, and this session's schema only.
            "options": f"-c search_path={os.environ['FENCING_DJANGO_SCHEMA']} -c lock_timeout=30000",
        },
    },
    # Nothing listens on port 1: the gate must fail fast with GateUnavailableError.
    "unreachable": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "1",
        "OPTIONS": {"connect_timeout": 2},
    },
}
