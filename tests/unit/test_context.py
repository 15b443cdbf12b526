"""The current-token context variable and resolve_token(), which every gate calls first."""

from __future__ import annotations

import contextvars
import threading

import pytest

from celery_fencing import FencingToken, InvalidTokenError, ResourceMismatchError, current_token, resolve_token
from celery_fencing.context import token_context
from tests.unit import param_id


def test_no_token_outside_a_context() -> None:
    """Outside a fenced execution there is no current token, and resolving fails loudly."""
    assert current_token() is None
    with pytest.raises(InvalidTokenError, match="no fencing token"):
        resolve_token(None)


def test_context_sets_and_restores() -> None:
    """token_context() makes the token current inside the block only."""
    token = FencingToken("r", 5)
    with token_context(token):
        assert current_token() == token
        assert resolve_token() == token
    assert current_token() is None


def test_token_crosses_into_copied_context_threads() -> None:
    """A thread started with copy_context().run sees the task's token."""
    token = FencingToken("r", 6)
    seen: list[FencingToken | None] = []
    with token_context(token):
        ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(lambda: seen.append(current_token()),))
    thread.start()
    thread.join()
    assert seen == [token]


@pytest.mark.parametrize("bad", [5, "1:5:r", 5.0, object()], ids=param_id)
def test_resolve_refuses_non_tokens(bad: object) -> None:
    """A bare number carries no resource: gates refuse it before any I/O."""
    with pytest.raises(InvalidTokenError):
        resolve_token(bad)


def test_resolve_checks_resource() -> None:
    """A token for resource A presented for resource B is refused."""
    with pytest.raises(ResourceMismatchError):
        resolve_token(FencingToken("a", 1), resource="b")
    assert resolve_token(FencingToken("a", 1), resource="a").value == 1


def test_resolve_revalidates_a_tampered_token() -> None:
    """A token mutated behind the frozen dataclass's back is refused, not trusted."""
    token = FencingToken("r", 5)
    object.__setattr__(token, "value", 2**70)
    with pytest.raises(InvalidTokenError):
        resolve_token(token)
