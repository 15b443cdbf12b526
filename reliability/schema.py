"""Names of the tables and keys one side of a world uses, and their definitions.

PostgreSQL, per side (``<p>`` is the side's prefix, e.g. ``rel_3f2a_fenced``):

``<p>_accounts(resource text primary key, balance bigint)``
    the rows the workload reads and writes (read-modify-write: ``balance = read + 1``)
``<p>_audit(seq bigserial, task_id, attempt, resource, token, read_value, new_value, pid, worker)``
    one row per accepted write, inserted in the same transaction as the balance.
    ``seq`` is taken while the writer holds the resource's row lock, so per
    resource it is commit order. ``task_id`` is deliberately *not* unique: the
    checker must be able to see a duplicate effect when one happens (in the
    control it does); the fenced side relies on the library's exactly-once.
``<p>_marks``
    the SQLGate's high-water mark table (fenced side only).
``<p>_applied``
    the SQLGate's applied-record table, "task T applied on R by execution E",
    written with each gated transaction (fenced side only).

Redis, per side and resource ``r`` (in the gate store, AOF or volatile):

``<p>:<r>:state``   hash: ``bal`` (the balance), ``seq`` (write count), ``epoch``
``<p>:<r>:applied`` set of the task ids applied (a plain log for the checker, atomically with the write)
``<p>:<r>:log``     list of ``"<task> <token> <seq>"``, in commit order
``<p>:fence``       the RedisGate's key prefix (marks, owners, applied records)

``epoch`` is a random id the first write after the hash went missing stores:
a Redis that restarted without persistence comes back without the hash, so the
next write stores a new epoch and the checker sees that the store lost its state.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, Table, Text, text
from sqlalchemy.engine import Engine

__all__ = ["REDIS_WRITE", "Names", "create_tables", "drop_tables"]

# The Redis half of the workload's write, atomic, with no check of its own: on the fenced
# side ``RedisGate.eval`` runs it after the fence check and the task's applied record.
# KEYS[1] state hash, KEYS[2] applied set, KEYS[3] log list
# ARGV[1] task id, ARGV[2] new balance, ARGV[3] token, ARGV[4] an epoch id to use if the hash has none
# returns {epoch, seq}
REDIS_WRITE = """\
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  epoch = ARGV[4]
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'bal', ARGV[2])
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('RPUSH', KEYS[3], ARGV[1] .. ' ' .. ARGV[3] .. ' ' .. seq)
return {epoch, seq}
"""


@dataclass(frozen=True)
class Names:
    """Every table and key name of one side, derived from its prefix."""

    prefix: str

    @property
    def accounts(self) -> str:
        return f"{self.prefix}_accounts"

    @property
    def audit(self) -> str:
        return f"{self.prefix}_audit"

    @property
    def marks(self) -> str:
        return f"{self.prefix}_marks"

    @property
    def applied(self) -> str:
        return f"{self.prefix}_applied"

    @property
    def gate_prefix(self) -> str:
        return f"{self.prefix}:fence"

    def redis_state(self, resource: str) -> str:
        return f"{self.prefix}:{resource}:state"

    def redis_applied(self, resource: str) -> str:
        return f"{self.prefix}:{resource}:applied"

    def redis_log(self, resource: str) -> str:
        return f"{self.prefix}:{resource}:log"

    def tables(self, metadata: MetaData | None = None) -> tuple[Table, Table]:
        """SQLAlchemy Core definitions of the accounts and audit tables."""
        metadata = metadata if metadata is not None else MetaData()
        accounts = Table(
            self.accounts,
            metadata,
            Column("resource", Text, primary_key=True),
            Column("balance", BigInteger, nullable=False, server_default=text("0")),
        )
        audit = Table(
            self.audit,
            metadata,
            Column("seq", BigInteger, primary_key=True, autoincrement=True),
            Column("task_id", Text, nullable=False),
            Column("attempt", Integer, nullable=False),
            Column("resource", Text, nullable=False),
            Column("token", BigInteger, nullable=False),
            Column("read_value", BigInteger, nullable=False),
            Column("new_value", BigInteger, nullable=False),
            Column("pid", Integer, nullable=False),
            Column("worker", Text, nullable=False),
            Index(f"{self.audit}_task", "task_id"),
        )
        return accounts, audit


def create_tables(engine: Engine, names: Names) -> None:
    """Create the side's tables (and the gate's mark table) if missing."""
    from celery_fencing.gates.sql import SQLGate

    metadata = MetaData()
    names.tables(metadata)
    metadata.create_all(engine)
    SQLGate(engine, table=names.marks, applied_table=names.applied).create_schema()


def drop_tables(engine: Engine, names: Names) -> None:
    with engine.begin() as conn:
        for table in (names.audit, names.accounts, names.marks, names.applied):
            conn.execute(text(f'DROP TABLE IF EXISTS "{table}"'))
