"""The token of the execution in progress, carried in a context variable.

The Celery layer sets it when a fenced task starts, so gates called without an
explicit token pick it up anywhere in the task's call stack, and in threads
started through ``contextvars.copy_context()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from .exceptions import InvalidTokenError, LeaseLostError, ResourceMismatchError
from .protocols import TokenVerifier
from .token import FencingToken, validate_resource

__all__ = ["Execution", "current_execution", "current_token", "resolve_token", "token_context"]


@dataclass
class Execution:
    """One fenced execution in progress: its token, and whether its grantor session was lost.

    ``session_lost`` is set (from the token source's connection listener) when
    the ZooKeeper session behind the token was suspended or lost. With
    ``abort_on_session_loss``, the execution's next gate call raises
    :class:`~celery_fencing.LeaseLostError` instead of writing. Safety never
    depends on this flag: gates refuse stale tokens regardless.
    """

    token: FencingToken
    task_id: str | None = None
    abort_on_session_loss: bool = False
    session_lost: threading.Event = field(default_factory=threading.Event)


_current: ContextVar[Execution | None] = ContextVar("celery_fencing_current_execution", default=None)


def current_execution() -> Execution | None:
    """Return the fenced execution in progress in this context, or ``None``."""
    return _current.get()


def current_token() -> FencingToken | None:
    """Return the token of the fenced execution in progress, or ``None``."""
    execution = _current.get()
    return None if execution is None else execution.token


@contextmanager
def token_context(token: FencingToken | Execution | None) -> Iterator[Execution | None]:
    """Make *token* (or a whole :class:`Execution`) current inside the ``with`` block."""
    if token is None or isinstance(token, Execution):
        execution = token
    elif isinstance(token, FencingToken):
        execution = Execution(token)
    else:
        raise InvalidTokenError(f"expected a FencingToken, not {type(token).__name__}")
    reset = _current.set(execution)
    try:
        yield execution
    finally:
        _current.reset(reset)


def resolve_token(
    token: object = None, *, resource: str | None = None, verifier: TokenVerifier | None = None
) -> FencingToken:
    """Return the token a gate operation must use, validated (and verified, given a *verifier*).

    *token* is the caller's explicit token; ``None`` means the current one.
    When *resource* is given, the token must have been minted for it. A gate
    built with ``verifier=`` passes it here, so its origin check runs on every
    token too.

    Gates call this before any I/O, so bad input changes nothing.

    :raises InvalidTokenError: no token at all, or not a :class:`FencingToken`,
        or (``ForgedTokenError``, ``GrantorMismatchError``) one the verifier refuses.
    :raises ResourceMismatchError: the token belongs to another resource.
    """
    execution = _current.get()
    if token is None:
        if execution is None:
            raise InvalidTokenError("no fencing token given, and no fenced task is running in this context")
        token = execution.token
    lost = execution is not None and execution.abort_on_session_loss and execution.session_lost.is_set()
    if lost and execution is not None and token == execution.token:
        raise LeaseLostError(
            f"the grantor session behind token {execution.token.value} of {execution.token.resource!r} "
            "was lost; this execution stops at its next gate call (fencing_abort_on_session_loss)",
            resource=execution.token.resource,
        )
    if not isinstance(token, FencingToken):
        raise InvalidTokenError(
            f"expected a FencingToken, not {type(token).__name__}: {token!r:.60}; "
            "a bare number carries no resource and cannot be checked"
        )
    # Re-validate: a frozen dataclass can still be mutated with object.__setattr__.
    checked = FencingToken(token.resource, token.value, token.grantor, token.signature)
    if resource is not None and validate_resource(resource) != checked.resource:
        raise ResourceMismatchError(
            f"token for resource {checked.resource!r} presented for resource {resource!r}",
            token_resource=checked.resource,
            expected_resource=resource,
        )
    if verifier is not None:
        verifier.verify(checked)
    return checked
