"""FencedTask as a drop-in base for tasks written for plain Celery (issue 19).

Each test reproduces a test of Celery's own integration suite
(``scripts/celery-integration``) that failed with every task a FencedTask
(``Celery(task_cls="celery_fencing.celery:FencedTask")``), in the kind of
worker that suite runs: Celery's embedded test worker
(``celery.contrib.testing.worker.start_worker``, behind the pytest fixtures
``celery_worker`` and ``celery_session_worker``), in this process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, Task
from celery.app import trace
from celery.contrib.testing.worker import start_worker

from celery_fencing.celery import FencedTask

from .conftest import embedded_app


class CeleryPushRequest(FencedTask):  # type: ignore[misc]
    """FencedTask with Celery's own ``push_request``: the negative control of the retry test."""

    push_request = Task.push_request


@pytest.fixture
def app(redis_url: str, tmp_path: Path, unique_name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """An app whose every task is a FencedTask, in a process without the ``celery worker`` optimizations.

    ``celery worker`` replaces ``Task.__call__`` so that the body runs on the
    tracer's request; the embedded worker does not, and ``Task.__call__``
    pushes a copy of the request for the body. A test in this process that
    started a ``celery worker`` in it would have installed the replacement:
    undo it for the test.
    """
    original_call = trace._patched.get("BaseTask.__call__")
    if original_call is not None:
        monkeypatch.setattr(Task, "__call__", original_call)
        monkeypatch.setattr(Task, "_stackprotected", False, raising=False)
    with embedded_app(
        "drop-in-test", redis_url, tmp_path, unique_name, task_cls="celery_fencing.celery:FencedTask"
    ) as app:
        yield app


def _retry_once(task: Task) -> dict[str, Any]:
    """Retry once from the body, then report what the retry's request carries."""
    request = task.request
    if not request.retries:
        raise task.retry(countdown=0)
    return {
        "retries": request.retries,
        "token": request.fencing_token.value,
        "headers": sorted(request.headers or {}),
        "x_trace": request.get("x_trace"),
    }


@pytest.mark.parametrize("headers", [{}, {"x_trace": "abc"}], ids=["no-custom-headers", "custom-headers"])
def test_a_body_that_calls_retry_is_retried_with_its_headers(app: Celery, headers: dict[str, str]) -> None:
    """``self.retry()`` in the body sends the retry with the message's own headers and none of the fencing ones.

    Celery's test_tasks.py::test_tasks::test_task_retried_once and its other
    retry tests failed with ``FencingToken is not JSON serializable``: a
    message with no custom headers of its own.
    """

    @app.task(bind=True, max_retries=1, shared=False)
    def retry_once(self: Task) -> dict[str, Any]:
        return _retry_once(self)

    assert isinstance(retry_once, FencedTask)
    with start_worker(app, pool="solo", perform_ping_check=False):
        result = retry_once.apply_async(headers=headers)
        seen = result.get(timeout=30)
    assert seen["retries"] == 1
    assert seen["headers"] == sorted(headers)
    assert seen["x_trace"] == headers.get("x_trace")
    assert seen["token"] > 0
    assert result.state == "SUCCESS"


def test_celerys_push_request_sends_the_fencing_attributes_as_headers(app: Celery) -> None:
    """Negative control: with Celery's own ``push_request`` the retry carries the token as a header, and fails."""

    @app.task(bind=True, base=CeleryPushRequest, max_retries=1, shared=False)
    def retry_once(self: Task) -> dict[str, Any]:
        return _retry_once(self)

    with start_worker(app, pool="solo", perform_ping_check=False):
        result = retry_once.delay()
        with pytest.raises(Exception, match="FencingToken is not JSON serializable"):
            result.get(timeout=30)
