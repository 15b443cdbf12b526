"""MeteredGate: any gate, with its claims and writes counted by outcome for the enabled backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from ..exceptions import (
    AlreadyAppliedError,
    GateUnavailableError,
    LeaseLostError,
    ResourceMismatchError,
    StaleTokenError,
)
from ..token import FencingToken
from .observers import current_task_name, each, enabled

__all__ = ["WRITE_METHODS", "MeteredGate"]

#: Gate methods :class:`MeteredGate` counts as writes (when the wrapped gate has them).
WRITE_METHODS = frozenset({"set", "hset", "delete", "eval", "guard", "fenced_update", "transaction"})


class MeteredGate:
    """A gate that counts its claims and writes, and otherwise behaves exactly as the gate it wraps.

    ``claim`` and the wrapped gate's write methods (:data:`WRITE_METHODS`:
    ``set``, ``hset``, ``delete``, ``eval``, ``guard``, ``fenced_update``,
    ``transaction``) are counted by outcome: ``accepted``, ``rejected``
    (:class:`StaleTokenError`, :class:`ResourceMismatchError`, a lost lease) or
    ``unavailable``; bad input (:class:`InvalidTokenError`) is not counted.
    Everything else is passed through. Exceptions propagate unchanged. With no
    metrics enabled the cost is one dictionary lookup per operation.

    :param gate: any gate.
    :param name: the ``gate`` label (default: the gate's class name).
    """

    def __init__(self, gate: Any, *, name: str | None = None) -> None:
        self.gate = gate
        self.name = name or type(gate).__name__

    def claim(self, token: FencingToken | None = None) -> None:
        """The wrapped gate's ``claim``, counted."""
        with self._observe("claim", (token,), {}):
            self.gate.claim(token)

    def high_water(self, resource: str) -> int | None:
        """The wrapped gate's ``high_water`` (not counted: a read)."""
        value: int | None = self.gate.high_water(resource)
        return value

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.gate, name)
        if name not in WRITE_METHODS or not callable(attribute):
            return attribute
        if name == "transaction":
            return lambda *args, **kwargs: _MeteredTransaction(self, attribute, args, kwargs)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._observe(name, args, kwargs):
                return attribute(*args, **kwargs)

        return counted

    @contextmanager
    def _observe(self, operation: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
        if not enabled:
            yield
            return
        try:
            yield
        except BaseException as exc:
            self._count_error(operation, exc, args, kwargs)
            raise
        self._record(operation, "accepted", _token_resource(args, kwargs))

    def _count_error(self, operation: str, exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not enabled:
            return
        if isinstance(exc, (StaleTokenError, LeaseLostError, ResourceMismatchError)):
            resource = getattr(exc, "resource", None) or _token_resource(args, kwargs)
            self._record(operation, "rejected", resource)
        elif isinstance(exc, AlreadyAppliedError):
            self._record(operation, "already_applied", exc.resource or _token_resource(args, kwargs))
        elif isinstance(exc, GateUnavailableError):
            self._record(operation, "unavailable", _token_resource(args, kwargs))
        # Bad input, and the caller's own errors, are not the gate's verdict: not counted.

    def _record(self, operation: str, outcome: str, resource: str) -> None:
        task = current_task_name()
        each(lambda o: o.gate(task, self.name, operation, outcome, resource))

    def __repr__(self) -> str:
        return f"MeteredGate({self.gate!r})"


class _MeteredTransaction(AbstractContextManager[Any]):
    """``gate.transaction(token)`` counted: rejected on entering, accepted once the block commits."""

    def __init__(self, owner: MeteredGate, method: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> None:
        self._owner = owner
        self._args = args
        self._kwargs = kwargs
        # Bad tokens are refused here, by the gate itself, before any I/O.
        self._inner = method(*args, **kwargs)

    def __enter__(self) -> Any:
        try:
            return self._inner.__enter__()
        except BaseException as exc:
            self._owner._count_error("transaction", exc, self._args, self._kwargs)
            raise

    def __exit__(self, *exc_info: Any) -> bool | None:
        try:
            result = self._inner.__exit__(*exc_info)
        except BaseException as error:
            if error is not exc_info[1]:
                # Raised by the gate at COMMIT, not the block's own error passing through.
                self._owner._count_error("transaction", error, self._args, self._kwargs)
            raise
        if exc_info[0] is None and enabled:
            self._owner._record("transaction", "accepted", _token_resource(self._args, self._kwargs))
        return bool(result)


def _token_resource(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, FencingToken):
            return value.resource
    from ..context import current_token

    token = current_token()
    return token.resource if token is not None else ""
