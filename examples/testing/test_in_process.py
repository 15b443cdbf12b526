"""In-process: an embedded worker (two threads) in the test process, and a deposit frozen between read and write.

The first deposit reads 100 and is held at its pause point; a second deposit
runs meanwhile (100 -> 120); then the first is released. Fenced, its write is
refused (a newer token claimed the account), it retries on fresh data and the
balance is 130. Unfenced, it writes 110 over the 120: a lost update.

Run: ``pytest examples/testing/test_in_process.py`` (Redis on 127.0.0.1:6379).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery.contrib.testing.worker import start_worker

from celery_fencing.testing import PausePoints, assert_applied_once, assert_fenced_out
from celery_fencing.testing.events import FencingEvents

from .app import NAMESPACE, app, balance_key, deposit, store


@pytest.fixture
def account(fencing_sqlite_source: str) -> Iterator[int]:
    """A fresh account holding 100, served by an embedded worker of the app (its keys removed after)."""
    account_id = uuid.uuid4().int % 10**9
    store().set(balance_key(account_id), 100)
    app.conf.fencing_source = fencing_sqlite_source
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        yield account_id
    store().delete(*store().scan_iter(f"{NAMESPACE}:*{account_id}*"))  # the balance and its fence keys


def test_a_deposit_frozen_after_its_read_loses_no_update(
    account: int, fencing_pause_points: PausePoints, fencing_events: FencingEvents
) -> None:
    """The frozen deposit's stale write is refused and redone on fresh data: 100 + 20 + 10."""
    fencing_pause_points.hold("after-read")  # the next deposit to read waits there
    first = deposit.delay(account, 10)
    frozen = fencing_pause_points.wait("after-read")  # it read 100
    second = deposit.delay(account, 20)
    fencing_events.wait_ended(second.id)  # 100 -> 120
    frozen.release()
    fencing_events.wait_ended(first.id)

    assert int(store().get(balance_key(account))) == 130
    assert_fenced_out(fencing_events, first.id, token=frozen.token)
    assert_applied_once(fencing_events, first.id)
