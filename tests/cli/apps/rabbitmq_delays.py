"""An app on RabbitMQ with acks_late and retry delays of an hour: notes about consumer_timeout, not failures.

CFT_BROKER RabbitMQ URL, CFT_SOURCE token source URL.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_fencing.celery import FencedTask, install

app = install(Celery("rabbitmq_delays", broker=os.environ["CFT_BROKER"]))
app.conf.update(task_acks_late=True, fencing_source=os.environ["CFT_SOURCE"], fencing_retry_max_delay=3600)


@app.task(base=FencedTask, fencing_resource="job:{name}")
def job(name: str) -> None:
    """Never run."""
