"""Claims: arm a fenced task's stores, claim its token on each before the body (a first delivery need not).

Functions of the gates and the result backend the task was given, so that
:class:`~celery_fencing.celery.FencedTask` keeps only the execution's lifecycle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from ..context import Execution
from ..exceptions import BelowFloorError
from ..protocols import (
    BatchedClaimGate,
    BatchedResultClaims,
    BlockSource,
    FencedResultStore,
    FlooredStore,
    Gate,
    TokenSource,
    TransientSource,
    conforms,
    declares,
)
from ..token import FencingToken

__all__ = [
    "arm_stores",
    "claim_stores",
    "first_delivery",
    "remint_unclaimed",
    "skip_block_below_floor",
]

logger = logging.getLogger("celery_fencing")


def arm_stores(gates: Sequence[Gate], backend: Any, resource: str, source: TokenSource) -> None:
    """Give the stores a floor, before the token is minted, where they have none (each checks once per process).

    A store without its floor (new, or it lost its data) refuses every token;
    armed now, from the worker's source, the token minted next passes it.
    *backend* is ``None`` for a task that stores no result.

    A block this process reserved before a floor was minted (its own arming of
    another store reserved one, or another process armed this store since)
    would be refused below that floor, at every first delivery's unclaimed
    write: its tokens below the floors found are skipped.

    :raises GateUnavailableError: a store could not be reached.
    :raises TokenUnavailableError: the source could not mint a floor.
    """
    highest: int | None = None
    for store in (*gates, backend):
        if store is not None and conforms(store, FlooredStore):
            floor = store.ensure_armed(resource, source)
            if floor is not None and (highest is None or floor > highest):
                highest = floor
    if highest is not None and isinstance(source, BlockSource):
        source.skip_block_below(highest)


def skip_block_below_floor(source: object, exc: BelowFloorError) -> None:
    """After a store refused a token as below its floor: draw no more tokens below it from *source*'s block.

    Else every later execution of this process would meet the same refusal
    (at an unclaimed write, a retry each) until the block ran out.
    """
    if exc.high_water is not None and isinstance(source, BlockSource):
        source.skip_block_below(exc.high_water)


def remint_unclaimed(execution: Execution, exc: BelowFloorError, timeout: float) -> FencingToken | None:
    """A fresh token to seal with, for an execution refused below the result store's floor that did not claim it.

    ``None`` when the execution claimed its result. The result claim a first
    delivery skips would have met that floor before the body and minted fresh
    (see ``FencedTask._start_fencing``). Met at the seal instead, the refusal
    means the same: the token came from a block reserved before the store was
    armed, not that a newer execution exists. The caller seals with the fresh
    token and, once that seal went through, makes it the execution's
    :attr:`~celery_fencing.context.Execution.result_token`; the body's writes
    (already made) keep its token. A claimed execution passed the floor at its
    claim: a floor above its token now means the store lost its data since,
    and the refusal stands.

    Only for the seal: seals are ordered by who seals first, not by token (a
    newer execution that sealed makes this one's seal "already applied"). A
    fresh token on any other write (FAILURE, RETRY, a progress state), or on
    any write after a seal that did not go through, would be above a newer
    execution's claim and overwrite its state.

    :raises TokenUnavailableError: the source could not mint within *timeout* seconds.
    """
    source = execution.floor_source
    if execution.result_claimed or source is None:
        return None
    skip_block_below_floor(source, exc)
    # As the execution's own token was minted (FencedTask._mint_execution): transient for a task id.
    if execution.transient_retention is not None and declares(source, TransientSource):
        mint = cast(TransientSource, source).mint_transient
    else:
        mint = source.mint
    fresh: FencingToken = mint(execution.token.resource, timeout=timeout)
    logger.info(
        "task %s: token %s is below the result store's floor %s (a block reserved before the store was armed); "
        "sealing with a fresh token %s",
        execution.task_id,
        execution.result_token.value,
        exc.high_water,
        fresh.value,
    )
    return fresh


def first_delivery(request: Any, execution: Execution) -> bool:
    """Whether *execution* is its task's first delivery: it has no older execution of its task id to keep out.

    The claims keep older executions from going on once a newer one started.
    The first delivery of a task's message (no ``redelivered`` flag from the
    broker, no retry, not run eagerly) has no older execution of its task id,
    and exactly once does the rest: every gated write, and the result write,
    records or checks the task id, so a later copy, which claims, stops this
    one at its next write (a refusal, or "already applied"). So a first
    delivery claims neither its result nor, fenced on its own id, its gates:
    a round trip less per task. A task on a domain resource still claims its
    gates, where other tasks contend and the claim keeps their reads and
    writes apart. A broker that never flags a re-delivery makes every delivery
    of a first message look first: the protocol model (tests/model/protocol.py,
    ``unflagged``) shows that safe too.
    """
    if not execution.once or request.retries or request.is_eager:
        return False
    delivery = request.delivery_info
    return isinstance(delivery, dict) and not delivery.get("redelivered")


def claim_stores(gates: Sequence[Gate], backend: Any, token: FencingToken, task_id: str, *, batch: bool) -> None:
    """Claim *token* on every gate and on the task's result (*backend*, ``None`` without one).

    One by one, in order, stopping at the first refusal: a claim refused by a
    gate leaves the later gates and the result untouched, so an older
    execution of the task that is still running can finish its writes and
    its result. With *batch* (the resource is the task id), the claims that
    are Lua scripts on one Redis server (a RedisGate and the fenced result
    backend, typically) go in one round trip and all run: a gate can then
    only have refused because a newer execution of the same task claimed
    it, and that execution owns the result anyway.
    """
    batched: list[Any] = []
    for gate in gates:
        if batch and declares(gate, BatchedClaimGate):
            batched.append(gate.claim_call(token))  # type: ignore[attr-defined]
        else:
            gate.claim(token)
    if backend is not None:
        if batch and declares(backend, BatchedResultClaims):
            batched.append(backend.claim_result_call(task_id, token))
        elif conforms(backend, FencedResultStore):
            backend.claim_result(task_id, token)
    if batched:
        from ..gates.redis_batch import run_script_calls

        run_script_calls(batched)
