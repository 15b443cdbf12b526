"""An app minting from one etcd server, in exclusive mode with fencing_timeout above the lease TTL.

CFT_ETCD etcd endpoint (host:port), CFT_BROKER broker URL.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_fencing.celery import FencedTask, install

app = install(Celery("etcd_exclusive", broker=os.environ["CFT_BROKER"]))
app.conf.update(
    fencing_source=f"etcd://{os.environ['CFT_ETCD']}/doctor-etcd?lease_ttl=3",
    fencing_mode="exclusive",
    fencing_timeout=5,
)


@app.task(base=FencedTask, fencing_resource="job:{name}")
def job(name: str) -> None:
    """Never run."""
