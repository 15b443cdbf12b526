"""The fenced result backend contract, over every store (:mod:`.stores`): direct calls, each with its control.

Every fenced backend drops (never raises) and reports a result write whose
token is below the result's mark, keeps a tokenless write off a result that a
token wrote, claims and seals, checks grantors and owners, and lets
``forget()`` clear the fence. The control of each case is the same calls on
the plain backend of the same store, which stores what the fenced one drops.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, states
from celery.app.task import Context

from celery_fencing import AlreadyAppliedError, FencingToken, GrantorMismatchError, MemoryTokenSource, StaleTokenError
from celery_fencing.celery import FencedTask, signals
from celery_fencing.context import Execution
from celery_fencing.protocols import FencedResultStore

from .stores import Store


def request_with(token: FencingToken | None, execution: Execution | None = None) -> Context:
    request = Context(id="t", task="x", args=(), kwargs={})
    if token is not None:
        request.fencing_token = token
    if execution is not None:
        request.fencing_execution = execution
    return request


def sealing(tid: str, token: FencingToken, *, with_result: bool) -> tuple[Context, Execution]:
    execution = Execution(token, task_id=tid, once=True, seals_with_result=with_result)
    return request_with(token, execution), execution


@pytest.fixture
def received() -> Iterator[dict[str, list[dict[str, Any]]]]:
    """What result_dropped and duplicate_prevented sent during the test."""
    seen: dict[str, list[dict[str, Any]]] = {"dropped": [], "duplicate": []}

    def on_dropped(sender: Any, **kwargs: Any) -> None:
        seen["dropped"].append(kwargs)

    def on_duplicate(sender: Any, **kwargs: Any) -> None:
        seen["duplicate"].append(kwargs)

    signals.result_dropped.connect(on_dropped, weak=False)
    signals.duplicate_prevented.connect(on_duplicate, weak=False)
    yield seen
    signals.result_dropped.disconnect(on_dropped)
    signals.duplicate_prevented.disconnect(on_duplicate)


def state_of(app: Celery, tid: str) -> str:
    return str(app.backend.get_task_meta(tid)["status"])


def result_of(app: Celery, tid: str) -> Any:
    return app.backend.get_task_meta(tid)["result"]


def test_the_scheme_builds_a_fenced_result_store(store: Store) -> None:
    """fenced+<url> builds a backend of the FencedResultStore protocol, which the Celery layer claims through."""
    assert isinstance(store.app().backend, FencedResultStore)
    assert not isinstance(store.app(fenced=False).backend, FencedResultStore)


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
def test_stale_result_write_is_dropped_and_signalled(
    store: Store, unique_name: str, fenced: bool, received: dict[str, list[dict[str, Any]]]
) -> None:
    """A write with a token below the mark changes nothing and sends result_dropped; the plain backend stores it."""
    app, tid = store.app(fenced=fenced), unique_name
    app.backend.store_result(tid, "newer", states.STARTED, request=request_with(FencingToken(tid, 9)))
    app.backend.store_result(tid, "stale", states.SUCCESS, request=request_with(FencingToken(tid, 7)))
    if fenced:
        assert (state_of(app, tid), result_of(app, tid)) == (states.STARTED, "newer")
        assert [(d["task_id"], d["high_water"], d["reason"]) for d in received["dropped"]] == [(tid, 9, "stale token")]
    else:
        assert (state_of(app, tid), result_of(app, tid)) == (states.SUCCESS, "stale")


def test_a_tokenless_write_on_a_new_store_is_stored(store: Store, unique_name: str) -> None:
    """The result of a plain task (no token), the first write the store ever sees, is stored as by the plain backend."""
    app, tid = store.app(), unique_name
    app.backend.store_result(tid, "plain", states.SUCCESS, request=request_with(None))
    assert app.AsyncResult(tid).get(timeout=10) == "plain"


def test_equal_token_may_write_again(store: Store, unique_name: str) -> None:
    """One execution writes STARTED then SUCCESS with the same token: both land."""
    app, tid, token = store.app(), unique_name, FencingToken(unique_name, 5)
    app.backend.store_result(tid, {"pid": 1}, states.STARTED, request=request_with(token))
    assert state_of(app, tid) == states.STARTED
    app.backend.store_result(tid, 42, states.SUCCESS, request=request_with(token))
    assert app.AsyncResult(tid).get(timeout=10) == 42


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
def test_tokenless_write_never_overwrites_a_tokened_final_result(store: Store, unique_name: str, fenced: bool) -> None:
    """The parent's tokenless REVOKED cannot replace a FAILURE written with a token; the plain backend replaces it."""
    app, tid = store.app(fenced=fenced), unique_name
    app.backend.mark_as_failure(tid, RuntimeError("boom"), request=request_with(FencingToken(tid, 3)))
    app.backend.mark_as_revoked(tid, "terminated", request=request_with(None))
    assert state_of(app, tid) == (states.FAILURE if fenced else states.REVOKED)


def test_tokenless_write_never_overwrites_success(store: Store, unique_name: str) -> None:
    """The parent's WorkerLost FAILURE (no token) cannot replace a SUCCESS written with a token."""
    app, tid = store.app(), unique_name
    app.backend.store_result(tid, "done", states.SUCCESS, request=request_with(FencingToken(tid, 3)))
    app.backend.mark_as_failure(tid, RuntimeError("WorkerLostError"), request=request_with(None))
    assert state_of(app, tid) == states.SUCCESS


def test_tokenless_write_may_end_a_started_execution(store: Store, unique_name: str) -> None:
    """A tokenless FAILURE after a tokened STARTED lands (the child died), and a later stale write still cannot."""
    app, tid = store.app(), unique_name
    app.backend.store_result(tid, {"pid": 1}, states.STARTED, request=request_with(FencingToken(tid, 3)))
    app.backend.mark_as_failure(tid, RuntimeError("lost"), request=request_with(None))
    assert state_of(app, tid) == states.FAILURE
    app.backend.store_result(tid, "stale", states.SUCCESS, request=request_with(FencingToken(tid, 2)))
    assert state_of(app, tid) == states.FAILURE


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
def test_claim_fences_out_older_executions(store: Store, unique_name: str, fenced: bool) -> None:
    """claim_result raises the mark: an older token's claim raises and its write is dropped (stored without fencing)."""
    app, tid = store.app(fenced=fenced), unique_name
    if fenced:
        app.backend.claim_result(tid, FencingToken(tid, 10))
        with pytest.raises(StaleTokenError) as info:
            app.backend.claim_result(tid, FencingToken(tid, 9))
        assert info.value.high_water == 10
    app.backend.store_result(tid, "old", states.SUCCESS, request=request_with(FencingToken(tid, 9)))
    assert state_of(app, tid) == (states.PENDING if fenced else states.SUCCESS)


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
def test_token_of_another_resource_is_dropped(store: Store, unique_name: str, fenced: bool) -> None:
    """A result fenced under one resource refuses a token of another resource, even a larger one."""
    app, tid = store.app(fenced=fenced), unique_name
    app.backend.store_result(tid, "a", states.STARTED, request=request_with(FencingToken("account:1", 5)))
    app.backend.store_result(tid, "b", states.SUCCESS, request=request_with(FencingToken("account:2", 50)))
    assert result_of(app, tid) == ("a" if fenced else "b")


def test_exactness_at_the_top_of_the_range(store: Store, unique_name: str) -> None:
    """Tokens 2**53 + 1 and 2**53 differ (a double would call them equal), and so do 2**63 - 1 and 2**63 - 2."""
    app, tid = store.app(), unique_name
    app.backend.store_result(tid, "newer", states.STARTED, request=request_with(FencingToken(tid, 2**53 + 1)))
    app.backend.store_result(tid, "older", states.SUCCESS, request=request_with(FencingToken(tid, 2**53)))
    assert result_of(app, tid) == "newer"
    app.backend.store_result(tid, "top", states.STARTED, request=request_with(FencingToken(tid, 2**63 - 1)))
    app.backend.store_result(tid, "below", states.SUCCESS, request=request_with(FencingToken(tid, 2**63 - 2)))
    assert result_of(app, tid) == "top"


def test_claim_of_another_grantor_raises_and_its_write_is_dropped(
    store: Store, unique_name: str, received: dict[str, list[dict[str, Any]]]
) -> None:
    """Another grantor's claim raises GrantorMismatchError (both ids); its write is dropped; the same grantor's pass."""
    app, tid = store.app(), unique_name
    app.backend.claim_result(tid, FencingToken(tid, 50, "zk-old"))
    with pytest.raises(GrantorMismatchError) as caught:
        app.backend.claim_result(tid, FencingToken(tid, 99, "zk-new"))
    assert (caught.value.token_grantor, caught.value.expected_grantor) == ("zk-new", "zk-old")
    app.backend.store_result(tid, "other", states.SUCCESS, request=request_with(FencingToken(tid, 99, "zk-new")))
    assert state_of(app, tid) == states.PENDING
    assert len(received["dropped"]) == 1 and "grantor" in received["dropped"][0]["reason"]
    app.backend.claim_result(tid, FencingToken(tid, 51, "zk-old"))
    app.backend.store_result(tid, "same", states.SUCCESS, request=request_with(FencingToken(tid, 51, "zk-old")))
    assert result_of(app, tid) == "same"


def test_first_execution_to_seal_wins_whatever_the_tokens(store: Store, unique_name: str) -> None:
    """Exactly once: the older execution seals first; the newer one's seal and any later claim are refused."""
    app, tid = store.app(), unique_name
    older, newer = FencingToken(tid, 7), FencingToken(tid, 9)
    app.backend.claim_result(tid, older)
    app.backend.claim_result(tid, newer)
    older_request, older_execution = sealing(tid, older, with_result=False)
    app.backend.seal_result(tid, older_execution)
    app.backend.seal_result(tid, older_execution)  # sealing again is a no-op for the sealer
    app.backend.store_result(tid, "older", states.SUCCESS, request=older_request)
    _, newer_execution = sealing(tid, newer, with_result=False)
    with pytest.raises(AlreadyAppliedError):
        app.backend.seal_result(tid, newer_execution)
    with pytest.raises(AlreadyAppliedError):
        app.backend.claim_result(tid, FencingToken(tid, 11))
    assert app.AsyncResult(tid).get(timeout=10) == "older"


@pytest.mark.parametrize("once", [True, False], ids=["sealing", "control"])
def test_a_sealing_result_write_is_first_wins_and_reports_the_duplicate(
    store: Store, unique_name: str, once: bool, received: dict[str, list[dict[str, Any]]]
) -> None:
    """Without callbacks the seal rides on the result write: the second writer is a duplicate prevented, not a drop.

    The control, without exactly-once, follows token order: the older result is dropped and the newer stands.
    """
    app, tid = store.app(), unique_name
    older, newer = FencingToken(tid, 7), FencingToken(tid, 9)
    app.backend.claim_result(tid, newer)
    for token, value in ((older, "older"), (newer, "newer")):
        request = sealing(tid, token, with_result=True)[0] if once else request_with(token)
        app.backend.store_result(tid, value, states.SUCCESS, request=request)
    if once:
        assert app.AsyncResult(tid).get(timeout=10) == "older"
        assert [(p["task_id"], p["phase"]) for p in received["duplicate"]] == [(tid, "result")]
        assert received["dropped"] == []
    else:
        assert app.AsyncResult(tid).get(timeout=10) == "newer"
        assert [d["reason"] for d in received["dropped"]] == ["stale token"]


@pytest.mark.parametrize("once", [True, False], ids=["once", "control"])
def test_an_eager_run_of_a_sealed_task_id_returns_the_applied_result(
    store: Store, unique_name: str, once: bool, received: dict[str, list[dict[str, Any]]]
) -> None:
    """apply() with the id of a task that an execution sealed returns that result, and the body does not run again.

    The first apply() stores its result (``task_store_eager_result``), which
    seals the task, as a worker's execution would. The control, exactly once
    off for the task: the body runs again, and its new result comes back.
    """
    app, tid = store.app(), unique_name
    app.conf.update(
        fencing_source=MemoryTokenSource(), fencing_allow_volatile_source=True, task_store_eager_result=True
    )
    runs: list[int] = []

    @app.task(base=FencedTask, shared=False, fencing_once=once)
    def count(n: int) -> str:
        runs.append(n)
        return f"run {len(runs)} of {n}"

    assert count.apply((5,), task_id=tid).get() == "run 1 of 5"
    count.store_eager_result = False  # Celery's default: an eager run stores nothing
    again = count.apply((5,), task_id=tid)
    if once:
        assert (again.state, again.get()) == (states.SUCCESS, "run 1 of 5")
        assert runs == [5]
        assert [(d["task_id"], d["phase"], d["action"]) for d in received["duplicate"]] == [(tid, "claim", "done")]
    else:
        assert (again.state, again.get()) == (states.SUCCESS, "run 2 of 5")
        assert runs == [5, 5]
    assert app.AsyncResult(tid).get(timeout=10) == "run 1 of 5"


def test_forget_removes_the_fence_with_the_result(store: Store, unique_name: str) -> None:
    """AsyncResult.forget() deletes the fence too: a later result for the same id is stored, not dropped."""
    app, tid = store.app(), unique_name
    app.backend.store_result(tid, "first", states.SUCCESS, request=request_with(FencingToken(tid, 9)))
    assert store.has_fence(app, tid)
    app.AsyncResult(tid).forget()
    assert not store.has_fence(app, tid)
    assert state_of(app, tid) == states.PENDING
    app.backend.store_result(tid, "again", states.SUCCESS, request=request_with(None))
    assert app.AsyncResult(tid).get(timeout=10) == "again"
