"""A gate in Redis: the high-water mark lives beside the data, checked in the same Lua script.

The story it prevents::

    t=0   A holds token 33 for "account:{42}", reads the balance (100), pauses
    t=30  B gets token 34, writes 110 through the gate: the mark becomes 34
    t=41  A resumes and writes 105 with token 33: the script sees 33 < 34 and
          refuses; nothing changes, and A gets StaleTokenError(high_water=34)

Every write is one Lua script (``EVALSHA``; redis-py reloads it on ``NOSCRIPT``)
that checks the token and writes the data atomically, so no other command can
run between the check and the write. The scripts and their one fence check
live in :mod:`celery_fencing.gates.redis_scripts`.

Key layout, for a gate with ``prefix="fencing"``:

==================================  ==============================================
``fencing:mark:<resource>``         the resource's high-water mark: a 20-digit,
                                    zero-padded decimal string
``fencing:grantor:<resource>``      the grantor id the mark belongs to (absent
                                    until a token with a grantor passes the mark)
``fencing:owner:<key>``             the resource a data key is bound to, set on
                                    the key's first gated write
``fencing:applied:<resource>:<id>`` ``<token>:<execution id>`` of the execution
                                    of task ``<id>`` that applied on the resource
                                    (exactly once; expires after the execution's
                                    retention)
``<key>``                           your data, untouched by the gate's naming
==================================  ==============================================

Lifetimes: a domain resource's mark, grantor and owner keys are kept for
good (they are what refuses a stale writer). Inside a fenced task whose
resource is its task id, they expire with the task's retention
(``fencing_once_retention``): a task id is never fenced again once its task
is done.

Exactly once: inside a fenced task (``fencing_once``, on by default), every
gated write also records "task id T applied on resource R by execution E" in
the same script. Another execution of T that writes R afterwards (a
re-delivered copy, the retry of a refused copy) is refused with
:class:`~celery_fencing.AlreadyAppliedError` and changes nothing. The checks
run in one order: owner, grantor, applied, stale.

Marks are compared as equal-width digit strings, never as Lua numbers: Lua
numbers are doubles, exact only below 2**53 (2**53 + 1 compares equal to
2**53), and tokens go up to 2**63 - 1. Grantor ids are compared exactly, in
the same script: a token of another grantor is refused with
:class:`~celery_fencing.GrantorMismatchError`, checked before its value (a
wiped grantor's tokens are also low, and the mismatch is the news). A mark
without a grantor key (written by tokens without a grantor, or by an older
version of this library) adopts the grantor of the first token that passes it.

Redis Cluster: a script may only touch keys of one hash slot. Put one hash tag
in the resource and in every data key of that resource: with resource
``"account:{42}"`` and data key ``"account:{42}:balance"``, the mark key
``fencing:mark:account:{42}`` and the owner key ``fencing:owner:account:{42}:balance``
hash to the data key's slot. The prefix must therefore contain no braces.

Persistence: the marks are ordinary keys. Without AOF (or RDB snapshots), a
restart forgets them together with the data in the same Redis, which stays
coherent; but marks in a Redis without persistence that guard data stored
elsewhere are unsafe: after a restart the gate accepts a stale token.

Errors: bad input raises :class:`~celery_fencing.InvalidTokenError` (tokens)
or :class:`~celery_fencing.InvalidArgumentError` (keys, values, expiry; also a
``TypeError`` and ``ValueError``) before any I/O. Every
error of redis-py (connection refused, timeout, a command error such as
``WRONGTYPE``) becomes :class:`~celery_fencing.GateUnavailableError` with the
redis-py exception chained; the time it takes is bounded by the client's
``socket_connect_timeout``, ``socket_timeout`` and retry policy, which the gate
leaves to you (redis-py 8 retries a refused connection ten times with backoff
by default). Note that redis-py also retries a command whose reply was lost:
the gated ``set``/``hset``/``delete`` and ``claim`` are idempotent for one
token, an ``eval`` body need not be.

Thread and fork safety: a gate is as safe as its client; redis-py clients are
thread-safe and reconnect after ``fork()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..context import AppliedRecord, applied_record, fence_state_ttl_ms, resolve_token
from ..exceptions import (
    AlreadyAppliedError,
    FencingConfigurationError,
    GateUnavailableError,
    GrantorMismatchError,
    InvalidArgumentError,
    ResourceMismatchError,
    StaleTokenError,
)
from ..protocols import TokenVerifier
from ..token import FencingToken, Mark, validate_resource
from .redis_scripts import (
    CLAIM_SCRIPT,
    DELETE_SCRIPT,
    EVAL_SCRIPT_TEMPLATE,
    HSET_SCRIPT,
    RESET_SCRIPT,
    SET_SCRIPT,
    parse_refusal,
)

__all__ = [
    "MARK_WIDTH",
    "RedisGate",
    "ScriptCall",
    "applied_key",
    "decode_mark",
    "encode_mark",
    "grantor_key",
    "mark_key",
    "owner_key",
    "run_script_calls",
]

#: Width of a stored mark: 2**63 - 1 has 19 digits, so 20 leaves room and every
#: valid token fits. Equal width is what makes string order numeric order.
MARK_WIDTH = 20

# Bodies are wrapped and hashed once per gate; the cache is bounded so a caller
# generating bodies cannot grow it without limit.
_MAX_CACHED_BODIES = 256


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


class RedisGate:
    """Checks fencing tokens in Redis, with marks and data in the same scripts.

    Semantics (see :class:`~celery_fencing.Gate`): ``claim`` raises the mark
    to the token unless the mark is above it; every gated write accepts
    ``token >= mark`` and refuses a lower token, atomically with the write; a
    refused write changes nothing; a data key is bound to the resource of its
    first gated write and refuses tokens of any other resource. Reads are not
    gated: read through the client (or :meth:`get`) after claiming.

    :param client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` client,
        with or without ``decode_responses``.
    :param prefix: namespace of the gate's own keys (marks, grantors and
        owners). It must contain no ``{`` or ``}``, which would capture the hash tag.
    :param verifier: checks every token's origin before it is used (signed
        mode, plausibility bound), before any I/O; see :mod:`celery_fencing.signing`.
    :raises FencingConfigurationError: for a bad prefix.

    Token ``None`` means the current token (:func:`~celery_fencing.current_token`).
    """

    def __init__(self, client: Any, *, prefix: str = "fencing", verifier: TokenVerifier | None = None) -> None:
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise FencingConfigurationError(f"RedisGate prefix must be a non-empty str without braces, not {prefix!r}")
        self.client = client
        self.prefix = prefix
        self.verifier = verifier
        # A cluster client: every key of one script must hash to the resource's slot, checked before any I/O.
        self._cluster = _is_cluster_client(client)
        self._mark_prefix = f"{prefix}:mark:"
        self._grantor_prefix = f"{prefix}:grantor:"
        self._owner_prefix = f"{prefix}:owner:"
        self._applied_prefix = f"{prefix}:applied:"
        # register_script only hashes the source: no I/O here, and once per
        # gate rather than per call. _run sends EVALSHA and loads the source
        # again after a NOSCRIPT (SCRIPT FLUSH, a restart, a failover to a
        # replica that never saw the script). The objects are
        # redis.commands.core.Script, typed Any because the installed stubs
        # (types-redis) lack their ``sha`` and ``script`` attributes.
        self._claim_script: Any = client.register_script(CLAIM_SCRIPT)
        self._set_script: Any = client.register_script(SET_SCRIPT)
        self._hset_script: Any = client.register_script(HSET_SCRIPT)
        self._delete_script: Any = client.register_script(DELETE_SCRIPT)
        self._reset_script: Any = client.register_script(RESET_SCRIPT)
        self._bodies: dict[str, Any] = {}

    # Key names ----------------------------------------------------------------

    def mark_key(self, resource: str) -> str:
        """Return the name of the key holding *resource*'s mark."""
        return self._mark_prefix + resource

    def grantor_key(self, resource: str) -> str:
        """Return the name of the key holding the grantor id of *resource*'s mark."""
        return self._grantor_prefix + resource

    def owner_key(self, key: str) -> str:
        """Return the name of the key recording the resource that owns data key *key*."""
        return self._owner_prefix + key

    def _checked(self, token: FencingToken | None) -> FencingToken:
        return resolve_token(token, verifier=self.verifier)

    def _mark_keys(self, token: FencingToken) -> list[str]:
        return [self._mark_prefix + token.resource, self._grantor_prefix + token.resource]

    def _fence_keys(self, token: FencingToken, record: AppliedRecord | None) -> list[str]:
        """KEYS[1..3] of a write script: mark, grantor and applied-record keys."""
        # Without a record the script reads the applied key's slot but never writes it:
        # the name still carries the resource, so it hashes to the resource's slot.
        task_id = record.task_id if record is not None else ""
        return [
            self._mark_prefix + token.resource,
            self._grantor_prefix + token.resource,
            self._applied_key(token.resource, task_id),
        ]

    def _applied_key(self, resource: str, task_id: str) -> str:
        return f"{self._applied_prefix}{resource}:{task_id}"

    @staticmethod
    def _fence_args(token: FencingToken, record: AppliedRecord | None) -> list[Any]:
        """ARGV[1..6] of a write script: token, resource, grantor, execution id, record retention, state ttl."""
        execution, retention = ("", 0) if record is None else (record.execution_id, record.retention_ms)
        args = [encode_mark(token.value), token.resource, _grantor_arg(token), execution, retention]
        args.append(fence_state_ttl_ms(token))
        return args

    # Gate protocol ------------------------------------------------------------

    def claim(self, token: FencingToken | None = None) -> None:
        """Raise the mark of ``token.resource`` to ``token.value``.

        :raises StaleTokenError: the mark is above the token (nothing changed).
        :raises GrantorMismatchError: the mark belongs to another grantor (nothing changed).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        checked = self._checked(token)
        keys = self._mark_keys(checked)
        self._check_slots(checked, keys)
        self._run(self._claim_script, checked, keys, _claim_args(checked))

    def claim_call(self, token: FencingToken | None = None) -> ScriptCall:
        """:meth:`claim`, prepared to be sent in one round trip with other calls (:func:`run_script_calls`).

        The token is resolved, validated and verified here, before any I/O.
        """
        checked = self._checked(token)
        keys = self._mark_keys(checked)
        args = _claim_args(checked)

        def check(reply: Any) -> None:
            if isinstance(reply, RedisError):
                _raise_for(reply, checked)

        return ScriptCall(self.client, self._claim_script, keys, args, check, lambda: self.claim(checked))

    def high_water(self, resource: str) -> int | None:
        """Return the resource's mark, or ``None`` if it was never claimed or written.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        validate_resource(resource)
        try:
            raw = self.client.get(self._mark_prefix + resource)
        except RedisError as exc:
            _unavailable(exc)
        return None if raw is None else decode_mark(raw)

    def mark(self, resource: str) -> Mark | None:
        """Return the resource's mark with its grantor, or ``None`` if it was never claimed or written.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        validate_resource(resource)
        try:
            raw, grantor = self.client.mget([self._mark_prefix + resource, self._grantor_prefix + resource])
        except RedisError as exc:
            _unavailable(exc)
        if raw is None:
            return None
        text = grantor.decode("utf-8", "replace") if isinstance(grantor, bytes) else grantor
        return Mark(resource, decode_mark(raw), text)

    def applied(self, resource: str, task_id: str) -> str | None:
        """Return the id of the execution of *task_id* that applied on *resource*, or ``None``.

        ``None`` when no execution of the task wrote through this gate with
        exactly-once, or the record expired.

        :raises InvalidTokenError: bad resource name.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        validate_resource(resource)
        try:
            raw = self.client.get(self._applied_key(resource, task_id))
        except RedisError as exc:
            _unavailable(exc)
        if raw is None:
            return None
        text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
        return text.split(":", 1)[1]  # "<token>:<execution id>"

    def reset_mark(self, token: FencingToken, *, expected: Mark | None) -> None:
        """Operator repair: set the mark to *token* (value and grantor), lower or not, if it is still *expected*.

        For ``celery-fencing rebase`` and ``repair`` only: it bypasses the
        ordering, in one script that first checks the mark and its grantor
        are what the operator read. The token is not verified.

        :raises StaleTokenError: the mark is no longer *expected* (nothing changed).
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        checked = resolve_token(token)
        args = [
            "" if expected is None else encode_mark(expected.value),
            "" if expected is None or expected.grantor is None else expected.grantor,
            encode_mark(checked.value),
            _grantor_arg(checked),
        ]
        self._run(self._reset_script, checked, self._mark_keys(checked), args)

    # Gated writes -------------------------------------------------------------

    def set(self, token: FencingToken | None, key: str, value: Any, *, ex: float | timedelta | None = None) -> None:
        """``SET key value [PX ex]`` if the token is not stale, binding *key* to the token's resource.

        Inside a fenced task with exactly-once on, the same script records the
        execution's task id on the resource (see :class:`RedisGate`).

        :param value: ``bytes``, ``str``, ``int`` or ``float``, as for ``redis.Redis.set``.
        :param ex: expiry, in seconds or as a ``timedelta`` (milliseconds resolution).
        :raises StaleTokenError: the token is below the mark (nothing changed).
        :raises AlreadyAppliedError: another execution of this task id applied on the resource (nothing changed).
        :raises ResourceMismatchError: *key* belongs to another resource (nothing changed).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        checked = self._checked(token)
        _check_key(key)
        record = applied_record(checked)
        args = [*self._fence_args(checked, record), value]
        if ex is not None:
            args.append(_expiry_ms(ex))
        keys = [*self._fence_keys(checked, record), self._owner_prefix + key, key]
        self._check_slots(checked, keys)
        self._run(self._set_script, checked, keys, args, record)

    def hset(self, token: FencingToken | None, key: str, mapping: Mapping[Any, Any]) -> None:
        """``HSET key field value ...`` for every item of *mapping*, if the token is not stale.

        Raises as :meth:`set` does; also ``ValueError`` for an empty mapping.
        A key holding another type fails with ``WRONGTYPE`` and changes nothing.
        """
        checked = self._checked(token)
        _check_key(key)
        if not isinstance(mapping, Mapping) or not mapping:
            raise InvalidArgumentError("hset needs a non-empty mapping")
        record = applied_record(checked)
        args = self._fence_args(checked, record)
        for field, value in mapping.items():
            args.append(field)
            args.append(value)
        keys = [*self._fence_keys(checked, record), self._owner_prefix + key, key]
        self._check_slots(checked, keys)
        self._run(self._hset_script, checked, keys, args, record)

    def delete(self, token: FencingToken | None, key: str) -> None:
        """``DEL key`` if the token is not stale. The key stays bound to its resource.

        Raises as :meth:`set` does.
        """
        checked = self._checked(token)
        _check_key(key)
        record = applied_record(checked)
        keys = [*self._fence_keys(checked, record), self._owner_prefix + key, key]
        self._check_slots(checked, keys)
        self._run(self._delete_script, checked, keys, self._fence_args(checked, record), record)

    def eval(
        self,
        token: FencingToken | None,
        script: str,
        keys: Sequence[str] = (),
        args: Sequence[Any] = (),
    ) -> Any:
        """Run the Lua *script* body if the token is not stale, and return its result.

        The body sees only its own ``KEYS`` (the *keys*) and ``ARGV`` (the
        *args*), and runs in the same script as the fence check, after it. The
        check binds every key to the token's resource. The mark, the owners
        and the applied record are advanced before the body runs: Redis does
        not roll back a script that fails half-way, so they must cover
        whatever the body wrote before an error. Write the body without a
        ``#!lua`` line.

        :raises StaleTokenError: the token is below the mark (the body did not run).
        :raises AlreadyAppliedError: another execution of this task id applied
            on the resource (the body did not run).
        :raises ResourceMismatchError: a key belongs to another resource (the body did not run).
        :raises InvalidTokenError: bad token, before any I/O.
        :raises GateUnavailableError: Redis failed, or the body raised an error
            (the ``ResponseError`` is chained).
        """
        checked = self._checked(token)
        if not isinstance(script, str) or not script.strip():
            raise InvalidArgumentError("eval needs a non-empty Lua body")
        key_list = list(keys)
        for key in key_list:
            _check_key(key)
        wrapped = self._bodies.get(script)
        if wrapped is None:
            if len(self._bodies) >= _MAX_CACHED_BODIES:
                self._bodies.clear()
            wrapped = self._bodies[script] = self.client.register_script(EVAL_SCRIPT_TEMPLATE % script)
        record = applied_record(checked)
        all_keys = self._fence_keys(checked, record)
        all_keys.extend(self._owner_prefix + key for key in key_list)
        all_keys.extend(key_list)
        self._check_slots(checked, all_keys)
        return self._run(wrapped, checked, all_keys, [*self._fence_args(checked, record), *args], record)

    # Reads --------------------------------------------------------------------

    def get(self, key: str) -> Any:
        """``GET key`` through the client. Not gated: claim first to fence a read-modify-write.

        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        _check_key(key)
        try:
            return self.client.get(key)
        except RedisError as exc:
            _unavailable(exc)

    # Internals ----------------------------------------------------------------

    def _check_slots(self, token: FencingToken, keys: list[str]) -> None:
        """In a cluster, refuse a key outside the resource's hash slot: a programming error, not an outage.

        Without this the cluster refuses the script (CROSSSLOT), which is no
        reason to retry; the error names both slots and the fix.
        """
        if not self._cluster:
            return
        from redis.crc import key_slot

        home = key_slot(keys[0].encode("utf-8"))
        for key in keys[1:]:
            slot = key_slot(key.encode("utf-8"))
            if slot != home:
                raise InvalidArgumentError(
                    f"key {key!r} hashes to slot {slot}, but the fence keys of resource {token.resource!r} are "
                    f"in slot {home}: in Redis Cluster put one hash tag in the resource and the same tag in "
                    "every data key of it (resource 'account:{42}', key 'account:{42}:balance')"
                )

    def _run(
        self, script: Any, token: FencingToken, keys: list[str], args: list[Any], record: AppliedRecord | None = None
    ) -> Any:
        # What Script.__call__ does, without its per-call tuple copies and
        # pipeline check: this path is the whole cost of a gated write above
        # the plain command, so it stays lean.
        try:
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # The server lost its script cache (SCRIPT FLUSH, restart, failover):
                # load the source again, once, and retry.
                script.sha = self.client.script_load(script.script)
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except DataError as exc:
            # A value redis-py cannot encode: the caller's bug, raised before any I/O.
            raise InvalidArgumentError(f"a value redis-py cannot send: {exc}") from exc
        except RedisError as exc:
            _raise_for(exc, token, record)

    def __repr__(self) -> str:
        return f"RedisGate({self.client!r}, prefix={self.prefix!r})"


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
        if reply is _UNSENT or isinstance(reply, (NoScriptError, RedisConnectionError, RedisTimeoutError)):
            call.fallback()
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


def _raise_for(exc: RedisError, token: FencingToken, record: AppliedRecord | None = None) -> NoReturn:
    """A script's refusal (an error reply starting ``FENCED``) as the gate's error; any other as unavailable."""
    refusal = parse_refusal(str(exc)) if isinstance(exc, ResponseError) else None
    if refusal is not None:
        _raise_fenced(*refusal, token, record)
    _unavailable(exc)


def _raise_fenced(kind: str, detail: str, token: FencingToken, record: AppliedRecord | None) -> NoReturn:
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
    raise GateUnavailableError(f"{detail} does not hold a {MARK_WIDTH}-digit mark", gate="RedisGate")


def _claim_args(token: FencingToken) -> list[Any]:
    return [encode_mark(token.value), _grantor_arg(token), fence_state_ttl_ms(token)]


def _is_cluster_client(client: Any) -> bool:
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return isinstance(client, RedisCluster)


def _grantor_arg(token: FencingToken) -> str:
    return "" if token.grantor is None else token.grantor


def _unavailable(exc: RedisError) -> NoReturn:
    raise GateUnavailableError(f"Redis gate failed: {type(exc).__name__}: {exc}", gate="RedisGate") from exc


def _check_key(key: object) -> None:
    if not isinstance(key, str):
        raise InvalidArgumentError(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidArgumentError("key must not be empty")


def _expiry_ms(ex: object) -> int:
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
    if not math.isfinite(seconds) or not 1 <= round(seconds * 1000) <= _MAX_EXPIRY_MS:
        raise InvalidArgumentError(f"ex must be a finite expiry of 1 ms to about 8,900 years, got {ex!r:.60}")
    return round(seconds * 1000)


_MAX_EXPIRY_MS = 2**48
