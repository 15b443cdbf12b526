"""The names of a Redis gate's keys and the encoding of its marks: no redis-py import, no I/O."""

from __future__ import annotations

from ..exceptions import GateUnavailableError

__all__ = [
    "MARK_WIDTH",
    "applied_key",
    "decode_mark",
    "encode_mark",
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
