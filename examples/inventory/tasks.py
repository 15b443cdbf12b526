"""An inventory counter on Redis: reservations that can never oversell, even with stale workers.

``reserve`` is a read-modify-write: read the stock, decide in Python (here a
simple "enough left?", in real life pricing or allocation rules), then write
the new stock and the order's reservation. It is fenced on the product:

1. ``fencing_resource="sku:{sku}"``: a token per execution;
2. ``fencing_gates``: the token is claimed at the RedisGate before the body
   reads, so an older reservation of this product still in flight is fenced out;
3. the two writes go in **one** gated Lua script (``gate.eval``): the fence
   check, the new stock and the reservation are atomic. Two separate gated
   writes could be split by a newer claim, leaving the stock decremented and
   the order unrecorded;
4. a refused attempt retries with a new token and a fresh read.

On Redis Cluster, put one hash tag in the resource and in the keys (``sku:{42}``,
``stock:{42}``): a script may touch one slot only.

Configuration (environment): ``EXAMPLE_REDIS_URL`` (the data), ``EXAMPLE_BROKER``,
``FENCING_SOURCE``, ``EXAMPLE_NAMESPACE`` (key and queue names).
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

import redis
from celery import Celery, Task

from celery_fencing import RedisGate
from celery_fencing.celery import FencedTask, install

NAMESPACE = os.environ.get("EXAMPLE_NAMESPACE", "inventory")
REDIS_URL = os.environ.get("EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/0")
THINK = float(os.environ.get("EXAMPLE_THINK", "0.05"))

# KEYS[1] stock, KEYS[2] reservations hash; ARGV[1] new stock, ARGV[2] order id, ARGV[3] outcome
RESERVE = """
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""


def stock_key(sku: str) -> str:
    return f"{NAMESPACE}:stock:{sku}"


def reservations_key(sku: str) -> str:
    return f"{NAMESPACE}:reservations:{sku}"


@cache
def client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL, decode_responses=True)


@cache
def gate() -> RedisGate:
    return RedisGate(client(), prefix=f"{NAMESPACE}:fence")


app = install(Celery("inventory", broker=os.environ.get("EXAMPLE_BROKER", REDIS_URL)))
app.conf.update(
    task_default_queue=NAMESPACE,
    fencing_source=os.environ.get("FENCING_SOURCE", "sqlite:///inventory-tokens.db"),
    fencing_retry_countdown=0.05,
    fencing_retry_max_delay=1.0,
    fencing_max_retries=50,
)


def gates() -> list[Any]:
    return [gate()]


@app.task(bind=True, base=FencedTask, fencing_resource="sku:{sku}", fencing_gates=gates)
def reserve(self: Task, sku: str, order_id: str, quantity: int) -> bool:
    """Reserve *quantity* units for the order if enough are left; record the outcome either way."""
    stock = int(client().get(stock_key(sku)) or 0)  # read after the claim
    time.sleep(THINK)
    if stock >= quantity:
        new_stock, outcome = stock - quantity, str(quantity)
    else:
        new_stock, outcome = stock, "out of stock"
    # None: this execution's token. Refused as a whole if a newer reservation claimed the product.
    gate().eval(None, RESERVE, keys=[stock_key(sku), reservations_key(sku)], args=[new_stock, order_id, outcome])
    return outcome != "out of stock"
