"""An in-process gate over a dict: the reference semantics, for unit tests.

It implements exactly what the Redis and SQL gates implement, with a lock
standing in for the storage's atomicity, so code that uses gates can be tested
without a server. It shares nothing across processes.

Exactly once: inside a fenced execution with ``once``, every write records
its task id on the resource; another execution of the same task id is then
refused with :class:`~celery_fencing.AlreadyAppliedError` until the record
expires (on ``time.monotonic``).

Grantors: each mark remembers the grantor of the tokens that set it; a token
of another grantor raises :class:`~celery_fencing.GrantorMismatchError` and
changes nothing. A mark without a grantor adopts the first one that passes it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..context import AppliedRecord, applied_record, resolve_token
from ..exceptions import AlreadyAppliedError, InvalidArgumentError, ResourceMismatchError, StaleTokenError
from ..protocols import TokenVerifier
from ..token import FencingToken, Mark, check_grantor, validate_resource

__all__ = ["MemoryGate"]


class MemoryGate:
    """A gate whose data, marks and key owners live in this process's memory. Thread-safe.

    :param verifier: checks every token's origin before it is used (signed
        mode, plausibility bound); see :mod:`celery_fencing.signing`.
    """

    def __init__(self, *, verifier: TokenVerifier | None = None) -> None:
        self.verifier = verifier
        self._lock = threading.Lock()
        self._marks: dict[str, int] = {}
        self._grantors: dict[str, str] = {}
        self._owners: dict[str, str] = {}
        self._data: dict[str, Any] = {}
        # (resource, task id) -> (execution id, expiry on time.monotonic(), token value)
        self._applied: dict[tuple[str, str], tuple[str, float, int]] = {}

    def _advance(self, token: FencingToken, key: str | None, record: AppliedRecord | None = None) -> None:
        # Caller holds the lock: check owner, grantor, applied record and mark, then raise the mark.
        if key is not None:
            owner = self._owners.get(key)
            if owner is not None and owner != token.resource:
                raise ResourceMismatchError(
                    f"key {key!r} belongs to resource {owner!r}, not {token.resource!r}",
                    token_resource=token.resource,
                    expected_resource=owner,
                )
        check_grantor(token, self._grantors.get(token.resource))
        mark = self._marks.get(token.resource)
        now = time.monotonic()
        if record is not None:
            applied = self._applied.get((token.resource, record.task_id))
            if applied is not None and applied[1] > now and applied[0] != record.execution_id:
                raise AlreadyAppliedError(
                    resource=token.resource,
                    task_id=record.task_id,
                    superseded=applied[2] > token.value,
                    applied_token=applied[2],
                )
        if mark is not None and token.value < mark:
            raise StaleTokenError(resource=token.resource, token=token.value, high_water=mark)
        if record is not None:
            self._applied[(token.resource, record.task_id)] = (record.execution_id, now + record.retention, token.value)
            self._expire_records(now)
        self._marks[token.resource] = token.value
        if token.grantor is not None:
            self._grantors[token.resource] = token.grantor
        if key is not None:
            self._owners[key] = token.resource

    def _expire_records(self, now: float) -> None:
        # Bounded work per write: drop expired records once they outnumber the live ones' last count.
        if len(self._applied) >= self._sweep_at:
            self._applied = {k: v for k, v in self._applied.items() if v[1] > now}
            self._sweep_at = max(1024, 2 * len(self._applied))

    _sweep_at = 1024

    def applied(self, resource: str, task_id: str) -> str | None:
        """The execution id recorded for *task_id* on *resource*, or ``None`` (never applied, or expired)."""
        with self._lock:
            entry = self._applied.get((resource, task_id))
            return entry[0] if entry is not None and entry[1] > time.monotonic() else None

    def _checked(self, token: FencingToken | None) -> FencingToken:
        return resolve_token(token, verifier=self.verifier)

    def claim(self, token: FencingToken | None = None) -> None:
        checked = self._checked(token)
        with self._lock:
            self._advance(checked, None)

    def high_water(self, resource: str) -> int | None:
        validate_resource(resource)
        with self._lock:
            return self._marks.get(resource)

    def mark(self, resource: str) -> Mark | None:
        """Return the resource's mark with its grantor, or ``None`` if it was never claimed or written."""
        validate_resource(resource)
        with self._lock:
            value = self._marks.get(resource)
            return None if value is None else Mark(resource, value, self._grantors.get(resource))

    def reset_mark(self, token: FencingToken, *, expected: Mark | None) -> None:
        """Operator repair: set the mark to *token* (value and grantor), lower or not, if it is still *expected*.

        For ``celery-fencing rebase`` and ``repair`` only: it bypasses the
        ordering. The token is not verified (the operator's command mints it).

        :raises StaleTokenError: the mark is no longer *expected* (nothing changed).
        """
        checked = resolve_token(token)
        with self._lock:
            value = self._marks.get(checked.resource)
            current = None if value is None else Mark(checked.resource, value, self._grantors.get(checked.resource))
            if current != expected:
                raise StaleTokenError(
                    f"the mark of {checked.resource!r} changed since it was read ({expected} -> {current}); "
                    "nothing was reset",
                    resource=checked.resource,
                    token=checked.value,
                    high_water=value,
                )
            self._marks[checked.resource] = checked.value
            if checked.grantor is None:
                self._grantors.pop(checked.resource, None)
            else:
                self._grantors[checked.resource] = checked.grantor

    def set(self, token: FencingToken | None, key: str, value: Any) -> None:
        """Store *value* at *key* if the token is not stale; bind *key* to the token's resource."""
        checked = self._checked(token)
        _check_key(key)
        with self._lock:
            self._advance(checked, key, applied_record(checked))
            self._data[key] = value

    def delete(self, token: FencingToken | None, key: str) -> None:
        """Remove *key* if the token is not stale. The key stays bound to its resource."""
        checked = self._checked(token)
        _check_key(key)
        with self._lock:
            self._advance(checked, key, applied_record(checked))
            self._data.pop(key, None)

    def get(self, key: str) -> Any:
        """Read *key* (reads are not gated: claim first to fence a read-modify-write)."""
        with self._lock:
            return self._data.get(key)


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"key must be a non-empty str, not {key!r:.60}")
