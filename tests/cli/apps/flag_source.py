"""An app whose token source is given only by the worker's flag (``--fencing-source``), as celery.md shows.

CFT_BROKER broker URL.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_fencing.celery import FencedTask, install

app = install(Celery("flag_source", broker=os.environ["CFT_BROKER"]))


@app.task(base=FencedTask, fencing_resource="account:{account_id}")
def deposit(account_id: int, amount: int) -> None:
    """A fenced task (never run by the doctor)."""
