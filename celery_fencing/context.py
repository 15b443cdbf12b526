"""The token of the execution in progress, carried in a context variable.

The Celery layer sets it when a fenced task starts, so gates called without an
explicit token pick it up anywhere in the task's call stack, and in threads
started through ``contextvars.copy_context()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .exceptions import InvalidTokenError, ResourceMismatchError
from .token import FencingToken, validate_resource

__all__ = ["current_token", "resolve_token", "token_context"]

_current: ContextVar[FencingToken | None] = ContextVar("celery_fencing_current_token", default=None)


def current_token() -> FencingToken | None:
    """Return the token of the fenced execution in progress, or ``None``."""
    return _current.get()


@contextmanager
def token_context(token: FencingToken | None) -> Iterator[FencingToken | None]:
    """Make *token* the current token inside the ``with`` block."""
    if token is not None and not isinstance(token, FencingToken):
        raise InvalidTokenError(f"expected a FencingToken, not {type(token).__name__}")
    reset = _current.set(token)
    try:
        yield token
    finally:
        _current.reset(reset)


def resolve_token(token: object = None, *, resource: str | None = None) -> FencingToken:
    """Return the token a gate operation must use, validated.

    *token* is the caller's explicit token; ``None`` means the current one.
    When *resource* is given, the token must have been minted for it.

    Gates call this before any I/O, so bad input changes nothing.

    :raises InvalidTokenError: no token at all, or not a :class:`FencingToken`.
    :raises ResourceMismatchError: the token belongs to another resource.
    """
    if token is None:
        token = _current.get()
        if token is None:
            raise InvalidTokenError("no fencing token given, and no fenced task is running in this context")
    if not isinstance(token, FencingToken):
        raise InvalidTokenError(
            f"expected a FencingToken, not {type(token).__name__}: {token!r:.60}; "
            "a bare number carries no resource and cannot be checked"
        )
    # Re-validate: a frozen dataclass can still be mutated with object.__setattr__.
    checked = FencingToken(token.resource, token.value)
    if resource is not None and validate_resource(resource) != checked.resource:
        raise ResourceMismatchError(
            f"token for resource {checked.resource!r} presented for resource {resource!r}",
            token_resource=checked.resource,
            expected_resource=resource,
        )
    return checked
