"""The Celery layer: fenced tasks, worker flags, and the fenced result backend.

Quickstart::

    from celery import Celery
    from celery_fencing.celery import FencedTask, install

    app = install(Celery("bank", broker="redis://127.0.0.1:6379/0",
                         backend="fenced+redis://127.0.0.1:6379/1"))
    app.conf.fencing_source = "zookeeper://127.0.0.1:2181/fencing"

    @app.task(base=FencedTask, fencing_resource="account:{account_id}")
    def deposit(account_id, amount): ...

``FencedRedisBackend`` is loaded by Celery from the ``fenced+redis://`` URL;
import it from :mod:`celery_fencing.celery.backend` to subclass it.
"""

from __future__ import annotations

from . import signals
from .decorator import fenced_task
from .task import FencedTask
from .worker import FencingBootstep, install, uninstall

__all__ = ["FencedTask", "FencingBootstep", "fenced_task", "install", "signals", "uninstall"]
