"""A long export re-delivered by the Redis visibility timeout, with the duplicate fenced out.

The trap (celery issues #5935, #2599, #3270, #4426): with ``acks_late`` the
message stays unacknowledged while the task runs, and kombu's Redis transport
hands an unacknowledged message to another worker once ``visibility_timeout``
has passed, *while the first execution is still running*. Two executions of
the same task then write the same output.

``export`` is fenced on its task id (FencedTask's default resource), so every
delivery of the message gets a newer token and claims it at the gate when it
starts. The job writes its output in chunks, each one a gated ``hset`` that
doubles as a checkpoint:

* a newer execution resumes after the last accepted chunk;
* the older execution is refused at its next checkpoint and stops there,
  instead of finishing the whole job a second time. It defers (``defer``, the
  default policy for task-id resources): it publishes a retry for later and
  acknowledges. On Redis that acknowledgement also removes the newer
  execution's unacked entry (every delivery of a message shares its delivery
  tag), so if the newer execution died, the retry is what finishes the job;
  if it lived, the retry resumes after the last chunk and has nothing left to
  write.

The task sets ``fencing_once=False``: it resumes from its own checkpoints,
so a newer execution is meant to write after an older one applied chunks.
With exactly-once (the default) the newer execution's first checkpoint would
find the task applied by the older one and stop there, leaving the job
unfinished if the older one never comes back. A job whose every step is
keyed like this already makes a repeat harmless; exactly-once is for tasks
whose effect must not happen twice.

The real fix for the duplicate work is a ``time_limit`` below the visibility
timeout (``celery-fencing doctor`` reports tasks without one); fencing makes
the duplicate harmless when it happens anyway.

Configuration (environment): ``EXAMPLE_REDIS_URL`` (data and broker),
``FENCING_SOURCE``, ``EXAMPLE_NAMESPACE``.
"""

from __future__ import annotations

import json
import os
import time
from functools import cache
from typing import Any

import redis
from celery import Celery, Task

from celery_fencing import RedisGate, StaleTokenError
from celery_fencing.celery import FencedTask, install

NAMESPACE = os.environ.get("EXAMPLE_NAMESPACE", "redelivery")
REDIS_URL = os.environ.get("EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/0")
VISIBILITY_TIMEOUT = 2.0  # seconds; kombu's default is 3600
CHUNK_SECONDS = 0.5

app = install(Celery("redelivery", broker=os.environ.get("EXAMPLE_BROKER", REDIS_URL)))
app.conf.update(
    task_default_queue=NAMESPACE,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={
        "visibility_timeout": VISIBILITY_TIMEOUT,
        # kombu sweeps unacknowledged messages every interval x throttle seconds (10 x 10 by
        # default, whatever the visibility timeout): sweep every second so the example is quick.
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    fencing_source=os.environ.get("FENCING_SOURCE", "sqlite:///redelivery-tokens.db"),
)


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


@cache
def gate() -> RedisGate:
    return RedisGate(client(), prefix=f"{NAMESPACE}:fence")


def gates() -> list[Any]:
    return [gate()]


def chunks_key(export_id: str) -> str:
    return f"{NAMESPACE}:export:{export_id}:chunks"


def done_key(export_id: str) -> str:
    return f"{NAMESPACE}:export:{export_id}:done"


def story(**event: Any) -> None:
    """Tell the runner what happened (a plain list: the narrative, not protected data)."""
    client().rpush(f"{NAMESPACE}:story", json.dumps({"t": time.time(), **event}))


@app.task(bind=True, base=FencedTask, fencing_gates=gates, fencing_once=False)
def export(self: Task, export_id: str, chunks: int) -> int:
    """Produce *chunks* chunks of output, resuming after the last checkpoint a previous execution left."""
    token = self.request.fencing_token.value
    worker = self.request.hostname.split("@")[0]
    first = client().hlen(chunks_key(export_id))  # read after the claim: older executions can no longer add chunks
    story(event="start", worker=worker, token=token, resume_from=first, retry=self.request.retries or 0)
    for chunk in range(first, chunks):
        time.sleep(CHUNK_SECONDS)  # the work: a query, a render, an upload
        try:
            gate().hset(None, chunks_key(export_id), {f"chunk-{chunk:02d}": f"token {token}"})
        except StaleTokenError as exc:
            story(event="fenced_out", worker=worker, token=token, chunk=chunk, mark=exc.high_water)
            raise  # FencedTask's policy for a task-id resource: defer to the newer execution, retry later
    gate().set(None, done_key(export_id), token)
    story(event="done", worker=worker, token=token, resume_from=first, chunks=chunks)
    return token
