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
import math
from typing import Any

from celery import states
from celery.backends.redis import RedisBackend
from redis.exceptions import ResponseError

from ..context import Execution, floor_source
from ..exceptions import BelowFloorError, FencingError, GateUnavailableError
from ..gates.redis_batch import ScriptCall
from ..gates.redis_floor import arm_unarmed_store, encode_floor, found_floor, is_unarmed_refusal, raise_floor
from ..gates.redis_scripts import (
    ARM_SCRIPT,
    CLAIM_RESULT_SCRIPT,
    RESULT_FLOOR_KEY,
    SEAL_RESULT_SCRIPT,
    WRITE_RESULT_SCRIPT,
    parse_refusal,
)
from ..protocols import TokenSource
from ..token import FencingToken, fixed_width
from .claims import remint_unclaimed, skip_block_below_floor
from .result_refusals import execution_of, refusal_error, report_refused_write, token_of
from .settings import read_settings

__all__ = ["FencedRedisBackend"]

logger = logging.getLogger("celery_fencing")


def bytes_to_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class FencedRedisBackend(RedisBackend):  # type: ignore[misc]
    """Redis result backend whose writes are checked against the task's fencing token."""

    fence_keyprefix = "celery-task-fence-"
    #: The floor of the backend's store (see :mod:`celery_fencing.gates.redis_scripts`).
    floor_key = RESULT_FLOOR_KEY

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scripts: tuple[int, Any, Any, Any, Any] | None = None
        self._armed_client: int | None = None  # id() of the client whose store was seen armed

    def _registered(self) -> tuple[Any, Any, Any]:
        """The write, claim and seal scripts, bound to the current client."""
        # register_script binds to a client; the backend's client is rebuilt per
        # process (it is a cached property), so bind lazily and rebind on change.
        client = self.client
        if self._scripts is None or self._scripts[0] != id(client):
            self._scripts = (
                id(client),
                client.register_script(WRITE_RESULT_SCRIPT),
                client.register_script(CLAIM_RESULT_SCRIPT),
                client.register_script(SEAL_RESULT_SCRIPT),
                client.register_script(ARM_SCRIPT),
            )
        return self._scripts[1], self._scripts[2], self._scripts[3]

    def _add_global_keyprefix(self) -> None:
        # Celery prefixes its own key kinds with result_backend_transport_options'
        # global_keyprefix; the fence hash must live under the same prefix.
        super()._add_global_keyprefix()
        global_keyprefix = self.app.conf.get("result_backend_transport_options", {}).get("global_keyprefix")
        if global_keyprefix:
            if global_keyprefix[-1] not in ":_-.":
                global_keyprefix += "_"
            self.fence_keyprefix = f"{global_keyprefix}{self.fence_keyprefix}"
            self.floor_key = f"{global_keyprefix}{self.floor_key}"

    def get_key_for_fence(self, task_id: str) -> str:
        """The fence hash's key: beside the result key, under the same global prefix."""
        return f"{bytes_to_str(self.fence_keyprefix)}{bytes_to_str(task_id)}"

    def _forget(self, task_id: str) -> None:
        """``AsyncResult.forget()``: the fence hash goes with the result, so the id can be stored again."""
        super()._forget(task_id)
        self.delete(self.get_key_for_fence(task_id))

    def _expiry(self, state: str) -> int:
        expires = self.failure_expires if state == states.FAILURE else self.expires
        return int(expires or 0)

    def _fence_expiry(self, state: str) -> int:
        """Seconds the fence hash lives (0: for good): the result's, never less than the exactly-once retention.

        A result may expire sooner than the broker's re-delivery horizon
        (``result_expires`` below the visibility timeout); its fence must not,
        or a late copy would find none and store over the applied result.
        """
        expires = self._expiry(state)
        if not expires:
            return 0
        retention = self.__dict__.get("_once_retention")
        if retention is None:
            retention = self.__dict__["_once_retention"] = math.ceil(read_settings(self.app.conf).once_retention)
        return max(expires, int(retention))

    def arm(self, floor: int | FencingToken) -> int:
        """Operator: set the store's floor to *floor*, unless it holds a higher one; return the floor in force.

        As :meth:`RedisGate.arm <celery_fencing.RedisGate.arm>`: results with
        a token below the floor are refused. A fenced task arms an unarmed
        store by itself, from the worker's source.
        """
        encode_floor(floor)  # checked before Celery's retries, which only retry connection errors
        return int(self.ensure(raise_floor, (self._registered_arm(), self.floor_key, floor)))

    def ensure_armed(self, resource: str, source: TokenSource) -> int | None:
        """Arm the store from *source* if it has no floor, once per client; the floor (see ``FlooredStore``)."""
        client = self.client
        if self._armed_client == id(client):
            return None
        raw = self.ensure(client.get, (self.floor_key,))
        floor = found_floor(raw, self._registered_arm(), self.floor_key, source, "FencedRedisBackend")
        self._armed_client = id(client)
        return floor

    def _registered_arm(self) -> Any:
        self._registered()
        assert self._scripts is not None
        return self._scripts[4]

    def claim_result(self, task_id: str, token: FencingToken) -> None:
        """Raise the result's mark to *token* at the start of a fenced execution.

        :raises StaleTokenError: a newer execution of this task already claimed or wrote.
        :raises AlreadyAppliedError: another execution of this task sealed it: the task is done.
        :raises GrantorMismatchError: the result is fenced by another grantor's token.
        """
        _, claim, _ = self._registered()
        keys, args = [self.get_key_for_fence(task_id), self.floor_key], self._claim_args(token)
        self._check_reply(self._call(claim, keys, args, floor_source()), task_id, token)

    def claim_result_call(self, task_id: str, token: FencingToken) -> ScriptCall:
        """:meth:`claim_result`, prepared to share a round trip with a gate's claim on the same Redis.

        A fenced task sends it with its gates' claims (:func:`~celery_fencing.gates.redis.run_script_calls`);
        when the batch gives no usable reply, :meth:`claim_result` runs instead, with Celery's retries.
        """
        _, claim, _ = self._registered()

        def check(reply: Any) -> None:
            if isinstance(reply, ResponseError) and parse_refusal(str(reply)) is None:
                # A command error the unbatched call would have raised: let it raise it.
                self.claim_result(task_id, token)
            else:
                self._check_reply(reply, task_id, token)

        return ScriptCall(
            self.client,
            claim,
            [self.get_key_for_fence(task_id), self.floor_key],
            self._claim_args(token),
            check,
            lambda: self.claim_result(task_id, token),
        )

    def seal_result(self, task_id: str, execution: Execution) -> None:
        """Mark *execution* as the one whose result stands, when its body has returned.

        A fenced task with exactly-once calls it after its body and before
        Celery sends the task's callbacks (a chain's next step is sent before
        the result is stored). The first execution of a task id to seal wins,
        whatever the order of the tokens: the execution that finished its body
        has applied its effects. Its result write is then accepted; every
        other execution's is dropped.

        :raises AlreadyAppliedError: another execution of this task sealed first.
        :raises GrantorMismatchError: the result is fenced by another grantor's token.
        """
        _, _, seal = self._registered()
        token = execution.result_token
        args = [*self._claim_args(token), execution.execution_id]
        keys = [self.get_key_for_fence(task_id), self.floor_key]
        self._check_reply(self._call(seal, keys, args, execution.floor_source), task_id, token)

    def _call(self, script: Any, keys: list[str], args: list[Any], source: TokenSource | None) -> Any:
        """Run *script* with Celery's connection retries; a refusal comes back as its ResponseError.

        A store without its floor is armed from *source* first, then the
        script runs once more (and then refuses the token as below the floor,
        unless it was minted after it).
        """
        reply = self._send(script, keys, args)
        if is_unarmed_refusal(reply):
            arm_unarmed_store(self._registered_arm(), self.floor_key, source, "FencedRedisBackend")
            reply = self._send(script, keys, args)
        return reply

    def _send(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return self.ensure(script, (keys, args))
        except ResponseError as exc:
            if parse_refusal(str(exc)) is None:
                raise
            return exc

    def _claim_args(self, token: FencingToken) -> list[Any]:
        return [fixed_width(token.value), token.resource, self._fence_expiry(""), token.grantor or ""]

    def _check_reply(self, reply: Any, task_id: str, token: FencingToken) -> None:
        """Raise what a claim's or seal's refusal means; return on success."""
        refusal = parse_refusal(str(reply)) if isinstance(reply, ResponseError) else None
        if refusal is None:
            if isinstance(reply, Exception):
                raise GateUnavailableError(f"fenced result backend failed: {reply}", gate="FencedRedisBackend")
            return
        raise refusal_error(*refusal, task_id, token)

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
        token = token_of(request)
        execution = execution_of(request) if token else None
        if execution is not None:
            token = execution.result_token  # its token, unless its seal met a floor and minted afresh
        seals = execution is not None and execution.seals_with_result and state == states.SUCCESS
        write, _, _ = self._registered()
        keys = [self.get_key_for_task(task_id), self.get_key_for_fence(task_id), self.floor_key]

        def args(token: FencingToken | None) -> list[Any]:
            return [
                encoded,
                fixed_width(token.value) if token else "",
                token.resource if token else "",
                state,
                "1" if state in states.READY_STATES else "0",
                self._expiry(state),
                (token.grantor or "") if token else "",
                # '-' is never an execution id: a writer without one never matches a seal.
                execution.execution_id if execution is not None else "-",
                "1" if seals else "0",
                self._fence_expiry(state),
            ]

        source = execution.floor_source if execution is not None else None
        reply = self._call(write, keys, args(token), source)
        refusal = parse_refusal(str(reply)) if isinstance(reply, ResponseError) else None
        below = self._below_floor(execution, refusal)
        if below is not None and execution is not None:
            fresh = self._remint(execution, below, bytes_to_str(task_id)) if seals else None
            if fresh is None:
                skip_block_below_floor(execution.floor_source, below)
            else:
                reply = self._call(write, keys, args(fresh), source)
                refusal = parse_refusal(str(reply)) if isinstance(reply, ResponseError) else None
                token = fresh
                if refusal is None:
                    execution.fresh_result_token = fresh  # it sealed: the result's token from now on
        if refusal is not None:
            report_refused_write(self, bytes_to_str(task_id), state, token, *refusal)
        return result

    @staticmethod
    def _below_floor(execution: Execution | None, refusal: tuple[str, str] | None) -> BelowFloorError | None:
        """The *refusal* of an execution's result write as a :class:`BelowFloorError`, if it is one."""
        if execution is None or refusal is None or refusal[0] != "floor" or not refusal[1].isdigit():
            return None
        token = execution.result_token
        return BelowFloorError(resource=token.resource, token=token.value, floor=int(refusal[1]))

    def _remint(self, execution: Execution, below: BelowFloorError, task_id: str) -> FencingToken | None:
        """A fresh token for an unclaimed execution whose sealing result write met the floor, else ``None``.

        Never for another write: see :func:`~.claims.remint_unclaimed`. Such a
        write below the floor is refused and reported (``result_dropped``).
        """
        try:
            return remint_unclaimed(execution, below, read_settings(self.app.conf).timeout)
        except FencingError as exc:
            # Never raise from the backend (see the module's docstring): the write is reported dropped.
            logger.warning("task %s: no fresh token for its result write (%s)", task_id, exc)
            return None
