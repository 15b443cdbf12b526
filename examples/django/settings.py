"""Settings of the example project: SQLite in ``EXAMPLE_DIR`` unless ``EXAMPLE_DATABASE_URL`` names PostgreSQL.

``EXAMPLE_DATABASE_URL=postgresql://user@host:5432/db`` (query parameters, such as
``?options=-c search_path=myschema``, become the connection's ``OPTIONS``).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

SECRET_KEY = "example-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["celery_fencing.contrib.django", "examples.django.ledger"]

_url = os.environ.get("EXAMPLE_DATABASE_URL", "")
if _url.startswith(("postgresql://", "postgres://")):
    _parts = urlsplit(_url)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _parts.path.lstrip("/"),
            "USER": _parts.username or "postgres",
            "PASSWORD": _parts.password or "",
            "HOST": _parts.hostname or "127.0.0.1",
            "PORT": str(_parts.port or 5432),
            "OPTIONS": {"connect_timeout": 5, **dict(parse_qsl(_parts.query))},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(Path(os.environ.get("EXAMPLE_DIR", ".")) / "ledger.db"),
            # Writers wait for SQLite's file lock instead of failing at once.
            "OPTIONS": {"timeout": 30},
        }
    }
