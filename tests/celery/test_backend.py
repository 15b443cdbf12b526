"""What only the fenced+redis result backend does, against the real Redis: its scheme, and pub/sub wake-ups.

The rules every fenced backend follows (drops, tokenless writes, claims,
seals, grantors, forget) are the backend contract suite's, tests/celery/backends/.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery, states
from celery.app.task import Context

from celery_fencing import AlreadyAppliedError, BelowFloorError, FencingToken, GateUnavailableError, MemoryTokenSource
from celery_fencing.celery import signals
from celery_fencing.celery.backend import FencedRedisBackend
from celery_fencing.celery.seals import sealed_by_another
from celery_fencing.context import Execution
from tests.fixtures.services import armed


def request_with(token: FencingToken | None) -> Context:
    request = Context(id="t", task="x", args=(), kwargs={})
    if token is not None:
        request.fencing_token = token
    return request


def test_url_scheme_loads_the_fenced_backend(app: Celery) -> None:
    """fenced+redis:// resolves, through the celery.result_backends entry point, to FencedRedisBackend."""
    assert isinstance(app.backend, FencedRedisBackend)


def test_get_wakes_up_on_a_fenced_write(app: Celery) -> None:
    """AsyncResult.get() waiting on pub/sub returns when the fenced backend stores the result."""
    result = app.AsyncResult("tid")
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(result.get(timeout=20)))
    waiter.start()
    # Wait until the waiter subscribed: the pub/sub channel for the key has a subscriber.
    key = app.backend.get_key_for_task("tid")
    for _ in range(400):
        if app.backend.client.pubsub_numsub(key)[0][1]:
            break
        threading.Event().wait(0.01)
    app.backend.store_result("tid", "ok", states.SUCCESS, request=request_with(FencingToken("tid", 1)))
    waiter.join(20)
    assert got == ["ok"]


def test_a_fence_outlives_a_result_that_expires_before_the_redelivery_horizon(redis_url: str, unique_name: str) -> None:
    """result_expires of 5 s under a 1-hour visibility timeout: the result goes at 5 s, its fence stays an hour.

    A copy the broker re-delivers within the horizon must still find the fence
    (and the seal) after the result expired, or it would store over the
    applied result. The control is the result key's own TTL: Celery's.
    """
    app = Celery("fenced-backend-expiry", backend="fenced+" + redis_url, set_as_current=False)
    app.conf.result_backend_transport_options = {"global_keyprefix": f"{unique_name}:"}
    app.conf.result_expires = 5
    app.conf.broker_transport_options = {"visibility_timeout": 3600}
    backend = app.backend
    try:
        armed(backend)
        token = FencingToken("tid", 7)
        backend.claim_result("tid", token)
        assert 3590 <= backend.client.ttl(backend.get_key_for_fence("tid")) <= 3600
        backend.store_result("tid", "ok", states.SUCCESS, request=request_with(token))
        assert 0 < backend.client.ttl(backend.get_key_for_task("tid")) <= 5
        assert 3590 <= backend.client.ttl(backend.get_key_for_fence("tid")) <= 3600
    finally:
        keys = list(backend.client.scan_iter(f"{unique_name}:*"))
        if keys:
            backend.client.delete(*keys)
        app.close()


@pytest.mark.parametrize("junk", ["x" * 20, "not a floor, not digits at all", "00000000000000000005junk"])
def test_a_floor_key_holding_no_floor_drops_every_fenced_write_and_never_raises(
    app: Celery, junk: str, unique_name: str
) -> None:
    """A result floor key overwritten with something else fails closed: a fenced write is dropped and reported
    (result_dropped names the key), never raised from the backend, never let through; a claim raises
    GateUnavailableError (retried with backoff, not taken for a newer execution); arming leaves the key."""
    backend = app.backend
    backend.client.set(backend.floor_key, junk)
    other = Celery("other-process", backend=app.conf.result_backend, set_as_current=False)
    other.conf.result_backend_transport_options = app.conf.result_backend_transport_options
    try:
        assert other.backend.ensure_armed("t", MemoryTokenSource()) is None  # no floor read, no error
    finally:
        other.close()
    dropped: list[dict[str, Any]] = []

    def on_dropped(sender: Any, **kwargs: Any) -> None:
        dropped.append(kwargs)

    signals.result_dropped.connect(on_dropped, weak=False)
    try:
        for value in (1, 2**62):
            backend.store_result("t", "ok", states.SUCCESS, request=request_with(FencingToken("t", value)))
    finally:
        signals.result_dropped.disconnect(on_dropped)
    with pytest.raises(GateUnavailableError, match="floor key holds no valid floor"):
        backend.claim_result("t", FencingToken("t", 2**62))  # the store is out of use, not a newer execution
    assert backend.get_task_meta("t")["status"] == states.PENDING
    assert [d["reason"] for d in dropped] == ["the store's floor key holds no valid floor"] * 2
    assert backend.client.get(backend.floor_key) == junk.encode()


def test_a_token_below_the_floor_sees_another_executions_seal(app: Celery) -> None:
    """Below the result store's floor, a claim on a task another execution sealed is refused as done, not as below.

    A copy that met an older execution's applied record waits for that one's
    seal by claiming with its own token (sealed_by_another); a token of a
    block reserved before the floor was refused at the floor, before the seal
    could be seen, and the copy waited out the whole timeout. The same claim on
    an unsealed task is still refused below the floor, and so is the sealer's
    own seal with its old token (it is not another execution's).
    """
    backend = app.backend
    backend.arm(FencingToken("any", 100))
    sealer = Execution(FencingToken("sealed-task", 150), task_id="sealed-task")
    backend.claim_result("sealed-task", sealer.token)
    backend.seal_result("sealed-task", sealer)
    old = FencingToken("sealed-task", 40)
    with pytest.raises(AlreadyAppliedError):
        backend.claim_result("sealed-task", old)
    assert sealed_by_another(backend, "sealed-task", old, timeout=0.2)
    with pytest.raises(BelowFloorError):
        backend.claim_result("unsealed-task", FencingToken("unsealed-task", 40))
    assert not sealed_by_another(backend, "unsealed-task", FencingToken("unsealed-task", 40), timeout=0.2)
    with pytest.raises(BelowFloorError):
        backend.seal_result("sealed-task", Execution(old, task_id="sealed-task", execution_id=sealer.execution_id))
