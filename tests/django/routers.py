"""Where the test project's django-celery-results rows go: the alias in :data:`results_alias`.

The fenced django-db backend keeps its fence rows beside them (it asks the
router too), so the backend contract suite runs it on SQLite or PostgreSQL by
setting this one name; worker processes read it from ``FENCING_DJANGO_RESULTS``.
"""

from __future__ import annotations

import os
from typing import Any

#: The alias of django-celery-results' tables (and so of the fenced backend's fence rows).
results_alias = os.environ.get("FENCING_DJANGO_RESULTS", "default")


class ResultsRouter:
    """Routes django_celery_results' models to :data:`results_alias`; everything else as Django would."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return results_alias if model._meta.app_label == "django_celery_results" else None

    db_for_write = db_for_read
