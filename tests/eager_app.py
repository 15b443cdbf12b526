"""A Celery app that runs fenced tasks eagerly, in the calling thread, on an in-memory token source.

How the unit tests pin FencedTask's logic without a broker or a worker; the
real-worker tests (tests/celery) prove the same in processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from celery import Celery

from celery_fencing import MemoryTokenSource


@contextlib.contextmanager
def eager_app(name: str, **conf: Any) -> Iterator[Celery]:
    """A fresh app (never the current one): eager tasks, a MemoryTokenSource, then *conf*; closed on the way out."""
    app = Celery(name, set_as_current=False)
    app.conf.update(
        task_always_eager=True,
        fencing_source=MemoryTokenSource(),
        fencing_allow_volatile_source=True,
        **conf,
    )
    try:
        yield app
    finally:
        app.close()
