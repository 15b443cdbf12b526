"""Token blocks: one coordinator write reserves many tokens, which one process hands out in order.

Hibernate's hi/lo, for fencing tokens. A source that mints a token with one
write to its coordinator (a ZooKeeper ``setData``, a SQLite ``UPDATE``) can
reserve a *block* of tokens with that same write: the write's number ``n``
stands for the tokens ``n*S .. n*S + B-1`` (ZooKeeper: ``S = 2**SCALE_BITS``,
``B <= S``) or ``n-B+1 .. n`` (SQLite: the counter advances by ``B``). Every
token is still minted from the grantor's counter, unique, and ordered within
the grantor; a later block is above every earlier block. What changes is that
a token handed out later in wall time, by another process, can be lower.

The storage decides by claim, so fencing stays safe; but "my claim was
refused, so a newer execution exists" is no longer true of a token that came
out of a block: the refusal may only say the block is old. A caller that
draws from a block (:meth:`BlockSource.mint_in_block`) must, on a refusal,
mint *fresh* (:meth:`BlockSource.mint_transient`: a write of its own, above
every token handed out before it) and only conclude from a refusal of the
fresh token. :class:`~celery_fencing.celery.FencedTask` does so; the protocol
model in tests/model/protocol.py shows why it must and that it suffices.

This module holds the per-process bookkeeping, with no driver: which block a
process holds, and what is left of it. A block never crosses ``fork()``: a
child that handed out its parent's tokens would give two executions one token.
"""

from __future__ import annotations

import os
import threading

from .exceptions import FencingConfigurationError

__all__ = ["DEFAULT_BLOCK_SIZE", "SCALE_BITS", "TokenBlock", "validate_block_size"]

#: A zxid-based source's tokens are ``zxid * 2**SCALE_BITS + i``. Ten bits keep
#: tokens below 2**63 for any zxid below 2**53: ZooKeeper epochs (the zxid's
#: high 32 bits) up to 2**21 leader elections.
SCALE_BITS = 10
#: Tokens per block unless the source is told otherwise: the whole scale.
DEFAULT_BLOCK_SIZE = 2**SCALE_BITS


def validate_block_size(value: object, *, maximum: int = DEFAULT_BLOCK_SIZE) -> int:
    """Return *value* as a block size (1 to *maximum*; 1 turns blocks off), else raise.

    :raises FencingConfigurationError: naming what is wrong.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise FencingConfigurationError(f"block must be an int from 1 to {maximum}, not {value!r:.40}")
    if not 1 <= value <= maximum:
        raise FencingConfigurationError(f"block must be from 1 (no blocks) to {maximum}, got {value}")
    return value


class TokenBlock:
    """The block one process holds: the token values left, with the grantor and session they came from.

    Thread-safe (the threads and greenlets of a worker share it). Empty after
    ``fork()`` in the child, and when the session it was reserved in is not the
    caller's (a source passes its session; ``None`` for sources without one).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._next = 0
        self._end = 0  # exclusive
        self._grantor = ""
        self._session: object = None

    def install(self, first: int, last: int, grantor: str, session: object = None) -> None:
        """Hold the values ``first .. last`` from now on (an empty range holds nothing), replacing what was left."""
        with self._lock:
            self._pid = os.getpid()
            self._next, self._end = first, last + 1
            self._grantor, self._session = grantor, session

    def take(self, session: object = None) -> tuple[int, str] | None:
        """The next value and its grantor, or ``None`` when the block is used up or not this process's or session's."""
        with self._lock:
            if self._next >= self._end or self._pid != os.getpid() or self._session != session:
                return None
            value = self._next
            self._next += 1
            return value, self._grantor

    def skip_below(self, floor: int) -> bool:
        """Hand out no value below *floor* (a store's floor refuses them); return whether any was skipped.

        The values left at or above it stay: only this process hands them out.
        """
        with self._lock:
            if self._pid != os.getpid() or self._next >= floor or self._next >= self._end:
                return False
            self._next = min(floor, self._end)
            return True

    def left(self) -> int:
        """How many values this process can still take (0 after ``fork()``)."""
        with self._lock:
            return 0 if self._pid != os.getpid() else max(0, self._end - self._next)
