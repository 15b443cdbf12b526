"""Read one side's history and final state into the checker's :class:`~reliability.checker.Observation`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis
from sqlalchemy import create_engine, select

from .checker import AuditRow, Fault, Observation, RedisState
from .schema import Names

__all__ = ["collect", "read_audit", "scope_events"]


def scope_events(events: Iterable[dict[str, Any]], side: str, scope: str, tasks: set[str]) -> list[dict[str, Any]]:
    """The events of *side* that belong to *scope* (by resource) or to one of its *tasks*."""
    prefix = f"acct:{scope}:"
    chosen = []
    for event in events:
        if event.get("mode") != side:
            continue
        resource = event.get("resource")
        if (isinstance(resource, str) and resource.startswith(prefix)) or event.get("task") in tasks:
            chosen.append(event)
    return chosen


def collect(
    *,
    side: str,
    names: Names,
    scope: str,
    submitted: dict[str, str],
    events: Sequence[dict[str, Any]],
    pg_url: str,
    redis_urls: dict[str, str] | None,
    faults: Sequence[Fault],
    started: float,
    ended: float,
) -> Observation:
    """Build the observation; reads PostgreSQL and (with *redis_urls*, resource to URL) Redis."""
    audit, balances = read_audit(names, scope, pg_url)
    redis_state: dict[str, RedisState] | None = None
    if redis_urls is not None:
        redis_state = {}
        for resource in balances:
            client = redis.Redis.from_url(redis_urls[resource], decode_responses=True, socket_timeout=10)
            try:
                redis_state[resource] = _redis_state(client, names, resource)
            finally:
                client.close()
    return Observation(
        side=side,
        submitted=dict(submitted),
        events=scope_events(events, side, scope, set(submitted)),
        audit=audit,
        balances=balances,
        redis=redis_state,
        faults=list(faults),
        started=started,
        ended=ended,
    )


def read_audit(names: Names, scope: str, pg_url: str) -> tuple[list[AuditRow], dict[str, int]]:
    """The audit rows of *scope* in commit order (``seq``), and the balance of each of its accounts."""
    accounts, audit_table = names.tables()
    pattern = f"acct:{scope}:%"
    engine = create_engine(pg_url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            audit = [
                AuditRow(
                    seq=row.seq,
                    task_id=row.task_id,
                    resource=row.resource,
                    token=row.token,
                    read_value=row.read_value,
                    new_value=row.new_value,
                    attempt=row.attempt,
                    pid=row.pid,
                    worker=row.worker,
                )
                for row in conn.execute(
                    select(audit_table).where(audit_table.c.resource.like(pattern)).order_by(audit_table.c.seq)
                )
            ]
            balances = {
                row.resource: int(row.balance)
                for row in conn.execute(select(accounts).where(accounts.c.resource.like(pattern)))
            }
    finally:
        engine.dispose()
    return audit, balances


def _redis_state(client: redis.Redis, names: Names, resource: str) -> RedisState:
    state = client.hgetall(names.redis_state(resource))
    log = []
    for entry in client.lrange(names.redis_log(resource), 0, -1):
        task_id, token, seq = entry.split(" ")
        log.append((task_id, int(token), int(seq)))
    return RedisState(
        balance=int(state["bal"]) if "bal" in state else None,
        epoch=state.get("epoch"),
        applied=set(client.smembers(names.redis_applied(resource))),
        log=log,
    )
