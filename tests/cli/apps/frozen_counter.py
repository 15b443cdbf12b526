"""An app whose token source is not monotonic: it hands out a version number that never changes.

That is what a source built on a timestamp or a resettable counter does at
the wrong moment; the doctor must refuse it. CFT_BROKER broker URL.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_fencing import FencingToken
from celery_fencing.celery import FencedTask, install


class FixedVersionSource:
    """Mints the same value every time: a broken grantor."""

    volatile = False

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        return FencingToken(resource, 7)

    def close(self) -> None:
        pass


app = install(Celery("frozen_counter", broker=os.environ["CFT_BROKER"]))
app.conf.fencing_source = FixedVersionSource()


@app.task(base=FencedTask)
def job() -> None:
    """Never run."""
