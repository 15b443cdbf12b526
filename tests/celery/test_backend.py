"""The fenced+redis result backend against the real Redis: drops, tokenless writes, wake-ups."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery, states
from celery.app.task import Context

from celery_fencing import AlreadyAppliedError, FencingToken, StaleTokenError
from celery_fencing.celery import signals
from celery_fencing.celery.backend import FencedRedisBackend
from celery_fencing.context import Execution


def request_with(token: FencingToken | None) -> Context:
    request = Context(id="t", task="x", args=(), kwargs={})
    if token is not None:
        request.fencing_token = token
    return request


def test_url_scheme_loads_the_fenced_backend(app: Celery) -> None:
    """fenced+redis:// resolves, through the celery.result_backends entry point, to FencedRedisBackend."""
    assert isinstance(app.backend, FencedRedisBackend)


def test_stale_result_write_is_dropped_and_signalled(app: Celery) -> None:
    """A result write with a token below the stored mark changes nothing and sends result_dropped."""
    dropped: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        dropped.append(kwargs)

    signals.result_dropped.connect(receiver, weak=False)
    try:
        backend = app.backend
        backend.store_result("tid", "newer", states.SUCCESS, request=request_with(FencingToken("tid", 9)))
        backend.store_result("tid", "stale", states.SUCCESS, request=request_with(FencingToken("tid", 7)))
    finally:
        signals.result_dropped.disconnect(receiver)
    assert app.AsyncResult("tid").get(timeout=5) == "newer"
    assert len(dropped) == 1
    assert dropped[0]["task_id"] == "tid" and dropped[0]["high_water"] == 9 and dropped[0]["reason"] == "stale token"


def test_equal_token_may_write_again(app: Celery) -> None:
    """One execution writes STARTED then SUCCESS with the same token: both land."""
    token = FencingToken("tid", 5)
    app.backend.store_result("tid", {"pid": 1}, states.STARTED, request=request_with(token))
    app.backend.store_result("tid", 42, states.SUCCESS, request=request_with(token))
    assert app.AsyncResult("tid").get(timeout=5) == 42


def test_tokenless_write_never_overwrites_a_tokened_final_result(app: Celery) -> None:
    """The parent's WorkerLost FAILURE (no token) cannot replace a SUCCESS written with a token."""
    app.backend.store_result("tid", "done", states.SUCCESS, request=request_with(FencingToken("tid", 3)))
    app.backend.mark_as_failure("tid", RuntimeError("WorkerLostError"), request=request_with(None))
    assert app.AsyncResult("tid").state == states.SUCCESS


def test_tokenless_write_may_end_a_started_execution(app: Celery) -> None:
    """A tokenless FAILURE after a tokened STARTED lands (the child died), and a later stale write still cannot."""
    app.backend.store_result("tid", {"pid": 1}, states.STARTED, request=request_with(FencingToken("tid", 3)))
    app.backend.mark_as_failure("tid", RuntimeError("lost"), request=request_with(None))
    assert app.AsyncResult("tid").state == states.FAILURE
    app.backend.store_result("tid", "stale", states.SUCCESS, request=request_with(FencingToken("tid", 2)))
    assert app.AsyncResult("tid").state == states.FAILURE


def test_claim_fences_out_older_executions(app: Celery) -> None:
    """claim_result raises the mark: an older token's claim or write is refused afterwards."""
    app.backend.claim_result("tid", FencingToken("tid", 10))
    with pytest.raises(StaleTokenError) as info:
        app.backend.claim_result("tid", FencingToken("tid", 9))
    assert info.value.high_water == 10
    app.backend.store_result("tid", "old", states.SUCCESS, request=request_with(FencingToken("tid", 9)))
    assert app.AsyncResult("tid").state == states.PENDING


def test_token_of_another_resource_is_dropped(app: Celery) -> None:
    """A result fenced under one resource refuses a token of another resource, even a larger one."""
    app.backend.store_result("tid", "a", states.SUCCESS, request=request_with(FencingToken("account:1", 5)))
    app.backend.store_result("tid", "b", states.SUCCESS, request=request_with(FencingToken("account:2", 50)))
    assert app.AsyncResult("tid").get(timeout=5) == "a"


def test_exactness_beyond_two_to_the_53(app: Celery) -> None:
    """Tokens 2**53 + 1 and 2**53 differ: the older one is dropped (Lua doubles would call them equal)."""
    app.backend.store_result("tid", "newer", states.SUCCESS, request=request_with(FencingToken("tid", 2**53 + 1)))
    app.backend.store_result("tid", "older", states.SUCCESS, request=request_with(FencingToken("tid", 2**53)))
    assert app.AsyncResult("tid").get(timeout=5) == "newer"


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


def _sealing_request(token: FencingToken, *, with_result: bool) -> tuple[Context, Execution]:
    execution = Execution(token, task_id="tid", once=True, seals_with_result=with_result)
    request = request_with(token)
    request.fencing_execution = execution
    return request, execution


def test_first_execution_to_seal_wins_whatever_the_tokens(app: Celery) -> None:
    """Exactly once: the older execution seals first; the newer one's seal is refused and its result not stored."""
    backend = app.backend
    older, newer = FencingToken("tid", 7), FencingToken("tid", 9)
    backend.claim_result("tid", older)
    backend.claim_result("tid", newer)
    older_request, older_execution = _sealing_request(older, with_result=False)
    backend.seal_result("tid", older_execution)
    backend.store_result("tid", "older", states.SUCCESS, request=older_request)
    _, newer_execution = _sealing_request(newer, with_result=False)
    with pytest.raises(AlreadyAppliedError):
        backend.seal_result("tid", newer_execution)
    with pytest.raises(AlreadyAppliedError):
        backend.claim_result("tid", FencingToken("tid", 11))
    assert app.AsyncResult("tid").get(timeout=5) == "older"


def test_a_sealing_result_write_is_first_wins_and_reports_the_duplicate(app: Celery) -> None:
    """Without callbacks the seal rides on the result write: the second writer is a duplicate prevented, not a drop."""
    prevented: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []

    def on_duplicate(sender: Any, **kwargs: Any) -> None:
        prevented.append(kwargs)

    def on_dropped(sender: Any, **kwargs: Any) -> None:
        dropped.append(kwargs)

    signals.duplicate_prevented.connect(on_duplicate, weak=False)
    signals.result_dropped.connect(on_dropped, weak=False)
    try:
        backend = app.backend
        older, newer = FencingToken("tid", 7), FencingToken("tid", 9)
        backend.claim_result("tid", newer)
        backend.store_result("tid", "older", states.SUCCESS, request=_sealing_request(older, with_result=True)[0])
        backend.store_result("tid", "newer", states.SUCCESS, request=_sealing_request(newer, with_result=True)[0])
    finally:
        signals.duplicate_prevented.disconnect(on_duplicate)
        signals.result_dropped.disconnect(on_dropped)
    assert app.AsyncResult("tid").get(timeout=5) == "older"
    assert [(p["task_id"], p["phase"]) for p in prevented] == [("tid", "result")]
    assert dropped == []


def test_without_a_seal_the_older_result_is_dropped(app: Celery) -> None:
    """Negative control: the same writes without exactly-once follow token order, and the older result is dropped."""
    backend = app.backend
    older, newer = FencingToken("tid", 7), FencingToken("tid", 9)
    backend.claim_result("tid", newer)
    backend.store_result("tid", "older", states.SUCCESS, request=request_with(older))
    backend.store_result("tid", "newer", states.SUCCESS, request=request_with(newer))
    assert app.AsyncResult("tid").get(timeout=5) == "newer"


def test_forget_removes_the_fence_with_the_result(app: Celery) -> None:
    """AsyncResult.forget() deletes the fence hash too: a later result for the same id is stored, not dropped."""
    backend = app.backend
    backend.store_result("tid", "first", states.SUCCESS, request=request_with(FencingToken("tid", 9)))
    app.AsyncResult("tid").forget()
    assert not backend.client.exists(backend.get_key_for_fence("tid"))
    backend.store_result("tid", "again", states.SUCCESS, request=request_with(None))
    assert app.AsyncResult("tid").get(timeout=5) == "again"
