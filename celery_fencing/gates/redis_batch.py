"""Lua script calls bound for one Redis server, sent in one round trip (a fenced task's claims)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
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
        try:
            sent = _send_together(calls[indexes[0]].client, [calls[index] for index in indexes])
        except (RedisError, ValueError, TypeError, OSError):
            continue  # nothing usable came back: each call runs on its own below, with its own error mapping
        for index, reply in zip(indexes, sent, strict=True):
            replies[index] = reply
    for call, reply in zip(calls, replies, strict=True):
        unsent = reply is _UNSENT or isinstance(reply, (NoScriptError, RedisConnectionError, RedisTimeoutError))
        if unsent or is_unarmed_refusal(reply):
            call.fallback()  # on its own: the unbatched call arms an unarmed store
        else:
            call.check(reply)


_UNSENT = object()


def _send_together(client: Any, calls: Sequence[ScriptCall]) -> list[Any]:
    """The calls' EVALSHAs written at once on one pooled connection, then their replies read in order.

    What ``client.pipeline(transaction=False).execute(raise_on_error=False)``
    does for these calls, without the pipeline object (a third of a claim's
    CPU on a worker): an error reply is returned in its place, as the
    pipeline returns it; a connection error drops the connection and raises.
    """
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        commands = [("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args) for call in calls]
        connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in calls:
            try:
                replies.append(connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        # A reply may be left unread: the connection must not go back to the pool in that state.
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


# What _server_of found for a client, remembered (the pool's settings do not change).
_servers: weakref.WeakKeyDictionary[Any, object] = weakref.WeakKeyDictionary()


def _server_of(client: Any, index: int) -> object:
    """What a pipeline on *client*'s connection would be (see :func:`_where`), remembered per client."""
    try:
        where = _servers.get(client)
    except TypeError:  # a client that cannot be weakly referenced is looked at every time
        return _where(client, index)
    if where is None:
        where = _where(client, index)
        if isinstance(where, tuple) and where[0] == "alone":
            return where
        _servers[client] = where
    return where


def _where(client: Any, index: int) -> object:
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
