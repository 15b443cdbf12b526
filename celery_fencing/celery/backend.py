"""``fenced+redis://``: Celery's Redis result backend with a fencing check on every result write.

Configure with ``result_backend = "fenced+redis://127.0.0.1:6379/0"`` (or
``fenced+rediss://`` for TLS). Celery finds this class through the
``celery.result_backends`` entry point named ``fenced``.

Beside each result key ``celery-task-meta-<id>`` it keeps a hash
``celery-task-fence-<id>`` with the highest token that wrote or claimed the
result (``mark``, a 20-digit decimal string compared exactly as a string,
never as a Lua number), the token's ``resource`` and ``grantor`` id, and the
last ``state``. A token of another grantor than the mark's (a wiped
ZooKeeper) is treated like a stale one: its claim raises
:class:`~celery_fencing.GrantorMismatchError`, its result write is dropped.
Writing the result, the hash and the pub/sub notification is one Lua script:

* A write carrying a token below the mark is **dropped**, logged and signalled
  (``result_dropped``), never raised: an exception inside the backend would
  kill a solo worker or make the prefork parent write FAILURE with no check.
* A write carrying no token (the worker parent's WorkerLost, time-limit or
  revoke writes; ``update_state`` outside a fenced task) never overwrites a
  final result written with a token, nor any SUCCESS.
* Writes publish on the result key like the plain Redis backend, so
  ``AsyncResult.get()`` wakes up as before.

A fenced task claims its result's mark when it starts (``claim_result``), so
an older execution that resumes later cannot land its result over the newer
execution's, even before the newer one has written anything.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend

from ..exceptions import GrantorMismatchError, StaleTokenError
from ..gates.redis import ScriptCall
from ..token import FencingToken, fixed_width
from . import signals

__all__ = ["FencedRedisBackend"]

logger = logging.getLogger("celery_fencing")

# Write a task result under the fence.
# KEYS[1] result key, KEYS[2] fence hash
# ARGV[1] encoded meta, ARGV[2] token as 20 digits or "" for none, ARGV[3] resource or "",
# ARGV[4] state, ARGV[5] "1" when the state is final, ARGV[6] expiry in seconds ("0": none),
# ARGV[7] grantor id of the token or ""
# returns {1} written; {0, reason, mark} dropped
WRITE_RESULT = """
local fence = redis.call('HMGET', KEYS[2], 'mark', 'resource', 'final', 'state', 'grantor')
local mark, owner, final, state, grantor = fence[1], fence[2], fence[3], fence[4], fence[5]
if ARGV[2] == '' then
  if mark and final == '1' then return {0, 'tokenless write over a final result written with a token', mark} end
  if state == 'SUCCESS' then return {0, 'tokenless write over SUCCESS', mark or ''} end
else
  if owner and owner ~= ARGV[3] then
    return {0, 'token of resource ' .. ARGV[3] .. ' for a result of ' .. owner, mark}
  end
  if grantor and ARGV[7] ~= '' and grantor ~= ARGV[7] then
    return {0, 'token of grantor ' .. ARGV[7] .. ' for a result fenced by grantor ' .. grantor, mark or ''}
  end
  if mark and ARGV[2] < mark then return {0, 'stale token', mark} end
  redis.call('HSET', KEYS[2], 'mark', ARGV[2], 'resource', ARGV[3])
  if ARGV[7] ~= '' and not grantor then redis.call('HSET', KEYS[2], 'grantor', ARGV[7]) end
end
redis.call('HSET', KEYS[2], 'state', ARGV[4], 'final', ARGV[5])
local ttl = tonumber(ARGV[6])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return {1}
"""

# Raise a result's mark when a fenced execution starts.
# KEYS[1] fence hash; ARGV[1] token as 20 digits, ARGV[2] resource, ARGV[3] expiry seconds ("0": none),
# ARGV[4] grantor id of the token or ""
# returns {1} claimed; {0, reason, mark} refused; {0, reason, mark, grantor} refused for another grantor
CLAIM_RESULT = """
local fence = redis.call('HMGET', KEYS[1], 'mark', 'resource', 'grantor')
local mark, owner, grantor = fence[1], fence[2], fence[3]
if owner and owner ~= ARGV[2] then
  return {0, 'token of resource ' .. ARGV[2] .. ' for a result of ' .. owner, mark}
end
if grantor and ARGV[4] ~= '' and grantor ~= ARGV[4] then
  return {0, 'token of grantor ' .. ARGV[4] .. ' for a result fenced by grantor ' .. grantor, mark or '', grantor}
end
if mark and ARGV[1] < mark then return {0, 'stale token', mark} end
redis.call('HSET', KEYS[1], 'mark', ARGV[1], 'resource', ARGV[2])
if ARGV[4] ~= '' and not grantor then redis.call('HSET', KEYS[1], 'grantor', ARGV[4]) end
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return {1}
"""


def bytes_to_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _token_of(request: Any) -> FencingToken | None:
    token = getattr(request, "fencing_token", None) if request is not None else None
    return token if isinstance(token, FencingToken) else None


class FencedRedisBackend(RedisBackend):  # type: ignore[misc]
    """Redis result backend whose writes are checked against the task's fencing token."""

    fence_keyprefix = "celery-task-fence-"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scripts: tuple[int, Any, Any] | None = None

    def _registered(self) -> tuple[Any, Any]:
        # register_script binds to a client; the backend's client is rebuilt per
        # process (it is a cached property), so bind lazily and rebind on change.
        client = self.client
        if self._scripts is None or self._scripts[0] != id(client):
            self._scripts = (id(client), client.register_script(WRITE_RESULT), client.register_script(CLAIM_RESULT))
        return self._scripts[1], self._scripts[2]

    def _add_global_keyprefix(self) -> None:
        # Celery prefixes its own key kinds with result_backend_transport_options'
        # global_keyprefix; the fence hash must live under the same prefix.
        super()._add_global_keyprefix()
        global_keyprefix = self.app.conf.get("result_backend_transport_options", {}).get("global_keyprefix")
        if global_keyprefix:
            if global_keyprefix[-1] not in ":_-.":
                global_keyprefix += "_"
            self.fence_keyprefix = f"{global_keyprefix}{self.fence_keyprefix}"

    def get_key_for_fence(self, task_id: str) -> str:
        """The fence hash's key: beside the result key, under the same global prefix."""
        return f"{bytes_to_str(self.fence_keyprefix)}{bytes_to_str(task_id)}"

    def _expiry(self, state: str) -> int:
        expires = self.failure_expires if state == states.FAILURE else self.expires
        return int(expires or 0)

    def claim_result(self, task_id: str, token: FencingToken) -> None:
        """Raise the result's mark to *token* at the start of a fenced execution.

        :raises StaleTokenError: a newer execution of this task already claimed or wrote.
        :raises GrantorMismatchError: the result is fenced by another grantor's token.
        """
        _, claim = self._registered()
        reply = self.ensure(claim, ([self.get_key_for_fence(task_id)], self._claim_args(token)))
        self._check_claim(reply, task_id, token)

    def claim_result_call(self, task_id: str, token: FencingToken) -> ScriptCall:
        """:meth:`claim_result`, prepared to share a round trip with a gate's claim on the same Redis.

        A fenced task sends it with its gates' claims (:func:`~celery_fencing.gates.redis.run_script_calls`);
        when the batch gives no usable reply, :meth:`claim_result` runs instead, with Celery's retries.
        """
        _, claim = self._registered()

        def check(reply: Any) -> None:
            if isinstance(reply, Exception):
                # A command error the unbatched call would have raised: let it raise it.
                self.claim_result(task_id, token)
            else:
                self._check_claim(reply, task_id, token)

        return ScriptCall(
            self.client,
            claim,
            [self.get_key_for_fence(task_id)],
            self._claim_args(token),
            check,
            lambda: self.claim_result(task_id, token),
        )

    def _claim_args(self, token: FencingToken) -> list[Any]:
        return [fixed_width(token.value), token.resource, self._expiry(""), token.grantor or ""]

    def _check_claim(self, reply: Any, task_id: str, token: FencingToken) -> None:
        if int(reply[0]) != 1:
            if len(reply) > 3:
                raise GrantorMismatchError(
                    f"result of task {task_id}: {bytes_to_str(reply[1])}",
                    resource=token.resource,
                    token_grantor=token.grantor,
                    expected_grantor=bytes_to_str(reply[3]),
                )
            mark = bytes_to_str(reply[2]) if len(reply) > 2 and reply[2] else None
            raise StaleTokenError(
                f"result of task {task_id} is fenced by a newer execution ({bytes_to_str(reply[1])})",
                resource=token.resource,
                token=token.value,
                high_water=int(mark) if mark else None,
            )

    def _store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        encoded = self.encode(meta)
        token = _token_of(request)
        write, _ = self._registered()
        keys = [self.get_key_for_task(task_id), self.get_key_for_fence(task_id)]
        args = [
            encoded,
            fixed_width(token.value) if token else "",
            token.resource if token else "",
            state,
            "1" if state in states.READY_STATES else "0",
            self._expiry(state),
            (token.grantor or "") if token else "",
        ]
        reply = self.ensure(write, (keys, args))
        if int(reply[0]) != 1:
            reason = bytes_to_str(reply[1])
            mark_text = bytes_to_str(reply[2]) if len(reply) > 2 and reply[2] else ""
            high_water = int(mark_text) if mark_text else None
            logger.warning(
                "dropped %s result of task %s: %s (token %s, high-water mark %s)",
                state,
                bytes_to_str(task_id),
                reason,
                token.value if token else None,
                high_water,
            )
            signals.result_dropped.send(
                sender=self,
                task_id=bytes_to_str(task_id),
                state=state,
                token=token,
                high_water=high_water,
                reason=reason,
            )
        return result
