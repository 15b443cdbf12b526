"""A gate in Redis: the high-water mark lives beside the data, checked in the same Lua script.

The story it prevents::

    t=0   A holds token 33 for "account:{42}", reads the balance (100), pauses
    t=30  B gets token 34, writes 110 through the gate: the mark becomes 34
    t=41  A resumes and writes 105 with token 33: the script sees 33 < 34 and
          refuses; nothing changes, and A gets StaleTokenError(high_water=34)

Every write is one Lua script (``EVALSHA``, loaded again after ``NOSCRIPT``)
that checks the token and writes the data atomically. The scripts and their
one fence check live in :mod:`~celery_fencing.gates.redis_scripts`, the key
names and the mark encoding in :mod:`~celery_fencing.gates.redis_keys`, the
store's floor in :mod:`~celery_fencing.gates.redis_floor`, and the batching
of claims in :mod:`~celery_fencing.gates.redis_batch`. docs/gates.md gives the
key layout, the lifetimes and the cost.

The checks run in one order: floor, owner, grantor, applied, stale. Marks are
compared as equal-width digit strings, never as Lua numbers (doubles, exact
only below 2**53). A token of another grantor is refused with
:class:`~celery_fencing.GrantorMismatchError`; a mark without a grantor adopts
the grantor of the first token that passes it. Inside a fenced task with
exactly-once on, every gated write also records "task T applied on resource
R by execution E" in the same script; another execution of T is then refused
with :class:`~celery_fencing.AlreadyAppliedError`. A domain resource's fence
state is kept for good; a task-id resource's expires with the task's retention.

Persistence and the floor: a Redis without AOF forgets its marks on restart,
and so does a flushed one. Every script also reads the store's floor, which
goes with them: a store without it refuses every token until it is armed with
a token minted after the loss (from the gate's ``source``, or inside a fenced
task the worker's), so every token minted before is refused with
:class:`~celery_fencing.BelowFloorError`. A gate without a source raises
:class:`~celery_fencing.StoreUnarmedError` until it is armed
(``celery-fencing arm``, :meth:`RedisGate.arm`).

Redis Cluster: a script touches one hash slot; put one hash tag in the
resource and the same tag in every data key of it (``"account:{42}"``,
``"account:{42}:balance"``); the prefix must contain no braces. A key outside
the resource's slot is refused before any I/O.

Errors: bad input raises :class:`~celery_fencing.InvalidTokenError` (tokens)
or :class:`~celery_fencing.InvalidArgumentError` (keys, values, expiry) before
any I/O; every redis-py error becomes
:class:`~celery_fencing.GateUnavailableError` with the driver's exception
chained, after the client's own timeouts and retries (set
``socket_connect_timeout``, ``socket_timeout`` and ``retry``). redis-py also
retries a command whose reply was lost: ``set``/``hset``/``delete`` and
``claim`` are idempotent for one token, an ``eval`` body need not be.

Thread and fork safety: a gate is as safe as its client; redis-py clients are
thread-safe and reconnect after ``fork()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, NoReturn

from redis.exceptions import DataError, NoScriptError, RedisError, ResponseError

from ..context import AppliedRecord, applied_record, fence_state_ttl_ms, floor_source, resolve_token
from ..exceptions import (
    AlreadyAppliedError,
    BelowFloorError,
    FencingConfigurationError,
    GateUnavailableError,
    GrantorMismatchError,
    InvalidArgumentError,
    ResourceMismatchError,
    StaleTokenError,
    StoreUnarmedError,
)
from ..protocols import TokenSource, TokenVerifier
from ..token import FencingToken, Mark, validate_resource
from .redis_batch import ScriptCall, run_script_calls
from .redis_floor import (
    FLOOR_RESOURCE,
    arm_unarmed_store,
    decode_floor,
    encode_floor,
    is_unarmed_refusal,
    mint_floor,
)
from .redis_keys import (
    MARK_WIDTH,
    applied_key,
    decode_mark,
    encode_mark,
    grantor_key,
    hash_tag,
    mark_key,
    owner_key,
)
from .redis_scripts import (
    ARM_SCRIPT,
    CLAIM_SCRIPT,
    DELETE_SCRIPT,
    EVAL_SCRIPT_TEMPLATE,
    HSET_SCRIPT,
    RESET_SCRIPT,
    SET_SCRIPT,
    parse_refusal,
)

__all__ = [
    # The gate, and (re-exported from redis_keys, redis_floor and redis_batch) what its users read or batch.
    "FLOOR_RESOURCE",
    "MARK_WIDTH",
    "RedisGate",
    "ScriptCall",
    "applied_key",
    "decode_mark",
    "encode_mark",
    "grantor_key",
    "hash_tag",
    "mark_key",
    "owner_key",
    "run_script_calls",
]

# Bodies are wrapped and hashed once per gate; the cache is bounded so a caller
# generating bodies cannot grow it without limit.
_MAX_CACHED_BODIES = 256


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
    :param source: the token source the gate takes a floor from when it finds
        its store unarmed (new, or it lost its data). Without it, a fenced
        task's worker source is used, and elsewhere the gate raises
        :class:`~celery_fencing.StoreUnarmedError` until the store is armed.
    :raises FencingConfigurationError: for a bad prefix.

    Token ``None`` means the current token (:func:`~celery_fencing.current_token`).
    """

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "fencing",
        verifier: TokenVerifier | None = None,
        source: TokenSource | None = None,
    ) -> None:
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise FencingConfigurationError(f"RedisGate prefix must be a non-empty str without braces, not {prefix!r}")
        self.client = client
        self.prefix = prefix
        self.verifier = verifier
        self.source = source
        # A cluster client: every key of one script must hash to the resource's slot, checked before any I/O.
        self._cluster = _is_cluster_client(client)
        self._mark_prefix = f"{prefix}:mark:"
        self._grantor_prefix = f"{prefix}:grantor:"
        self._owner_prefix = f"{prefix}:owner:"
        self._applied_prefix = f"{prefix}:applied:"
        self._floor_key = f"{prefix}:floor"
        # Floor keys seen armed (ensure_armed): after that the scripts alone watch them.
        self._armed: set[str] = set()
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
        self._arm_script: Any = client.register_script(ARM_SCRIPT)
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

    def floor_key(self, resource: str) -> str:
        """Return the name of the key holding the floor that guards *resource*.

        One per store; in a cluster, one per hash tag (``<prefix>:floor:{<tag>}``),
        so that it lives in the resource's slot and is lost with its marks.
        """
        if self._cluster:
            tag = hash_tag(resource)
            if tag is not None:
                return f"{self._floor_key}:{{{tag}}}"
        return self._floor_key

    def _checked(self, token: FencingToken | None) -> FencingToken:
        return resolve_token(token, verifier=self.verifier)

    def _mark_keys(self, token: FencingToken) -> list[str]:
        return [self._mark_prefix + token.resource, self._grantor_prefix + token.resource]

    def _claim_keys(self, token: FencingToken) -> list[str]:
        return [*self._mark_keys(token), self.floor_key(token.resource)]

    def _fence_keys(self, token: FencingToken, record: AppliedRecord | None) -> list[str]:
        """KEYS[1..4] of a write script: mark, grantor, applied-record and floor keys."""
        # Without a record the script reads the applied key's slot but never writes it:
        # the name still carries the resource, so it hashes to the resource's slot.
        task_id = record.task_id if record is not None else ""
        return [
            self._mark_prefix + token.resource,
            self._grantor_prefix + token.resource,
            self._applied_key(token.resource, task_id),
            self.floor_key(token.resource),
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
        keys = self._claim_keys(checked)
        self._check_slots(checked, keys)
        self._run(self._claim_script, checked, keys, _claim_args(checked))

    def claim_call(self, token: FencingToken | None = None) -> ScriptCall:
        """:meth:`claim`, prepared to be sent in one round trip with other calls (:func:`run_script_calls`).

        The token is resolved, validated and verified here, before any I/O.
        """
        checked = self._checked(token)
        keys = self._claim_keys(checked)
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
                return self._evalsha(script, keys, args)
            except ResponseError as exc:
                if not is_unarmed_refusal(exc):
                    raise
            # The store holds no floor: arm it, then run the call once more. Its token,
            # minted before the floor, is then refused as below it, unless the
            # store was armed meanwhile by someone whose floor is lower.
            self._arm_unarmed(token)
            return self._evalsha(script, keys, args)
        except DataError as exc:
            # A value redis-py cannot encode: the caller's bug, raised before any I/O.
            raise InvalidArgumentError(f"a value redis-py cannot send: {exc}") from exc
        except RedisError as exc:
            _raise_for(exc, token, record)

    def _evalsha(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            # The server lost its script cache (SCRIPT FLUSH, restart, failover):
            # load the source again, once, and retry.
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)

    def _arm_unarmed(self, token: FencingToken) -> None:
        """Arm the store of *token*'s resource with a floor minted now, from the gate's or the task's source."""
        source = self.source if self.source is not None else floor_source()
        try:
            arm_unarmed_store(self._arm_script, self.floor_key(token.resource), source, "RedisGate")
        except RedisError as exc:
            _unavailable(exc)

    def arm(self, floor: int | FencingToken | None = None, *, resource: str = FLOOR_RESOURCE) -> int:
        """Set the store's floor, unless it holds a higher one; return the floor in force.

        Every token below the floor is refused from then on. Without *floor*,
        a token minted now from the gate's ``source`` is the floor: do this
        before minting for a new store, and after a store lost its data. An
        explicit 0 says the store is new and refuses nothing; a token (minted
        by the workers' source) bounds its grantor's tokens. In a cluster the
        floor is per hash tag: *resource* names the tag.

        :raises InvalidArgumentError: *floor* is not an int in 0 .. 2**63 - 1.
        :raises FencingConfigurationError: no *floor*, and the gate has no source.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        if floor is None:
            if self.source is None:
                raise FencingConfigurationError("RedisGate.arm() without a floor needs the gate's source=")
            floor = mint_floor(self.source)
        stored = encode_floor(floor)
        validate_resource(resource)
        return self._arm(resource, stored, only_if_unarmed=False)

    def ensure_armed(self, resource: str, source: TokenSource | None = None) -> None:
        """Arm the store of *resource* from *source* (else the gate's) if it has no floor; once per floor key.

        A fenced task calls this before it mints, so its token is above a
        floor set now. Later losses are the scripts' to find.

        :raises StoreUnarmedError: the store is unarmed and there is no source.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        key = self.floor_key(resource)
        if key in self._armed:
            return
        try:
            if not self.client.exists(key):
                arm_unarmed_store(self._arm_script, key, source or self.source, "RedisGate")
        except RedisError as exc:
            _unavailable(exc)
        if len(self._armed) >= _MAX_CACHED_BODIES:
            self._armed.clear()
        self._armed.add(key)

    def floor(self, resource: str = FLOOR_RESOURCE) -> int | None:
        """Return the store's floor (of *resource*'s hash tag in a cluster), or ``None`` when it is unarmed.

        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        validate_resource(resource)
        try:
            raw = self.client.get(self.floor_key(resource))
        except RedisError as exc:
            _unavailable(exc)
        return None if raw is None else decode_floor(raw)

    def _arm(self, resource: str, stored: str, *, only_if_unarmed: bool) -> int:
        try:
            raw = self._arm_script(keys=[self.floor_key(resource)], args=[stored, int(only_if_unarmed)])
        except RedisError as exc:
            _unavailable(exc)
        return decode_floor(raw)

    def __repr__(self) -> str:
        return f"RedisGate({self.client!r}, prefix={self.prefix!r})"


def _raise_for(exc: RedisError, token: FencingToken, record: AppliedRecord | None = None) -> NoReturn:
    """A script's refusal (an error reply starting ``FENCED``) as the gate's error; any other as unavailable."""
    refusal = parse_refusal(str(exc)) if isinstance(exc, ResponseError) else None
    if refusal is not None:
        _raise_fenced(*refusal, token, record)
    _unavailable(exc)


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
