"""Lua script calls bound for one Redis server, sent in one round trip (a fenced task's claims)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .redis_floor import is_unarmed_refusal

__all__ = ["ScriptCall", "run_script_calls"]


@dataclass(frozen=True)
class ScriptCall:
    """One Lua script call, prepared so that calls bound for one Redis server share a round trip.

    ``check`` interprets the call's reply (or the error object a pipeline
    returns in its place) and raises what the unbatched call would raise;
    ``fallback`` is the unbatched call itself, used when the batch gave no
    usable reply (the server lost its script cache, the connection failed).
    """

    client: Any
    script: Any
    keys: list[str]
    args: list[Any]
    check: Callable[[Any], None]
    fallback: Callable[[], None]


def run_script_calls(calls: Sequence[ScriptCall]) -> None:
    """Run *calls*, those bound for the same Redis server pipelined in one round trip.

    Each script stays atomic on its own; the calls are not one transaction:
    every call runs even when an earlier one is refused, so batch only calls
    for which that is harmless (a fenced task batches only the claims of a
    task-id resource). A call alone for its server is sent on its own.
    Replies are checked in the order of *calls*, and the first error is raised.
    """
    groups: dict[object, list[int]] = {}
    for index, call in enumerate(calls):
        groups.setdefault(_server_of(call.client, index), []).append(index)
    replies: list[Any] = [_UNSENT] * len(calls)
    for indexes in groups.values():
        if len(indexes) < 2:
            continue
        pipe = calls[indexes[0]].client.pipeline(transaction=False)
        for index in indexes:
            call = calls[index]
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        try:
            for index, reply in zip(indexes, pipe.execute(raise_on_error=False), strict=True):
                replies[index] = reply
        except (RedisError, ValueError, TypeError):
            pass  # nothing usable came back: each call runs on its own below, with its own error mapping
    for call, reply in zip(calls, replies, strict=True):
        unsent = reply is _UNSENT or isinstance(reply, (NoScriptError, RedisConnectionError, RedisTimeoutError))
        if unsent or is_unarmed_refusal(reply):
            call.fallback()  # on its own: the unbatched call arms an unarmed store
        else:
            call.check(reply)


_UNSENT = object()


def _server_of(client: Any, index: int) -> object:
    """What a pipeline on *client*'s connection would be: server, database, user and encoding.

    Two clients batch together only when every setting that decides where a
    command goes, as whom, and how it is encoded agrees (defaults normalised:
    Celery's Redis backend leaves out what ``redis.Redis()`` spells out); a
    credential provider or connect hook is compared by identity. Anything
    else (a cluster or sentinel client, a pool without known settings) runs
    alone.
    """
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if type(client).__name__ not in ("Redis", "StrictRedis") or not isinstance(kwargs, dict):
        return ("alone", index)
    where = kwargs.get("path") or (kwargs.get("host"), kwargs.get("port"))
    if not where or where == (None, None):
        return ("alone", index)
    hooks = tuple(id(kwargs[name]) if kwargs.get(name) is not None else None for name in _AUTH_HOOKS)
    tls = tuple(sorted((name, repr(value)) for name, value in kwargs.items() if name.startswith("ssl")))
    return (
        type(pool),
        getattr(pool, "connection_class", None),
        where,
        int(kwargs.get("db") or 0),
        kwargs.get("username"),
        kwargs.get("password"),
        hooks,
        tls,
        kwargs.get("encoding") or "utf-8",
        kwargs.get("encoding_errors") or "strict",
        bool(kwargs.get("decode_responses")),
        str(kwargs.get("protocol") or 2),
    )


# Connection settings that may authenticate or pick a database their own way.
_AUTH_HOOKS = ("credential_provider", "redis_connect_func")
