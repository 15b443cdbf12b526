"""A Redis store's floor: what makes a store that forgot its marks refuse every older token.

The floor key lives beside the marks and is lost with them (a restart without
persistence, a flush). Every gate script reads it (see
:mod:`celery_fencing.gates.redis_scripts`); a store without it is *unarmed* and
refuses every token until it is armed with a token minted after the loss was
seen. Shared by :class:`~celery_fencing.RedisGate` and the fenced result backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

from redis.exceptions import RedisError, ResponseError

from ..exceptions import FencingConfigurationError, GateUnavailableError, InvalidArgumentError, StoreUnarmedError
from ..protocols import TokenSource, TransientSource
from ..token import FencingToken, validate_resource
from .redis_keys import MARK_WIDTH, decode_mark, encode_mark, hash_tag
from .redis_scripts import ARM_SCRIPT, parse_refusal

__all__ = [
    "FLOOR_RESOURCE",
    "StoreFloors",
    "arm_unarmed_store",
    "decode_floor",
    "encode_floor",
    "found_floor",
    "is_unarmed_refusal",
    "mint_floor",
    "raise_floor",
]

logger = logging.getLogger("celery_fencing.gates.redis")

#: The resource a floor is minted on (any resource would do: the floor is
#: compared on the source's one scale, with every resource's tokens).
FLOOR_RESOURCE = "celery-fencing:floor"


def mint_floor(source: TokenSource) -> FencingToken:
    """A floor: a token minted now, on the source's one scale (transient where the source can, leaving no state)."""
    mint = source.mint_transient if isinstance(source, TransientSource) else source.mint
    token: FencingToken = mint(FLOOR_RESOURCE)
    return token


def decode_floor(raw: str | bytes) -> int:
    """The value of a stored floor (see :func:`encode_floor`)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if len(text) > MARK_WIDTH and text[MARK_WIDTH] != ":":
        raise GateUnavailableError(f"floor key holds {text!r:.40}, not a floor", gate="RedisGate")
    return decode_mark(text[:MARK_WIDTH])


def found_floor(
    raw: str | bytes | None, arm_script: Any, key: str, source: TokenSource | None, store: str
) -> int | None:
    """The floor of the store whose floor *key* was read as *raw*, arming it from *source* when it has none.

    ``None`` when the key holds something no gate wrote: the arming leaves it
    alone. Every script then refuses every token as ``corrupt`` (one shorter
    than a floor counts as no floor: the script arms over it), so the store
    fails closed until an operator clears the key.
    """
    if raw is None:
        return arm_unarmed_store(arm_script, key, source, store)
    try:
        return decode_floor(raw)
    except GateUnavailableError:
        return None


def encode_floor(floor: object) -> str:
    """A floor as stored: its 20 digits, then ``:<grantor id>`` for a token's (it bounds that grantor's tokens).

    *floor* is a token (minted by the workers' source) or a bare value in
    0 .. 2**63 - 1, which bounds every token; checked before any I/O.

    :raises InvalidArgumentError: *floor* is neither.
    """
    if isinstance(floor, FencingToken):
        return encode_mark(floor.value) + ("" if floor.grantor is None else f":{floor.grantor}")
    if isinstance(floor, bool) or not isinstance(floor, int) or not 0 <= floor < 2**63:
        raise InvalidArgumentError(f"a floor is a FencingToken or an int in 0 .. 2**63 - 1, not {floor!r:.40}")
    return encode_mark(floor)


def arm_unarmed_store(arm_script: Any, key: str, source: TokenSource | None, store: str) -> int:
    """Give a store found without its floor (key *key*) one minted now from *source*; return the floor in force.

    Whoever arms first wins: a concurrent arming's floor is kept. *arm_script*
    is :data:`~celery_fencing.gates.redis_scripts.ARM_SCRIPT` registered on the
    store's client; its redis-py errors propagate.

    :raises StoreUnarmedError: there is no source to mint the floor from.
    :raises TokenUnavailableError: the source could not mint.
    """
    if source is None:
        raise StoreUnarmedError(
            f"{store}: Redis holds no fencing floor (a new store, or it lost its data: a restart without "
            "persistence, a flush), so every token is refused until it is armed: run `celery-fencing arm`, "
            "or give the gate a source=",
            gate=store,
        )
    armed = decode_floor(arm_script(keys=[key], args=[encode_floor(mint_floor(source)), 1]))
    logger.warning(
        "%s: Redis held no fencing floor at %s (a new store, or it lost its data); armed with floor %d from %s: "
        "tokens minted before it are refused",
        store,
        key,
        armed,
        type(source).__name__,
    )
    return armed


def raise_floor(arm_script: Any, key: str, floor: int | FencingToken) -> int:
    """Raise the floor at *key* to *floor* (never lower it); return the floor in force. redis-py errors propagate.

    *arm_script* is :data:`~celery_fencing.gates.redis_scripts.ARM_SCRIPT`
    registered on the store's client. The floor is checked before any I/O.
    """
    stored = encode_floor(floor)
    return decode_floor(arm_script(keys=[key], args=[stored, 0]))


def is_unarmed_refusal(reply: object) -> bool:
    """Whether a script's reply is the refusal of a store without its floor."""
    refusal = parse_refusal(str(reply)) if isinstance(reply, ResponseError) else None
    return refusal is not None and refusal[0] == "unarmed"


# Floor keys a StoreFloors remembers as armed; bounded, as a cluster has one per hash tag.
_MAX_REMEMBERED = 256


class StoreFloors:
    """The floor of a RedisGate's store: one key, or in a cluster one per hash tag (*per_tag*).

    *unavailable* turns a redis-py error into the gate's own error.
    """

    def __init__(
        self, client: Any, key: str, *, per_tag: bool, store: str, unavailable: Callable[[RedisError], NoReturn]
    ) -> None:
        self.client = client
        self.base_key = key
        self.per_tag = per_tag
        self.store = store
        self._unavailable = unavailable
        self._script: Any = client.register_script(ARM_SCRIPT)
        # Floor keys seen armed (ensure): after that the scripts alone watch them.
        self._armed: set[str] = set()

    def key(self, resource: str) -> str:
        """The floor key guarding *resource*: ``<key>``, or ``<key>:{<tag>}`` in a cluster."""
        if self.per_tag:
            tag = hash_tag(resource)
            if tag is not None:
                return f"{self.base_key}:{{{tag}}}"
        return self.base_key

    def read(self, resource: str) -> int | None:
        """The floor guarding *resource*, or ``None`` when the store is unarmed."""
        validate_resource(resource)
        try:
            raw = self.client.get(self.key(resource))
        except RedisError as exc:
            self._unavailable(exc)
        return None if raw is None else decode_floor(raw)

    def arm(self, resource: str, floor: int | FencingToken | None, source: TokenSource | None) -> int:
        """Raise the floor guarding *resource* to *floor* (a token minted from *source* when ``None``)."""
        if floor is None:
            if source is None:
                raise FencingConfigurationError(f"{self.store}.arm() without a floor needs the gate's source=")
            floor = mint_floor(source)
        encode_floor(floor)  # bad input is refused before the resource is looked at
        validate_resource(resource)
        try:
            return raise_floor(self._script, self.key(resource), floor)
        except RedisError as exc:
            self._unavailable(exc)

    def arm_unarmed(self, resource: str, source: TokenSource | None) -> None:
        """Arm the store of *resource*, found unarmed by a script, from *source*."""
        try:
            arm_unarmed_store(self._script, self.key(resource), source, self.store)
        except RedisError as exc:
            self._unavailable(exc)

    def ensure(self, resource: str, source: TokenSource | None) -> int | None:
        """Arm the store of *resource* from *source* if it has no floor; checked once per floor key.

        Returns the floor in force when the key was looked at, ``None`` when it was already known armed.
        """
        key = self.key(resource)
        if key in self._armed:
            return None
        try:
            raw = self.client.get(key)
            floor = found_floor(raw, self._script, key, source, self.store)
        except RedisError as exc:
            self._unavailable(exc)
        if len(self._armed) >= _MAX_REMEMBERED:
            self._armed.clear()
        self._armed.add(key)
        return floor
