"""An in-process gate over a dict: the reference semantics, for unit tests.

It implements exactly what the Redis and SQL gates implement, with a lock
standing in for the storage's atomicity, so code that uses gates can be tested
without a server. It shares nothing across processes.
"""

from __future__ import annotations

import threading
from typing import Any

from ..context import resolve_token
from ..exceptions import InvalidTokenError, ResourceMismatchError, StaleTokenError
from ..token import FencingToken, validate_resource

__all__ = ["MemoryGate"]


class MemoryGate:
    """A gate whose data, marks and key owners live in this process's memory. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[str, int] = {}
        self._owners: dict[str, str] = {}
        self._data: dict[str, Any] = {}

    def _advance(self, token: FencingToken, key: str | None) -> None:
        # Caller holds the lock: check owner and mark, then raise the mark.
        if key is not None:
            owner = self._owners.get(key)
            if owner is not None and owner != token.resource:
                raise ResourceMismatchError(
                    f"key {key!r} belongs to resource {owner!r}, not {token.resource!r}",
                    token_resource=token.resource,
                    expected_resource=owner,
                )
        mark = self._marks.get(token.resource)
        if mark is not None and token.value < mark:
            raise StaleTokenError(resource=token.resource, token=token.value, high_water=mark)
        self._marks[token.resource] = token.value
        if key is not None:
            self._owners[key] = token.resource

    def claim(self, token: FencingToken | None = None) -> None:
        checked = resolve_token(token)
        with self._lock:
            self._advance(checked, None)

    def high_water(self, resource: str) -> int | None:
        validate_resource(resource)
        with self._lock:
            return self._marks.get(resource)

    def set(self, token: FencingToken | None, key: str, value: Any) -> None:
        """Store *value* at *key* if the token is not stale; bind *key* to the token's resource."""
        checked = resolve_token(token)
        _check_key(key)
        with self._lock:
            self._advance(checked, key)
            self._data[key] = value

    def delete(self, token: FencingToken | None, key: str) -> None:
        """Remove *key* if the token is not stale. The key stays bound to its resource."""
        checked = resolve_token(token)
        _check_key(key)
        with self._lock:
            self._advance(checked, key)
            self._data.pop(key, None)

    def get(self, key: str) -> Any:
        """Read *key* (reads are not gated: claim first to fence a read-modify-write)."""
        with self._lock:
            return self._data.get(key)


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidTokenError(f"key must be a non-empty str, not {key!r:.60}")
