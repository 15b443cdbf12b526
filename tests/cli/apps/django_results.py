"""An app whose results go to ``fenced+django-db``, in the test session's Django project.

The project's databases come from the environment the session's
``django_project`` fixture set (:mod:`tests.django.settings`);
FENCING_DJANGO_RESULTS names the alias of the results. CFT_BROKER broker URL,
CFT_SOURCE token source URL.
"""

from __future__ import annotations

import os

from tests.django.adapters import setup_django

setup_django()

from celery import Celery  # noqa: E402

from celery_fencing.celery import FencedTask, install  # noqa: E402

app = install(Celery("django_results", broker=os.environ["CFT_BROKER"], backend="fenced+django-db"))
app.conf.fencing_source = os.environ["CFT_SOURCE"]


@app.task(base=FencedTask)
def work() -> str:
    """A fenced task with a result (never run by the doctor)."""
    return "done"
