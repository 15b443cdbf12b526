"""The deposit as the worker containers run it: examples/testing/app.py's body, as a shared task.

pytest-celery copies this module and ``app.py`` into each worker container's
``/app`` and imports both into its own app (the kit's template, with
``install(app)``), so the task is registered there as ``bank.deposit``,
fenced or not as ``EXAMPLE_FENCING`` says in the container.
"""

from __future__ import annotations

from celery import shared_task

from examples.testing.app import FENCED, FENCING, _deposit

deposit = shared_task(name="bank.deposit", **(FENCING if FENCED else {}))(_deposit)
