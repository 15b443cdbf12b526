"""Idempotency keys in Redis: one hash per key, claimed and recorded by Lua scripts.

Layout, for a store with ``prefix="fencing:once"``::

    fencing:once:<key>   hash  state    "pending" | "done"
                               claim    random id of the claim that holds it
                               at       when it was claimed, ms of Redis's clock (TIME)
                               outcome  the outcome as JSON text (when done)

The hash expires with the key's *retention* (``PEXPIRE``), set again when the
outcome is recorded. Ages come from Redis's ``TIME`` inside the scripts, so
the workers' clocks play no part.

Two ways to use it:

* Around an effect Redis cannot see (an HTTP API): :func:`~celery_fencing.idempotency.run_once`
  / :func:`~celery_fencing.idempotency.idempotent` claim, call, record; see
  :mod:`celery_fencing.idempotency` for what a crash in between means.
* Around an effect *in this Redis* (append to a list or stream, ``INCRBY``):
  :meth:`RedisIdempotencyStore.eval_once` runs your Lua body and records the
  key and its return value in the same script: exactly once, as long as the
  data survives (a Redis without persistence forgets keys and data together).

Redis Cluster: a script touches one hash slot. Give the key and every data
key of :meth:`~RedisIdempotencyStore.eval_once` the same hash tag
(``"{order:7}:ship"`` with data key ``"{order:7}:events"``); the prefix must
contain no braces.

Errors: every redis-py error becomes :class:`~celery_fencing.GateUnavailableError`
with the driver's exception chained; bad input raises
:class:`~celery_fencing.FencingConfigurationError` before any I/O. Thread and
fork safety: as the client's (redis-py clients are both).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

from redis.exceptions import NoScriptError, RedisError

from ..exceptions import EffectPendingError, FencingConfigurationError, GateUnavailableError
from .core import DEFAULT_RETENTION, Claim, validate_key

__all__ = ["CLAIM_SCRIPT", "EVAL_ONCE_TEMPLATE", "FORGET_SCRIPT", "RECORD_SCRIPT", "RedisIdempotencyStore"]

_NOW = """\
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

CLAIM_SCRIPT = (
    """\
-- Claim an idempotency key, or report its outcome.
-- KEYS[1] the key's hash
-- ARGV[1] claim id (random), ARGV[2] retention in ms,
-- ARGV[3] reclaim-after in ms, or "" to never take over a pending claim
-- returns {"done", outcome} | {"pending", age in ms} | {"claimed"}
"""
    + _NOW
    + """\
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then return {'done', redis.call('HGET', KEYS[1], 'outcome')} end
if state == 'pending' then
  local age = now - tonumber(redis.call('HGET', KEYS[1], 'at'))
  if ARGV[3] == '' or age < tonumber(ARGV[3]) then return {'pending', tostring(age)} end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'pending', 'claim', ARGV[1], 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'claimed'}
"""
)

RECORD_SCRIPT = """\
-- Record the outcome of a claim this caller still holds.
-- KEYS[1] the key's hash
-- ARGV[1] claim id, ARGV[2] outcome (JSON text), ARGV[3] retention in ms
-- returns 1 when recorded; 0 when the claim is gone or someone else's (nothing written)
if redis.call('HGET', KEYS[1], 'claim') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'state') ~= 'pending' then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'done', 'outcome', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

FORGET_SCRIPT = """\
-- Drop a pending claim this caller holds.
-- KEYS[1] the key's hash
-- ARGV[1] claim id
-- returns 1 when dropped, 0 otherwise
if redis.call('HGET', KEYS[1], 'claim') == ARGV[1] and redis.call('HGET', KEYS[1], 'state') == 'pending' then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

EVAL_ONCE_TEMPLATE = (
    """\
-- Run the caller's Lua body once per key, and record its return value in the same script.
-- KEYS[1] the key's hash
-- KEYS[2 ..] the caller's data keys (the body sees them as KEYS[1 ..])
-- ARGV[1] claim id (random), ARGV[2] retention in ms
-- ARGV[3 ..] the caller's arguments (the body sees them as ARGV[1 ..])
-- returns {"done", outcome} when an earlier run recorded one (the body does not run),
--   {"pending", age in ms} when run_once claimed the key and recorded nothing,
--   {"ran", outcome} after running the body; outcome is the body's return value as JSON
"""
    + _NOW
    + """\
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then return {'done', redis.call('HGET', KEYS[1], 'outcome')} end
if state == 'pending' then return {'pending', tostring(now - tonumber(redis.call('HGET', KEYS[1], 'at')))} end
local data_keys, data_args = {}, {}
for i = 2, #KEYS do data_keys[i - 1] = KEYS[i] end
for i = 3, #ARGV do data_args[i - 2] = ARGV[i] end
local function body(KEYS, ARGV)
%s
end
local outcome = cjson.encode(body(data_keys, data_args))
redis.call('HSET', KEYS[1], 'state', 'done', 'claim', ARGV[1], 'at', now, 'outcome', outcome)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'ran', outcome}
"""
)

_MAX_CACHED_BODIES = 256


class RedisIdempotencyStore:
    """Idempotency keys in Redis (see the module docstring for the layout and guarantees).

    :param client: a ``redis.Redis`` (or ``RedisCluster``) client, with or without ``decode_responses``.
    :param prefix: namespace of the key hashes; no braces (they would capture the hash tag).
    :raises FencingConfigurationError: for a bad prefix.
    """

    def __init__(self, client: Any, *, prefix: str = "fencing:once") -> None:
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise FencingConfigurationError(f"prefix must be a non-empty str without braces, not {prefix!r}")
        self.client = client
        self.prefix = prefix
        # redis.commands.core.Script objects: EVALSHA, loaded again after NOSCRIPT.
        self._claim: Any = client.register_script(CLAIM_SCRIPT)
        self._record: Any = client.register_script(RECORD_SCRIPT)
        self._forget: Any = client.register_script(FORGET_SCRIPT)
        self._bodies: dict[str, Any] = {}

    def key_name(self, key: str) -> str:
        """The Redis key holding *key*'s record."""
        return f"{self.prefix}:{key}"

    # IdempotencyStore ---------------------------------------------------------

    def claim(self, key: str, *, retention: float, reclaim_after: float | None) -> Claim:
        """Claim *key* for *retention* seconds, or return its recorded outcome (one script).

        :raises EffectPendingError: a claim without an outcome stands (younger than *reclaim_after*).
        :raises GateUnavailableError: Redis failed or could not be reached.
        """
        validate_key(key)
        claim_id = uuid.uuid4().hex
        reclaim = "" if reclaim_after is None else _ms(reclaim_after)
        reply = self._run(self._claim, [self.key_name(key)], [claim_id, _ms(retention), reclaim])
        return _claim_from(key, claim_id, reply)

    def record(self, claim: Claim, outcome: str, *, retention: float) -> bool:
        """Record the outcome of a claim this caller still holds; ``False`` if it is no longer its own."""
        reply = self._run(self._record, [self.key_name(claim.key)], [claim.claim_id, outcome, _ms(retention)])
        return int(reply) == 1

    def forget(self, claim: Claim) -> None:
        """Drop a pending claim this caller holds (its call had no effect)."""
        self._run(self._forget, [self.key_name(claim.key)], [claim.claim_id])

    # Effects inside Redis -----------------------------------------------------

    def eval_once(
        self,
        key: str,
        body: str,
        keys: Sequence[str] = (),
        args: Sequence[Any] = (),
        *,
        retention: float = DEFAULT_RETENTION,
    ) -> Any:
        """Run the Lua *body* once per *key*, recording its return value in the same script; return it.

        A repeat returns the first run's value (decoded from JSON; the first
        run returns the same) without running the body. The body sees only
        its own ``KEYS`` and ``ARGV``. Redis does not roll back a script that
        fails half-way: a body that raises after writing leaves those writes
        and records no key, so validate before writing.

        :raises EffectPendingError: :func:`run_once` claimed this key and recorded nothing.
        :raises GateUnavailableError: Redis failed, or the body raised (chained).
        :raises FencingConfigurationError: bad key, body or retention, before any I/O.
        """
        validate_key(key)
        if not isinstance(body, str) or not body.strip():
            raise FencingConfigurationError("eval_once needs a non-empty Lua body")
        script = self._bodies.get(body)
        if script is None:
            if len(self._bodies) >= _MAX_CACHED_BODIES:
                self._bodies.clear()
            script = self._bodies[body] = self.client.register_script(EVAL_ONCE_TEMPLATE % body)
        reply = self._run(script, [self.key_name(key), *keys], [uuid.uuid4().hex, _ms(retention), *args])
        kind = _text(reply[0])
        if kind == "pending":
            raise EffectPendingError(key=key, age=int(_text(reply[1])) / 1000)
        return json.loads(_text(reply[1]))

    # Internals ----------------------------------------------------------------

    def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                script.sha = self.client.script_load(script.script)
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except RedisError as exc:
            _unavailable(exc)

    def __repr__(self) -> str:
        return f"RedisIdempotencyStore({self.client!r}, prefix={self.prefix!r})"


def _claim_from(key: str, claim_id: str, reply: Any) -> Claim:
    kind = _text(reply[0])
    if kind == "done":
        return Claim(key, claim_id, done=True, outcome=_text(reply[1]))
    if kind == "pending":
        raise EffectPendingError(key=key, age=int(_text(reply[1])) / 1000)
    return Claim(key, claim_id)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms(seconds: float) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise FencingConfigurationError(f"durations must be positive numbers of seconds, not {seconds!r}")
    return max(1, round(seconds * 1000))


def _unavailable(exc: RedisError) -> NoReturn:
    raise GateUnavailableError(
        f"Redis idempotency store failed: {type(exc).__name__}: {exc}", gate="RedisIdempotencyStore"
    ) from exc
