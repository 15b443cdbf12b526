"""The fenced worker's app module, a template: pytest-celery writes the user's imports, app name and config in.

The three placeholder lines are pytest-celery's (``WorkerInitialContent``
replaces them verbatim). The template adds what makes the worker fenced:
the token source from ``CELERY_FENCING_SOURCE``, more settings from
``CELERY_SETTINGS`` (a JSON object), and :func:`install` on the app; and,
when the test shares its events file, records the library's signals into it.
"""

from __future__ import annotations

import json
import os

from celery import Celery

from celery_fencing.celery import install
from celery_fencing.testing import events

imports = None

app = Celery("celery_test_app")
config = None

if config:
    app.config_from_object(config)
if os.environ.get("CELERY_FENCING_SOURCE"):
    app.conf.fencing_source = os.environ["CELERY_FENCING_SOURCE"]
if os.environ.get("CELERY_SETTINGS"):  # more settings of one test, as a JSON object
    app.conf.update(json.loads(os.environ["CELERY_SETTINGS"]))
install(app)
if os.environ.get(events.ENV_VAR):  # the test's fencing_events, shared into the container
    events.record_events(os.environ[events.ENV_VAR])
