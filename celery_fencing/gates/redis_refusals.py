"""What a Redis gate script's refusal means: the ``FENCED <kind> <detail>`` reply as the gate's exception."""

from __future__ import annotations

from typing import NoReturn

from redis.exceptions import RedisError, ResponseError

from ..context import AppliedRecord
from ..exceptions import (
    AlreadyAppliedError,
    BelowFloorError,
    GateUnavailableError,
    GrantorMismatchError,
    ResourceMismatchError,
    StaleTokenError,
    StoreUnarmedError,
)
from ..token import FencingToken
from .redis_keys import MARK_WIDTH, decode_mark
from .redis_scripts import parse_refusal

__all__ = ["raise_for", "raise_unavailable"]


def raise_for(exc: RedisError, token: FencingToken, record: AppliedRecord | None = None) -> NoReturn:
    """A script's refusal (an error reply starting ``FENCED``) as the gate's error; any other as unavailable."""
    refusal = parse_refusal(str(exc)) if isinstance(exc, ResponseError) else None
    if refusal is not None:
        _raise_fenced(*refusal, token, record)
    raise_unavailable(exc)


def _raise_fenced(kind: str, detail: str, token: FencingToken, record: AppliedRecord | None) -> NoReturn:
    if kind == "floor":
        raise BelowFloorError(resource=token.resource, token=token.value, floor=decode_mark(detail))
    if kind == "unarmed":
        raise StoreUnarmedError(f"Redis holds no fencing floor for {token.resource!r}", gate="RedisGate")
    if kind == "stale":
        raise StaleTokenError(resource=token.resource, token=token.value, high_water=decode_mark(detail))
    if kind in ("applied", "superseded"):
        raise AlreadyAppliedError(
            resource=token.resource,
            task_id=record.task_id if record is not None else None,
            superseded=kind == "superseded",
            applied_token=None if detail == "-" else decode_mark(detail),
        )
    if kind == "grantor":
        raise GrantorMismatchError(resource=token.resource, token_grantor=token.grantor, expected_grantor=detail)
    if kind == "changed":
        raise StaleTokenError(
            f"the mark of {token.resource!r} changed since it was read (it is now {detail}); nothing was reset",
            resource=token.resource,
            token=token.value,
            high_water=None if detail == "-" else decode_mark(detail),
        )
    if kind == "owner":
        raise ResourceMismatchError(
            f"key belongs to resource {detail!r}, not {token.resource!r}",
            token_resource=token.resource,
            expected_resource=detail,
        )
    what = "the store's floor key" if detail == "floor" else detail
    raise GateUnavailableError(f"{what} does not hold a {MARK_WIDTH}-digit mark", gate="RedisGate")


def raise_unavailable(exc: RedisError) -> NoReturn:
    raise GateUnavailableError(f"Redis gate failed: {type(exc).__name__}: {exc}", gate="RedisGate") from exc
