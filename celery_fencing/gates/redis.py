"""A gate in Redis: the high-water mark lives beside the data, checked in the same Lua script.

The story it prevents: A holds token 33 for ``"account:{42}"``, reads, pauses;
B gets 34 and writes through the gate (the mark becomes 34); A resumes and
writes with 33: the script refuses, nothing changes, A gets
``StaleTokenError(high_water=34)``. Every write is one ``EVALSHA`` that checks
the token and writes the data atomically; the checks run in one order: floor,
owner, grantor, applied, stale. The scripts live in ``redis_scripts``, key
names, mark encoding and argument checks in ``redis_keys``, the store's floor
in ``redis_floor``, the meaning of refusals in ``redis_refusals``, the
batching of claims in ``redis_batch``. docs/gates.md gives the key layout,
the lifetimes, the floor, Redis Cluster (one hash tag per resource and its
keys), persistence and the cost.

Errors: bad input raises :class:`~celery_fencing.InvalidTokenError` or
:class:`~celery_fencing.InvalidArgumentError` before any I/O; every redis-py
error becomes :class:`~celery_fencing.GateUnavailableError` (chained), after
the client's own timeouts and retries. ``set``/``hset``/``delete``/``claim``
are idempotent for one token (redis-py retries a command whose reply was
lost); an ``eval`` body need not be. A gate is as thread- and fork-safe as its
client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from redis.exceptions import DataError, NoScriptError, RedisError, ResponseError

from ..context import AppliedRecord, applied_record, fence_state_ttl_ms, floor_source, resolve_token
from ..exceptions import FencingConfigurationError, InvalidArgumentError
from ..protocols import TokenSource, TokenVerifier
from ..token import FencingToken, Mark, validate_resource
from .redis_batch import ScriptCall, run_script_calls
from .redis_floor import FLOOR_RESOURCE, StoreFloors, is_unarmed_refusal
from .redis_keys import (
    MARK_WIDTH,
    applied_key,
    check_key,
    claim_args,
    decode_mark,
    encode_mark,
    expiry_ms,
    grantor_arg,
    grantor_key,
    hash_tag,
    mark_key,
    owner_key,
)
from .redis_refusals import raise_for, raise_unavailable
from .redis_scripts import (
    CLAIM_SCRIPT,
    DELETE_SCRIPT,
    EVAL_SCRIPT_TEMPLATE,
    HSET_SCRIPT,
    RESET_SCRIPT,
    SET_SCRIPT,
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
        self._floors = StoreFloors(
            client, f"{prefix}:floor", per_tag=self._cluster, store="RedisGate", unavailable=raise_unavailable
        )
        # Outside a cluster the floor key is one per store: the hot path reads it, not a method.
        self._store_floor_key: str | None = None if self._cluster else self._floors.base_key
        # register_script only hashes the source (no I/O), once per gate; _evalsha loads it again
        # after a NOSCRIPT. Typed Any: the stubs (types-redis) lack Script's ``sha`` and ``script``.
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

    def floor_key(self, resource: str) -> str:
        """Return the name of the key holding the floor that guards *resource*.

        One per store; in a cluster, one per hash tag (``<prefix>:floor:{<tag>}``),
        so that it lives in the resource's slot and is lost with its marks.
        """
        return self._floors.key(resource)

    def _checked(self, token: FencingToken | None) -> FencingToken:
        return resolve_token(token, verifier=self.verifier)

    def _mark_keys(self, token: FencingToken) -> list[str]:
        return [self._mark_prefix + token.resource, self._grantor_prefix + token.resource]

    def _claim_keys(self, token: FencingToken) -> list[str]:
        return [*self._mark_keys(token), self._store_floor_key or self._floors.key(token.resource)]

    def _fence_keys(self, token: FencingToken, record: AppliedRecord | None) -> list[str]:
        """KEYS[1..4] of a write script: mark, grantor, applied-record and floor keys."""
        # Without a record the script reads the applied key's slot but never writes it:
        # the name still carries the resource, so it hashes to the resource's slot.
        task_id = record.task_id if record is not None else ""
        return [
            self._mark_prefix + token.resource,
            self._grantor_prefix + token.resource,
            self._applied_key(token.resource, task_id),
            self._store_floor_key or self._floors.key(token.resource),
        ]

    def _applied_key(self, resource: str, task_id: str) -> str:
        return f"{self._applied_prefix}{resource}:{task_id}"

    @staticmethod
    def _fence_args(token: FencingToken, record: AppliedRecord | None) -> list[Any]:
        """ARGV[1..6] of a write script: token, resource, grantor, execution id, record retention, state ttl."""
        execution, retention = ("", 0) if record is None else (record.execution_id, record.retention_ms)
        args = [encode_mark(token.value), token.resource, grantor_arg(token), execution, retention]
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
        self._run(self._claim_script, checked, keys, claim_args(checked))

    def claim_call(self, token: FencingToken | None = None) -> ScriptCall:
        """:meth:`claim`, prepared to be sent in one round trip with other calls (:func:`run_script_calls`).

        The token is resolved, validated and verified here, before any I/O.
        """
        checked = self._checked(token)
        keys = self._claim_keys(checked)
        args = claim_args(checked)

        def check(reply: Any) -> None:
            if isinstance(reply, RedisError):
                raise_for(reply, checked)

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
            raise_unavailable(exc)
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
            raise_unavailable(exc)
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
            raise_unavailable(exc)
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
            grantor_arg(checked),
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
        check_key(key)
        record = applied_record(checked)
        args = [*self._fence_args(checked, record), value]
        if ex is not None:
            args.append(expiry_ms(ex))
        keys = [*self._fence_keys(checked, record), self._owner_prefix + key, key]
        self._check_slots(checked, keys)
        self._run(self._set_script, checked, keys, args, record)

    def hset(self, token: FencingToken | None, key: str, mapping: Mapping[Any, Any]) -> None:
        """``HSET key field value ...`` for every item of *mapping*, if the token is not stale.

        Raises as :meth:`set` does; also ``ValueError`` for an empty mapping.
        A key holding another type fails with ``WRONGTYPE`` and changes nothing.
        """
        checked = self._checked(token)
        check_key(key)
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
        check_key(key)
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

        The body sees only its own ``KEYS`` (*keys*) and ``ARGV`` (*args*) and
        runs after the fence check, in the same script, which binds every key to
        the token's resource. Mark, owners and record are advanced before the
        body: Redis does not undo a script that fails half-way. No ``#!lua`` line.

        Raises as :meth:`set` does (the body has not run when refused); also
        :class:`~celery_fencing.GateUnavailableError` when the body raised (chained).
        """
        checked = self._checked(token)
        if not isinstance(script, str) or not script.strip():
            raise InvalidArgumentError("eval needs a non-empty Lua body")
        key_list = list(keys)
        for key in key_list:
            check_key(key)
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
        check_key(key)
        try:
            return self.client.get(key)
        except RedisError as exc:
            raise_unavailable(exc)

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
            self._floors.arm_unarmed(token.resource, self.source if self.source is not None else floor_source())
            return self._evalsha(script, keys, args)
        except DataError as exc:
            # A value redis-py cannot encode: the caller's bug, raised before any I/O.
            raise InvalidArgumentError(f"a value redis-py cannot send: {exc}") from exc
        except RedisError as exc:
            raise_for(exc, token, record)

    def _evalsha(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            # The server lost its script cache (SCRIPT FLUSH, restart, failover):
            # load the source again, once, and retry.
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)

    # The floor (see redis_floor) -------------------------------------------------

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
        return self._floors.arm(resource, floor, self.source)

    def ensure_armed(self, resource: str, source: TokenSource | None = None) -> int | None:
        """Arm the store of *resource* from *source* (else the gate's) if it has no floor; once per floor key.

        A fenced task calls this before it mints, so its token is above a
        floor set now. Later losses are the scripts' to find. Returns the
        floor in force, or ``None`` when the key was already known armed.

        :raises StoreUnarmedError: the store is unarmed and there is no source.
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        return self._floors.ensure(resource, source or self.source)

    def floor(self, resource: str = FLOOR_RESOURCE) -> int | None:
        """Return the store's floor (of *resource*'s hash tag in a cluster), or ``None`` when it is unarmed.

        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        return self._floors.read(resource)

    def __repr__(self) -> str:
        return f"RedisGate({self.client!r}, prefix={self.prefix!r})"


def _is_cluster_client(client: Any) -> bool:
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return isinstance(client, RedisCluster)
