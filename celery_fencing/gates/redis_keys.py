"""The names of a Redis gate's keys, the encoding of its marks and script arguments, and their checks.

No redis-py import and no I/O: everything here runs before a command is sent.
"""

from __future__ import annotations

import math
from datetime import timedelta

from ..context import fence_state_ttl_ms
from ..exceptions import GateUnavailableError, InvalidArgumentError
from ..token import FencingToken

__all__ = [
    "MARK_WIDTH",
    "applied_key",
    "check_key",
    "claim_args",
    "decode_mark",
    "encode_mark",
    "expiry_ms",
    "grantor_arg",
    "grantor_key",
    "hash_tag",
    "mark_key",
    "owner_key",
]

#: Width of a stored mark: 2**63 - 1 has 19 digits, so 20 leaves room and every
#: valid token fits. Equal width is what makes string order numeric order.
MARK_WIDTH = 20


def mark_key(prefix: str, resource: str) -> str:
    """Return the name of the key holding *resource*'s mark (``<prefix>:mark:<resource>``)."""
    return f"{prefix}:mark:{resource}"


def grantor_key(prefix: str, resource: str) -> str:
    """Return the name of the key holding the grantor id of *resource*'s mark (``<prefix>:grantor:<resource>``)."""
    return f"{prefix}:grantor:{resource}"


def applied_key(prefix: str, resource: str, task_id: str) -> str:
    """Return the name of the key recording which execution of task *task_id* applied on *resource*."""
    return f"{prefix}:applied:{resource}:{task_id}"


def owner_key(prefix: str, key: str) -> str:
    """Return the name of the key recording which resource owns data key *key*."""
    return f"{prefix}:owner:{key}"


def hash_tag(name: str) -> str | None:
    """The hash tag of a key name as Redis Cluster reads it (the first ``{...}``, non-empty), or ``None``."""
    start = name.find("{")
    if start < 0:
        return None
    end = name.find("}", start + 1)
    if end <= start + 1:
        return None
    return name[start + 1 : end]


def encode_mark(value: int) -> str:
    """Return *value* as a stored mark: 20 zero-padded decimal digits."""
    return f"{value:0{MARK_WIDTH}d}"


def decode_mark(raw: str | bytes) -> int:
    """Parse a stored mark.

    :raises GateUnavailableError: the key does not hold a mark written by a gate.
    """
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if len(text) != MARK_WIDTH or not text.isdigit() or not text.isascii():
        raise GateUnavailableError(f"mark key holds {text!r:.40}, not a {MARK_WIDTH}-digit mark", gate="RedisGate")
    return int(text)


def check_key(key: object) -> None:
    if not isinstance(key, str):
        raise InvalidArgumentError(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidArgumentError("key must not be empty")


def expiry_ms(ex: object) -> int:
    if isinstance(ex, timedelta):
        seconds = ex.total_seconds()
    elif isinstance(ex, (int, float)) and not isinstance(ex, bool):
        try:
            seconds = float(ex)
        except OverflowError:
            seconds = math.inf
    else:
        raise InvalidArgumentError(f"ex must be seconds or a timedelta, not {type(ex).__name__}")
    # Redis refuses an expiry past 2**63 ms from now, inside the script: bound it here, before any I/O.
    if not math.isfinite(seconds) or not 1 <= round(seconds * 1000) <= MAX_EXPIRY_MS:
        raise InvalidArgumentError(f"ex must be a finite expiry of 1 ms to about 8,900 years, got {ex!r:.60}")
    return round(seconds * 1000)


MAX_EXPIRY_MS = 2**48


def grantor_arg(token: FencingToken) -> str:
    """The grantor id a script compares with the mark's: '' for a token without one."""
    return "" if token.grantor is None else token.grantor


def claim_args(token: FencingToken) -> list[object]:
    """ARGV of the claim script: the token's 20 digits, its grantor, and how long its fence state lives (ms)."""
    return [encode_mark(token.value), grantor_arg(token), fence_state_ttl_ms(token)]
