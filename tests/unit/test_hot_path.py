"""The shortcuts a fenced task's per-execution path takes, each pinned to the slow answer it replaces."""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest

from celery_fencing import FencingToken, current_token
from celery_fencing.celery.runtime import task_option
from celery_fencing.context import Execution, new_execution_id, token_context
from celery_fencing.protocols import FlooredStore, conforms


class Floored:
    def ensure_armed(self, resource: str, source: Any) -> None: ...


class Plain:
    pass


class Forwarding:
    """A wrapper that forwards unknown attributes, as MeteredGate does."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_conforms_answers_as_isinstance_does_and_asks_wrappers_each_time() -> None:
    """A type with the members conforms, one without does not; a forwarding wrapper conforms as its inner object."""
    for _ in range(2):  # the second round answers from what the first remembered
        assert conforms(Floored(), FlooredStore) is isinstance(Floored(), FlooredStore) is True
        assert conforms(Plain(), FlooredStore) is isinstance(Plain(), FlooredStore) is False
        assert conforms(Forwarding(Floored()), FlooredStore) is True
        assert conforms(Forwarding(Plain()), FlooredStore) is False


def test_execution_ids_are_unique_and_new_in_a_forked_child() -> None:
    """Ids are 32 hex digits, never repeat in a process, and a forked child draws a new random prefix."""
    ids = {new_execution_id() for _ in range(10_000)}
    assert len(ids) == 10_000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert Execution(FencingToken("r", 1)).execution_id != Execution(FencingToken("r", 1)).execution_id
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, new_execution_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    assert child[:16] != new_execution_id()[:16], "the child must not continue the parent's sequence"


class Base:
    inherited = "from the base"
    helper = staticmethod(lambda: "static")


class Task(Base):
    own = "class attribute"

    def make_gates(self) -> list[str]:
        return []


@pytest.mark.parametrize("name", ["own", "inherited", "helper", "make_gates", "missing", "from_instance"])
def test_task_option_reads_what_getattr_static_reads(name: str) -> None:
    """task_option returns what inspect.getattr_static does (unbound), for every kind of attribute."""
    task = Task()
    task.from_instance = "on the instance"  # type: ignore[attr-defined]
    expected = inspect.getattr_static(task, name, None)
    if isinstance(expected, staticmethod):
        expected = expected.__get__(None, Task)
    assert task_option(task, name) == expected


def test_token_context_nests_and_restores_on_errors() -> None:
    """The context manager makes its token current, restores the outer one on exit, also when the block raises."""
    outer, inner = FencingToken("r", 1), FencingToken("r", 2)
    with token_context(outer):
        with pytest.raises(ValueError), token_context(inner):
            assert current_token() is inner
            raise ValueError("inside")
        assert current_token() is outer
    assert current_token() is None
