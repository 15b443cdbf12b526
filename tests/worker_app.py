"""What the suite's worker apps share (tests/celery and tests/sinks): a Celery app configured from ``FT_*``,
and the test's own keys on Redis.

FT_BROKER, FT_BACKEND, FT_QUEUE and FT_SOURCE name the broker, the result
backend, the test's queue and the token source; FT_VISIBILITY_TIMEOUT makes
the Redis broker re-deliver a running ``acks_late`` task after that many
seconds (:func:`redelivery_from_env`, applied last, over what the app set).
FT_REDIS and FT_PREFIX name the Redis and the key prefix of the test's data,
its event log (:func:`event`) and its release keys (:func:`wait_released`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_fencing.celery import install
from celery_fencing.testing.redelivery import redis_redelivery_settings

PREFIX = os.environ.get("FT_PREFIX", "ft")

_client: redis.Redis | None = None


def app_from_env(name: str, **conf: Any) -> Celery:
    """A fenced app for one test's workers: late acks, one message at a time, quick fencing retries; then *conf*."""
    app = install(Celery(name, broker=os.environ.get("FT_BROKER"), backend=os.environ.get("FT_BACKEND")))
    app.conf.update(
        task_default_queue=os.environ.get("FT_QUEUE", "celery"),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        result_expires=600,
        fencing_retry_countdown=0.05,
        fencing_retry_max_delay=0.5,
        fencing_retry_backoff_factor=1.5,
        **conf,
    )
    if os.environ.get("FT_SOURCE"):
        app.conf.fencing_source = os.environ["FT_SOURCE"]
    return app


def redelivery_from_env(app: Celery) -> None:
    """With FT_VISIBILITY_TIMEOUT, merge a short visibility timeout into the app's broker transport options."""
    if os.environ.get("FT_VISIBILITY_TIMEOUT"):
        settings = redis_redelivery_settings(float(os.environ["FT_VISIBILITY_TIMEOUT"]))
        app.conf.broker_transport_options = {
            **(app.conf.broker_transport_options or {}),  # e.g. a test's own unacked keys
            **settings["broker_transport_options"],
        }


def data() -> redis.Redis:
    """This process's Redis client for the test's data (redis-py rebuilds its pool after fork)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["FT_REDIS"])
    return _client


def key(*parts: object) -> str:
    return ":".join([PREFIX, *map(str, parts)])


def event(*fields: object) -> None:
    """Append one line to the test's event log (plain write: what happened, in order)."""
    data().rpush(key("events"), " ".join(map(str, fields)))


def wait_released(task_id: str, token: int, limit: float = 120) -> None:
    # The test decides when this execution (task id + token) may go on: it sets the release key.
    deadline = time.monotonic() + limit
    while not data().exists(key("release", task_id, token)) and time.monotonic() < deadline:
        time.sleep(0.02)
