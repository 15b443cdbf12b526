"""Before a fenced task's body runs: arm its stores, then claim its token on each of them.

Functions of the gates and the result backend the task was given, so that
:class:`~celery_fencing.celery.FencedTask` keeps only the execution's lifecycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..protocols import FencedResultStore, FlooredStore, Gate, TokenSource, conforms
from ..token import FencingToken

__all__ = ["arm_stores", "claim_stores"]


def arm_stores(gates: Sequence[Gate], backend: Any, resource: str, source: TokenSource) -> None:
    """Give the stores a floor, before the token is minted, where they have none (each checks once per process).

    A store without its floor (new, or it lost its data) refuses every token;
    armed now, from the worker's source, the token minted next passes it.
    *backend* is ``None`` for a task that stores no result.

    :raises GateUnavailableError: a store could not be reached.
    :raises TokenUnavailableError: the source could not mint a floor.
    """
    for gate in gates:
        if conforms(gate, FlooredStore):
            gate.ensure_armed(resource, source)  # type: ignore[attr-defined]
    if backend is not None and conforms(backend, FlooredStore):
        backend.ensure_armed(resource, source)


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
        # Only a gate's own claim_call: a wrapper (MeteredGate) that forwards
        # unknown attributes would have its claim() skipped.
        prepare = _own_method(gate, "claim_call") if batch else None
        if prepare is None:
            gate.claim(token)
        else:
            batched.append(prepare(token))
    if backend is not None:
        prepare_result = _own_method(backend, "claim_result_call") if batch else None
        if prepare_result is not None:
            batched.append(prepare_result(task_id, token))
        elif conforms(backend, FencedResultStore):
            backend.claim_result(task_id, token)
    if batched:
        from ..gates.redis_batch import run_script_calls

        run_script_calls(batched)


def _own_method(target: Any, name: str) -> Any:
    """``target.name`` if *target*'s class defines it, else ``None`` (not one a proxy forwards)."""
    if getattr(type(target), name, None) is None:
        return None
    return getattr(target, name)
