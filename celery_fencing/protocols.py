"""The roles backends play: a token source mints, a gate checks; and the optional capabilities of each.

These are structural protocols (``typing.Protocol``): a backend conforms by
having the methods, not by inheriting. The Celery layer depends only on these,
and asks for an optional capability (a transient or block mint, a lease, a
lock-delay, a batched claim, a fenced result store) with :func:`conforms`
(``isinstance``, remembered per type) or, for a fast path that bypasses the
object's own methods, :func:`declares` (the class's own members only).
"""

from __future__ import annotations

import typing
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .token import FencingToken

if TYPE_CHECKING:
    from .context import Execution

__all__ = [
    "AppliedRecords",
    "BatchedClaimGate",
    "BatchedResultClaims",
    "BlockSource",
    "FencedResultStore",
    "FlooredStore",
    "Gate",
    "LeasingSource",
    "LockDelaySource",
    "TokenSource",
    "TokenVerifier",
    "TransientSource",
    "conforms",
    "declares",
]


@runtime_checkable
class TokenSource(Protocol):
    """Mints fencing tokens. The grantor, never the client, picks the number.

    Guarantees every implementation gives (the source contract suite checks them):

    * Tokens of one resource strictly increase, across threads, processes and
      restarts of the grantor.
    * ``mint`` returns within *timeout* seconds or raises
      :class:`~celery_fencing.TokenUnavailableError`; it never hangs.

    A source whose tokens are one global sequence may also be a
    :class:`TransientSource`, and one with locks a :class:`LeasingSource`.
    """

    def mint(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """Mint a new token for *resource*, larger than every earlier one."""
        ...

    def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...


@runtime_checkable
class TransientSource(Protocol):
    """A source whose tokens are one global sequence (ZooKeeper's zxid, SQLite's counter).

    ``mint_transient`` gives a token ordered as ``mint``'s, mixed freely with
    them, that leaves no per-resource state behind. Fenced tasks use it for
    task-id resources, which are never minted for again once the task is
    done, and the stores for their floors.
    """

    def mint_transient(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """A token for *resource*, above every token minted before the call, leaving no per-resource state."""
        ...


@runtime_checkable
class LeasingSource(Protocol):
    """A source that holds a resource's lock with a token minted under it (ZooKeeper, etcd): exclusive mode.

    ``lease`` returns a context manager whose value has ``token`` and
    ``on_lost(callback)``; it waits at most *timeout* for the lock.
    """

    def lease(self, resource: str, *, timeout: float | None = None) -> AbstractContextManager[Any]:
        """Hold *resource*'s lock for the ``with`` block, with a token minted under it."""
        ...


@runtime_checkable
class LockDelaySource(Protocol):
    """A leasing source whose leases also take a lock-delay (ZooKeeper): ``lease(resource, *, timeout, lock_delay)``.

    After a lease that ended because its holder failed, the resource is not
    granted again for *lock_delay* seconds (see ``fencing_lock_delay``).
    """

    def lease(
        self, resource: str, *, timeout: float | None = None, lock_delay: float | None = None
    ) -> AbstractContextManager[Any]:
        """Hold *resource*'s lock, waiting out a lock-delay left by a failed holder."""
        ...

    #: Declares the capability: ``lease`` takes *lock_delay* (a parameter no ``isinstance`` can see).
    lease_takes_lock_delay: bool


@runtime_checkable
class BlockSource(Protocol):
    """A source that reserves tokens by the block: one coordinator write for many tokens (see :mod:`.blocks`).

    * ``mint_transient(resource)`` is *fresh*: one write of its own, so its
      token is above every token of the grantor handed out before the call,
      by any process. It also gives this process the rest of a new block.
    * ``mint_in_block(resource)`` hands out the next token of the process's
      block, reserving a new one (a fresh mint) when none is left. Its token
      is above every token this process had before, but may be below one
      another process handed out earlier in wall time.

    So a caller that draws from a block and is refused must mint fresh before
    it concludes that a newer execution exists. ``block_size`` is 1 when
    blocks are off: every ``mint_in_block`` is then a fresh mint.
    """

    block_size: int

    def mint_transient(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """A fresh token for *resource*, leaving no per-resource state behind."""
        ...

    def mint_in_block(self, resource: str, *, timeout: float | None = None) -> FencingToken:
        """The next token of this process's block, or a fresh one when the block is used up."""
        ...

    def skip_block_below(self, floor: int) -> bool:
        """Hand out no token of this process's block below *floor* (a store's floor); whether any was skipped."""
        ...


@runtime_checkable
class Gate(Protocol):
    """Checks tokens at the storage, against a high-water mark kept with the data.

    Semantics every gate implements (the gate contract suite checks them):

    * ``claim(token)`` atomically raises the resource's mark to ``token.value``
      when the mark is not above it, else raises
      :class:`~celery_fencing.StaleTokenError` carrying the resource, the token
      and the mark. A task claims before it reads, so a paused predecessor can
      no longer land a write between this task's read and its write.
    * Every gated write accepts ``token >= mark`` (one execution may write many
      times, and retry) and rejects a lower token in the same atomic operation
      as the write. A rejected write changes neither the data nor the mark.
    * Data is bound to one resource: a token of resource A presented for data
      of resource B raises :class:`~celery_fencing.ResourceMismatchError`.
    * Bad input raises :class:`~celery_fencing.InvalidTokenError` before any I/O.
    * Unreachable storage raises :class:`~celery_fencing.GateUnavailableError`
      with the driver's error chained, within the driver's timeout.
    """

    def claim(self, token: FencingToken | None = None) -> None:
        """Raise the mark of ``token.resource`` to ``token.value`` or raise ``StaleTokenError``.

        ``None`` means the current task's token (:func:`~celery_fencing.current_token`).
        """
        ...

    def high_water(self, resource: str) -> int | None:
        """Return the resource's mark, or ``None`` if it was never claimed or written."""
        ...


@runtime_checkable
class BatchedClaimGate(Protocol):
    """A gate whose claim can join other script calls in one Redis round trip (:mod:`.gates.redis_batch`).

    Checked with :func:`declares`: the call skips the gate's ``claim()``.
    """

    def claim_call(self, token: FencingToken | None = None) -> Any:
        """The claim of *token* as a script call, to be run with others in one round trip."""
        ...


@runtime_checkable
class BatchedResultClaims(Protocol):
    """A result backend whose result claim can join the gates' batched claims (the fenced Redis backend)."""

    def claim_result_call(self, task_id: str, token: FencingToken) -> Any:
        """The claim of *task_id*'s result with *token* as a script call."""
        ...


@runtime_checkable
class TokenVerifier(Protocol):
    """Checks where a token came from, before a gate lets it near the storage.

    Gates built with ``verifier=`` call it on every token, after validation
    and before any I/O: :class:`~celery_fencing.signing.TokenSigner` (signed
    mode) and :class:`~celery_fencing.signing.PlausibilityBound` (no token
    above what its grantor can have issued) are the two shipped.
    """

    def verify(self, token: FencingToken) -> None:
        """Return if *token* may be used, else raise :class:`~celery_fencing.ForgedTokenError`
        (or :class:`~celery_fencing.GrantorMismatchError`)."""
        ...


@runtime_checkable
class FencedResultStore(Protocol):
    """A Celery result backend that fences its result writes (``fenced+redis://``, ``+db+...``, ``+django-db``).

    A fenced task claims its result when it starts, and seals it when its body
    has returned, before Celery sends the task's callbacks: the first
    execution of a task id to seal is the one whose result stands. Its result
    writes (``_store_result``) judge the request's token against the result's
    mark in the same atomic operation as the write, and drop (never raise) a
    refused one; ``forget()`` removes the fence with the result. The backend
    contract suite (tests/celery/backends/) checks every implementation.
    """

    def claim_result(self, task_id: str, token: FencingToken) -> None:
        """Raise the result's mark; ``AlreadyAppliedError`` when another execution sealed the task."""
        ...

    def seal_result(self, task_id: str, execution: Execution) -> None:
        """Make *execution* the one whose result stands; ``AlreadyAppliedError`` when another sealed first."""
        ...


@runtime_checkable
class FlooredStore(Protocol):
    """A store that refuses every token while it holds no floor (it is new, or it lost its marks).

    A fenced task arms such a store before it mints, so that its own token
    is above the floor; a store that loses its data later is armed by the
    write that finds it so, and that write's token is refused as below it.
    """

    def ensure_armed(self, resource: str, source: TokenSource) -> int | None:
        """Give the store of *resource* a floor minted from *source* if it has none (checked once, then cached).

        Returns the floor in force when the store was looked at, ``None`` when
        it was not (already checked): a caller drawing tokens from a block
        skips the block's tokens below it.
        """
        ...


@runtime_checkable
class AppliedRecords(Protocol):
    """A gate that records the task id of each effect (exactly once) and can say which execution applied."""

    def applied(self, resource: str, task_id: str) -> str | None:
        """The id of the execution of *task_id* that applied on *resource*, or ``None`` (never, or expired)."""
        ...


_conforming: dict[tuple[type, type], bool] = {}


def conforms(obj: object, protocol: Any) -> bool:
    """``isinstance(obj, protocol)`` for a runtime-checkable *protocol*, remembered per type where that is sound.

    Python rebuilds a protocol's member set on every ``isinstance``, and a
    fenced task asks a few times per execution. The answer is remembered for
    a type when no instance can differ: yes when the type itself has every
    member, no when it lacks one and has no ``__getattr__`` to forward it (a
    wrapper such as ``MeteredGate`` conforms as what it wraps does, so it is
    asked each time).
    """
    kind = type(obj)
    key = (kind, protocol)
    known = _conforming.get(key)
    if known is not None:
        return known
    members = _members(protocol)
    if all(hasattr(kind, name) for name in members):
        answer = _conforming[key] = True
        return answer
    answer = isinstance(obj, protocol)
    if not answer and not hasattr(kind, "__getattr__"):
        _conforming[key] = False
    return answer


_declaring: dict[tuple[type, type], bool] = {}


def declares(obj: object, protocol: Any) -> bool:
    """Whether *obj*'s class itself has every member of *protocol*, not a wrapper that forwards them.

    For optional fast paths that bypass the object's own methods: a claim
    batched as a script call skips ``claim()``, so a wrapper that forwards
    unknown attributes (``MeteredGate``) must not be taken for a gate that
    declares one; it is claimed through its own ``claim()``.
    """
    kind = type(obj)
    key = (kind, protocol)
    known = _declaring.get(key)
    if known is None:
        known = _declaring[key] = all(hasattr(kind, name) for name in _members(protocol))
    return known


def _members(protocol: Any) -> frozenset[str]:
    members = getattr(protocol, "__protocol_attrs__", None)  # Python 3.12+
    if members is None:
        members = typing._get_protocol_attrs(protocol)  # type: ignore[attr-defined]
    return frozenset(members)
