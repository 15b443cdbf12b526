"""The fenced+redis result backend keeps the grantor with a result's mark: another grantor's claim raises,
its result write is dropped (never raised), against the real Redis."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, states
from celery.app.task import Context

from celery_fencing import FencingToken, GrantorMismatchError
from celery_fencing.celery import signals


def _request(token: FencingToken) -> Context:
    request = Context(id="t", task="x", args=(), kwargs={})
    request.fencing_token = token
    return request


def test_claim_of_another_grantor_raises_with_both_ids(app: Celery) -> None:
    """claim_result with a token of another grantor raises GrantorMismatchError; the same grantor's passes."""
    app.backend.claim_result("tid", FencingToken("tid", 50, "zk-old"))
    with pytest.raises(GrantorMismatchError) as caught:
        app.backend.claim_result("tid", FencingToken("tid", 99, "zk-new"))
    assert (caught.value.token_grantor, caught.value.expected_grantor) == ("zk-new", "zk-old")
    app.backend.claim_result("tid", FencingToken("tid", 51, "zk-old"))  # negative control


def test_result_write_of_another_grantor_is_dropped_not_raised(app: Celery) -> None:
    """A result written with another grantor's higher token is dropped and signalled; the stored result stays."""
    dropped: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        dropped.append(kwargs)

    signals.result_dropped.connect(receiver, weak=False)
    try:
        app.backend.store_result("tid", "first", states.SUCCESS, request=_request(FencingToken("tid", 5, "zk-old")))
        app.backend.store_result("tid", "other", states.SUCCESS, request=_request(FencingToken("tid", 9, "zk-new")))
        app.backend.store_result("tid", "same", states.SUCCESS, request=_request(FencingToken("tid", 6, "zk-old")))
    finally:
        signals.result_dropped.disconnect(receiver)
    assert app.AsyncResult("tid").get(timeout=5) == "same"
    assert len(dropped) == 1 and "grantor" in dropped[0]["reason"]
