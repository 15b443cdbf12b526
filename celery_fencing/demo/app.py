"""The Celery app demo workers run: ``celery -A celery_fencing.demo.app worker``.

Configured entirely by the ``CELERY_FENCING_DEMO_*`` environment variables that
``celery-fencing demo`` sets for its workers (see :mod:`.settings`).
"""

from __future__ import annotations

from .settings import DemoSettings
from .tasks import build_app

app = build_app(DemoSettings.from_env())
