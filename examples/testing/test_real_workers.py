"""Real workers: a deposit re-delivered while its first execution is frozen after its read, with ZooKeeper.

w1 (a real ``celery worker`` process) reads 100 and is held at its pause
point past the Redis visibility timeout; the broker re-delivers the message
to w2, which deposits (110); another deposit follows (115); then w1 is
released. Fenced, w1's write is refused and the deposit is applied once: 115.
Unfenced, w1 writes 110 over the 115.

Run: ``pytest examples/testing/test_real_workers.py`` (Redis on 127.0.0.1:6379,
Debian's ``zookeeper`` package for the throwaway ZooKeeper).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from celery_fencing.testing import (
    PausePoints,
    ZooKeeperServer,
    assert_applied_once,
    assert_fenced_out,
    redis_redelivery_settings,
)
from celery_fencing.testing.events import FencingEvents
from celery_fencing.testing.plugin import FencedWorkers

from .app import NAMESPACE, balance_key, deposit, store


@pytest.fixture
def account() -> Iterator[int]:
    """A fresh account holding 100 (its keys removed after)."""
    account_id = uuid.uuid4().int % 10**9
    store().set(balance_key(account_id), 100)
    yield account_id
    store().delete(*store().scan_iter(f"{NAMESPACE}:*{account_id}*"))  # the balance and its fence keys


def test_a_redelivered_deposit_is_applied_once(
    account: int,
    fencing_zookeeper: ZooKeeperServer,
    fencing_workers: FencedWorkers,
    fencing_pause_points: PausePoints,
    fencing_events: FencingEvents,
) -> None:
    """w1's stale write is refused after the re-delivered copy and a later deposit landed: 100 + 10 + 5."""
    worker = {
        "source": fencing_zookeeper.url(f"/bank-{account}"),
        "settings": redis_redelivery_settings(visibility_timeout=2),
    }
    fencing_pause_points.hold("after-read")
    w1 = fencing_workers.start("examples.testing.app", **worker)
    task = deposit.delay(account, 10)
    frozen = fencing_pause_points.wait("after-read")  # w1 read 100
    w2 = fencing_workers.start("examples.testing.app", **worker)
    copy = fencing_pause_points.wait("after-read", 2)  # the visibility timeout re-delivered it to w2
    assert (copy.pid, copy.task_id) == (w2.pid, task.id)
    fencing_events.wait_ended(task.id, pid=w2.pid)  # 100 -> 110
    later = deposit.delay(account, 5)
    fencing_events.wait_ended(later.id)  # 110 -> 115, on w2 (w1 is still frozen)
    frozen.release()
    fencing_events.wait_ended(task.id, 2)  # w1's execution ended too

    assert int(store().get(balance_key(account))) == 115
    assert_fenced_out(fencing_events, task.id, pid=w1.pid)
    assert_applied_once(fencing_events, task.id)
