"""The exceptions raised by celery-fencing.

Every exception derives from :class:`FencingError`, so callers can catch the
whole family with one ``except`` clause::

    FencingError
     +-- InvalidTokenError            a token or resource that breaks the rules
     |    +-- ResourceMismatchError   a token presented for another resource's data
     |    +-- GrantorMismatchError    a token from another grantor than the one the mark belongs to
     |    +-- ForgedTokenError        a token whose origin a gate could not verify (signature, bound)
     +-- InvalidArgumentError         a gate argument besides the token (key, value, expiry, ...);
     |                                also a TypeError and a ValueError
     +-- StaleTokenError              a gate refused a token below its high-water mark
     |    +-- StaleETagError          a conditional HTTP write got 412: the resource changed since it was read
     +-- AlreadyAppliedError          another execution of the same task id already applied this effect
     +-- TokenUnavailableError        the grantor could not mint a token in time
     +-- LeaseLostError               an exclusive lease ended while it was held
     +-- GateUnavailableError         the storage behind a gate could not be reached
     +-- EffectPendingError           an idempotency key is claimed but its outcome not recorded
     +-- FencingConfigurationError    a bad URL, setting or option

Every field is keyword-only with a default and the message is the only
positional argument, so the exceptions survive ``pickle`` and Celery's JSON
exception serialisation (which rebuilds an exception as ``cls(*args)``).
"""

from __future__ import annotations

__all__ = [
    "AlreadyAppliedError",
    "EffectPendingError",
    "FencingConfigurationError",
    "FencingError",
    "ForgedTokenError",
    "GateUnavailableError",
    "GrantorMismatchError",
    "InvalidArgumentError",
    "InvalidTokenError",
    "LeaseLostError",
    "ResourceMismatchError",
    "StaleETagError",
    "StaleTokenError",
    "TokenUnavailableError",
]


class FencingError(Exception):
    """Root of every exception this library raises."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidTokenError(FencingError):
    """A token, token value or resource name that breaks the rules.

    Nothing has changed when it is raised: it is raised before any I/O, or,
    for the mismatch subclasses, by the storage's own check, before any write.
    """


class ResourceMismatchError(InvalidTokenError):
    """A token minted for one resource was presented for another resource's data.

    Tokens are only ordered within one resource: ZooKeeper zxids are global,
    so a token for resource A may well be larger than resource B's mark.
    """

    def __init__(
        self,
        message: str = "",
        *,
        token_resource: str | None = None,
        expected_resource: str | None = None,
    ) -> None:
        super().__init__(message)
        self.token_resource = token_resource
        self.expected_resource = expected_resource


class InvalidArgumentError(FencingError, TypeError, ValueError):
    """A gate argument besides the token breaks the rules: a data key, value, expiry, mapping, Lua body or connection.

    Raised before any I/O, so nothing has changed. It is also a ``TypeError``
    and a ``ValueError``, which is what these arguments raised before, so
    code that caught those keeps working. It is not an
    :class:`InvalidTokenError`: ``except InvalidTokenError`` is about tokens,
    and must not swallow a bad Redis key.
    """


class GrantorMismatchError(InvalidTokenError):
    """A token minted by one grantor was presented where another grantor's tokens are the mark.

    Tokens are ordered only within one grantor: a ZooKeeper ensemble whose
    data directory was wiped (or another ensemble, or a deleted SQLite file)
    counts again from the start, below the marks already stored, so its
    tokens would be refused forever, or let stale writers in where marks were
    lost too. Nothing was written. It is not a :class:`StaleTokenError` on
    purpose: a stale-token policy would mint again from the same grantor and
    loop, or drop the task; this one needs an operator, and the way back is
    ``celery-fencing rebase`` (see the security page of the docs).
    """

    def __init__(
        self,
        message: str = "",
        *,
        resource: str | None = None,
        token_grantor: str | None = None,
        expected_grantor: str | None = None,
    ) -> None:
        if not message:
            message = (
                f"token for resource {resource!r} was minted by grantor {token_grantor!r}, but the mark there "
                f"belongs to grantor {expected_grantor!r}: the grantor was replaced or reset (a wiped ZooKeeper?), "
                "or this is the wrong grantor; after checking, move the resource with `celery-fencing rebase`"
            )
        super().__init__(message)
        self.resource = resource
        self.token_grantor = token_grantor
        self.expected_grantor = expected_grantor


class ForgedTokenError(InvalidTokenError):
    """A gate in a verification mode could not verify where a token came from.

    Raised before any write, for a token without a signature, with an unknown
    key id or a signature that does not match (signed mode), or with a value
    above anything its grantor can have issued yet (the plausibility bound).
    Nothing was written. ``reason`` says which check failed.
    """

    def __init__(
        self,
        message: str = "",
        *,
        resource: str | None = None,
        token: int | None = None,
        grantor: str | None = None,
        reason: str | None = None,
    ) -> None:
        if not message:
            message = f"token {token} for resource {resource!r} (grantor {grantor!r}) refused: {reason}"
        super().__init__(message)
        self.resource = resource
        self.token = token
        self.grantor = grantor
        self.reason = reason


class StaleTokenError(FencingError):
    """A gate refused a token lower than the resource's high-water mark.

    Nothing was written. The execution holding the token is stale: a newer
    execution has claimed or written the resource since this token was minted.
    """

    def __init__(
        self,
        message: str = "",
        *,
        resource: str | None = None,
        token: int | None = None,
        high_water: int | None = None,
    ) -> None:
        if not message:
            message = f"stale fencing token {token} for resource {resource!r}: high-water mark is {high_water}"
        super().__init__(message)
        self.resource = resource
        self.token = token
        self.high_water = high_water


class BelowFloorError(StaleTokenError):
    """A store refused a token minted before the store's floor: the store had lost its marks since.

    Nothing was written. A store that found itself without its floor (a Redis
    restarted without persistence, a flush) was re-armed with a token minted
    afterwards, and refuses every lower token: it cannot tell which of them a
    newer execution overtook. This is not news of a newer execution: a fenced
    task mints a fresh token and runs again. ``high_water`` is the floor.
    """

    def __init__(
        self, message: str = "", *, resource: str | None = None, token: int | None = None, floor: int | None = None
    ) -> None:
        if not message:
            message = (
                f"fencing token {token} for resource {resource!r} is below the store's floor {floor}: "
                "the store was armed (new, or it had lost its marks) after this token was minted"
            )
        super().__init__(message, resource=resource, token=token, high_water=floor)


class StaleETagError(StaleTokenError):
    """A conditional HTTP write (``If-Match``) was refused with ``412 Precondition Failed``.

    The resource changed since this execution read it (its ETag moved on):
    another writer got there first, and nothing was written. It is a
    :class:`StaleTokenError`, so a fenced task's on-stale policy handles it
    (retry re-reads and redoes). ``resource`` and ``token`` are those of the
    execution's fencing token when there is one; ``high_water`` stays ``None``
    (the sink compares versions, not tokens).
    """

    def __init__(
        self,
        message: str = "",
        *,
        url: str | None = None,
        etag: str | None = None,
        current_etag: str | None = None,
        resource: str | None = None,
        token: int | None = None,
    ) -> None:
        if not message:
            now = f", it is now {current_etag}" if current_etag else ""
            message = f"conditional write to {url} refused (412): If-Match {etag} no longer matches{now}"
        super().__init__(message, resource=resource, token=token)
        self.url = url
        self.etag = etag
        self.current_etag = current_etag


class AlreadyAppliedError(FencingError):
    """Another execution of the same task id already applied its effect on this resource at this store.

    Nothing was written: the gate found the record "task id T applied on
    resource R by execution E" that the first execution wrote in the same
    atomic operation as its effect. It is not a :class:`StaleTokenError` on
    purpose: a stale-token policy would redo the task, which is the double
    apply this error prevents. A fenced task that meets it ends as done
    (see the exactly-once section of the Celery docs).

    ``superseded`` is true when the execution that applied is a newer one of
    the same task (its token, ``applied_token``, is above this execution's):
    it finishes the task. When false, the one that applied is older: this
    execution is the newest of the task, and the older one is gone (it
    failed, was retried, or died before finishing) or about to finish. The
    resource's mark is no guide here: on a resource shared by many tasks it
    may belong to another task. ``applied_token`` is ``None`` where the store
    records no token (the result backend's seal); ``high_water`` is the
    resource's mark where the store read it.
    """

    def __init__(
        self,
        message: str = "",
        *,
        resource: str | None = None,
        task_id: str | None = None,
        superseded: bool = False,
        applied_token: int | None = None,
        high_water: int | None = None,
    ) -> None:
        if not message:
            message = f"task {task_id} was already applied on resource {resource!r} by another execution"
        super().__init__(message)
        self.resource = resource
        self.task_id = task_id
        self.superseded = superseded
        self.applied_token = applied_token
        self.high_water = high_water


class TokenUnavailableError(FencingError):
    """The token source could not mint a token (grantor down, timeout, session lost)."""

    def __init__(self, message: str = "", *, resource: str | None = None) -> None:
        super().__init__(message)
        self.resource = resource


class LeaseLostError(FencingError):
    """An exclusive lease ended (session lost, lock node gone) while it was held."""

    def __init__(self, message: str = "", *, resource: str | None = None) -> None:
        super().__init__(message)
        self.resource = resource


class GateUnavailableError(FencingError):
    """The storage behind a gate could not be reached or failed mid-operation.

    The driver's exception is chained as ``__cause__``. Whether the write
    happened is unknown only where the storage itself cannot tell (a lost reply).
    """

    def __init__(self, message: str = "", *, gate: str | None = None) -> None:
        super().__init__(message)
        self.gate = gate


class StoreUnarmedError(GateUnavailableError):
    """A store holds no floor, and the gate has no token source to arm it from.

    The store is new, or it lost its data (a restart without persistence, a
    flush): its marks cannot be trusted, so it refuses every token until it is
    armed. A gate arms it by itself from its ``source=`` or, inside a fenced
    task, from the worker's source; otherwise run ``celery-fencing arm``.
    Nothing was written.
    """


class EffectPendingError(FencingError):
    """An idempotency key was claimed by an execution that has not recorded the effect's outcome.

    That execution may still be running (a re-delivered copy of a task whose
    first execution is paused), or it died between claiming the key and
    recording the outcome, in which case nobody knows whether the effect
    happened. The effect is not run again while the claim stands (see
    :mod:`celery_fencing.idempotency`); a fenced task retries with backoff.
    ``age`` is how long ago the claim was made, in seconds of the store's clock.
    """

    def __init__(self, message: str = "", *, key: str | None = None, age: float | None = None) -> None:
        if not message:
            since = f" {age:.1f}s ago" if age is not None else ""
            message = f"idempotency key {key!r} was claimed{since} and its outcome is not recorded yet"
        super().__init__(message)
        self.key = key
        self.age = age


class FencingConfigurationError(FencingError):
    """A malformed URL, unknown scheme, bad setting or bad task option."""
