"""Idempotency keys in SQL (SQLAlchemy Core; PostgreSQL and SQLite): one row per key.

The table (``fencing_idempotency`` by default; :func:`idempotency_table`
builds it into your own ``MetaData`` for migrations)::

    key            VARCHAR(400) PRIMARY KEY
    state          VARCHAR(8)   'pending' | 'done'
    claim          VARCHAR(32)  random id of the claim that holds the key
    claimed_at_ms  BIGINT       when it was claimed, ms of the database's clock
    expires_at_ms  BIGINT       when the key stops suppressing repeats (retention)
    outcome        TEXT         the outcome as JSON text (when done)

Times come from the database (``clock_timestamp()`` on PostgreSQL,
``julianday('now')`` on SQLite), never from the workers. An expired row counts
as absent; :meth:`SQLIdempotencyStore.purge` deletes expired rows (run it
from a periodic task).

Two ways to use it:

* Around an effect the database cannot see (an HTTP API): :func:`~celery_fencing.idempotency.run_once`
  / :func:`~celery_fencing.idempotency.idempotent` claim (one committed
  upsert), call, record (one committed update); see
  :mod:`celery_fencing.idempotency` for what a crash in between means.
* Around an effect *in this database*: :meth:`SQLIdempotencyStore.transaction_once`
  inserts the key in the transaction that makes the effect, so both commit or
  neither does: exactly once. A concurrent duplicate blocks on the key's row
  until the first commits, then finds it done.

Errors: failures of the store's own statements raise
:class:`~celery_fencing.GateUnavailableError` with the SQLAlchemy exception
chained; your statements inside :meth:`~SQLIdempotencyStore.transaction_once`
propagate unchanged and roll the transaction back. Thread and fork safety: as
the engine's (share one between threads; build it per process after ``fork()``,
e.g. by passing a factory to ``@idempotent``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, NoReturn

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    MetaData,
    String,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    extract,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from ..exceptions import EffectPendingError, FencingConfigurationError
from ..gates.sql.schema import create_tables, define_table, supported_dialect
from ..gates.unavailable import unavailable_error
from .core import DEFAULT_RETENTION, MAX_KEY_LENGTH, Claim, validate_key

__all__ = ["DEFAULT_TABLE", "EffectInTransaction", "SQLIdempotencyStore", "idempotency_table"]

DEFAULT_TABLE = "fencing_idempotency"
_SUPPORTED = frozenset({"postgresql", "sqlite"})


def idempotency_table(metadata: MetaData, name: str = DEFAULT_TABLE, *, schema: str | None = None) -> Table:
    """Define the idempotency table in *metadata*; an existing table of that name is returned as is."""
    return define_table(
        metadata,
        name,
        schema,
        Column("key", String(MAX_KEY_LENGTH), primary_key=True),
        Column("state", String(8), nullable=False),
        Column("claim", String(32), nullable=False),
        Column("claimed_at_ms", BigInteger, nullable=False),
        Column("expires_at_ms", BigInteger, nullable=False),
        Column("outcome", Text, nullable=True),
    )


@dataclass
class EffectInTransaction:
    """What :meth:`SQLIdempotencyStore.transaction_once` hands the block.

    ``done`` is true when an earlier transaction already made the effect;
    then ``outcome`` is what it recorded, and the block should return it
    without writing. Otherwise make the effect on ``connection`` and call
    :meth:`record` with its outcome: key, effect and outcome commit together.
    """

    connection: Connection
    key: str
    done: bool
    outcome: Any = None
    _store: SQLIdempotencyStore | None = field(default=None, repr=False)

    def record(self, outcome: Any) -> None:
        """Store *outcome* (JSON-serialisable) with the key, in this transaction.

        :raises FencingConfigurationError: the effect was already done (nothing to record).
        :raises TypeError: *outcome* is not JSON-serialisable.
        """
        if self.done or self._store is None:
            raise FencingConfigurationError(f"the effect of {self.key!r} was already done: there is nothing to record")
        encoded = json.dumps(outcome, separators=(",", ":"))
        self._store._execute(
            self.connection, self._store._set_outcome, {"p_key": self.key, "p_outcome": encoded}, "recording"
        )
        self.outcome = json.loads(encoded)


class SQLIdempotencyStore:
    """Idempotency keys in a SQL table (see the module docstring for the layout and guarantees).

    :param engine: a SQLAlchemy ``Engine`` for PostgreSQL (psycopg) or SQLite.
    :param table: the table's name; *schema* and *metadata* as for :class:`~celery_fencing.SQLGate`.
    :raises FencingConfigurationError: for another database.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        table: str = DEFAULT_TABLE,
        schema: str | None = None,
        metadata: MetaData | None = None,
    ) -> None:
        dialect = supported_dialect(engine, _SUPPORTED, "SQLIdempotencyStore")
        self.engine = engine
        self._table = idempotency_table(metadata if metadata is not None else MetaData(), table, schema=schema)
        t = self._table
        now = _now_ms(dialect)
        key = bindparam("p_key", type_=t.c.key.type)
        claim = bindparam("p_claim", type_=t.c.claim.type)
        retention = bindparam("p_retention", type_=BigInteger())
        reclaim = bindparam("p_reclaim", type_=BigInteger())
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert

        def upsert(state: str, takeover: ColumnElement[bool]) -> Any:
            ins = insert(t).values(
                key=key, state=state, claim=claim, claimed_at_ms=now, expires_at_ms=now + retention, outcome=None
            )
            excluded = ins.excluded
            return ins.on_conflict_do_update(
                index_elements=[t.c.key],
                set_={
                    "state": excluded.state,
                    "claim": excluded.claim,
                    "claimed_at_ms": excluded.claimed_at_ms,
                    "expires_at_ms": excluded.expires_at_ms,
                    "outcome": None,
                },
                # An expired key counts as absent; a stale pending claim may be taken over.
                where=or_(t.c.expires_at_ms <= excluded.claimed_at_ms, takeover),
            ).execution_options(preserve_rowcount=True)

        # A pending claim older than reclaim_after may be taken over (a NULL reclaim never matches).
        self._claim = upsert("pending", and_(t.c.state == "pending", t.c.claimed_at_ms + reclaim <= now))
        self._claim_done = upsert("done", literal(False))
        self._read = select(t.c.state, t.c.outcome, (now - t.c.claimed_at_ms).label("age_ms")).where(t.c.key == key)
        self._record = (
            update(t)
            .where(t.c.key == key, t.c.claim == claim, t.c.state == "pending", t.c.expires_at_ms > now)
            .values(state="done", outcome=bindparam("p_outcome"), expires_at_ms=now + retention)
        )
        self._set_outcome = update(t).where(t.c.key == key).values(outcome=bindparam("p_outcome"))
        self._forget = delete(t).where(t.c.key == key, t.c.claim == claim, t.c.state == "pending")
        self._purge = delete(t).where(t.c.expires_at_ms <= now)

    @property
    def table(self) -> Table:
        """The idempotency table, for ``create_all`` or your migrations."""
        return self._table

    def create_schema(self) -> None:
        """Create the table if it does not exist. Idempotent, also when run concurrently.

        :raises GateUnavailableError: the database failed or could not be reached.
        """
        create_tables(self.engine, ((self._table, "the idempotency table"),), _unavailable)

    # IdempotencyStore ---------------------------------------------------------

    def claim(self, key: str, *, retention: float, reclaim_after: float | None) -> Claim:
        """Claim *key* for *retention* seconds (one committed upsert), or return its recorded outcome.

        :raises EffectPendingError: a claim without an outcome stands (younger than *reclaim_after*).
        :raises GateUnavailableError: the database failed or could not be reached.
        """
        validate_key(key)
        claim_id = uuid.uuid4().hex
        params = {
            "p_key": key,
            "p_claim": claim_id,
            "p_retention": _ms(retention),
            "p_reclaim": None if reclaim_after is None else _ms(reclaim_after),
        }
        try:
            with self.engine.begin() as conn:
                if self._execute(conn, self._claim, params, "claiming").rowcount == 1:
                    return Claim(key, claim_id)
                state, outcome, age_ms = self._execute(conn, self._read, params, "reading").one()
        except sa_exc.SQLAlchemyError as exc:  # BEGIN or COMMIT
            _unavailable(exc, "claiming")
        if state == "done":
            return Claim(key, claim_id, done=True, outcome=outcome)
        raise EffectPendingError(key=key, age=int(age_ms) / 1000)

    def record(self, claim: Claim, outcome: str, *, retention: float) -> bool:
        """Record the outcome of a claim this caller still holds; ``False`` if it is no longer its own."""
        params = {"p_key": claim.key, "p_claim": claim.claim_id, "p_outcome": outcome, "p_retention": _ms(retention)}
        try:
            with self.engine.begin() as conn:
                return bool(self._execute(conn, self._record, params, "recording").rowcount == 1)
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "recording")

    def forget(self, claim: Claim) -> None:
        """Drop a pending claim this caller holds (its call had no effect)."""
        try:
            with self.engine.begin() as conn:
                self._execute(conn, self._forget, {"p_key": claim.key, "p_claim": claim.claim_id}, "forgetting")
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "forgetting")

    def purge(self) -> int:
        """Delete expired keys; return how many went.

        :raises GateUnavailableError: the database failed or could not be reached.
        """
        try:
            with self.engine.begin() as conn:
                return int(self._execute(conn, self._purge, {}, "purging").rowcount)
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "purging")

    # Effects inside the database ----------------------------------------------

    @contextmanager
    def transaction_once(self, key: str, *, retention: float = DEFAULT_RETENTION) -> Iterator[EffectInTransaction]:
        """A transaction that makes an effect at most once per *key*, exactly once if it commits.

        ::

            with store.transaction_once(f"{task_id}:ledger") as effect:
                if effect.done:
                    return effect.outcome
                row = effect.connection.execute(insert(ledger).values(...).returning(ledger.c.id)).one()
                effect.record({"entry": row.id})

        Entering inserts the key as done in a new transaction; leaving normally
        commits the key, the block's writes and the recorded outcome together;
        an exception rolls all of them back and propagates. A duplicate running
        concurrently waits for this transaction's row lock, then sees ``done``.

        :raises EffectPendingError: :func:`run_once` claimed this key and recorded nothing.
        :raises GateUnavailableError: the database failed (entering, or at COMMIT).
        :raises FencingConfigurationError: bad key or retention, before any I/O.
        """
        validate_key(key)
        params = {"p_key": key, "p_claim": uuid.uuid4().hex, "p_retention": _ms(retention), "p_reclaim": None}
        try:
            conn = self.engine.connect()
            transaction = conn.begin()
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, "connecting")
        try:
            try:
                if self._execute(conn, self._claim_done, params, "claiming").rowcount == 1:
                    effect = EffectInTransaction(conn, key, done=False, _store=self)
                else:
                    state, outcome, age_ms = self._execute(conn, self._read, params, "reading").one()
                    if state != "done":
                        raise EffectPendingError(key=key, age=int(age_ms) / 1000)
                    decoded = None if outcome is None else json.loads(outcome)
                    effect = EffectInTransaction(conn, key, done=True, outcome=decoded)
                yield effect
            except BaseException:
                with suppress(sa_exc.SQLAlchemyError):  # a dead connection was rolled back by the server
                    transaction.rollback()
                raise
            try:
                transaction.commit()
            except sa_exc.SQLAlchemyError as exc:
                _unavailable(exc, "committing")
        finally:
            conn.close()

    # Internals ----------------------------------------------------------------

    def _execute(self, conn: Connection, statement: Any, params: dict[str, Any], doing: str) -> Any:
        try:
            return conn.execute(statement, params)
        except sa_exc.SQLAlchemyError as exc:
            _unavailable(exc, doing)

    def __repr__(self) -> str:
        return f"SQLIdempotencyStore({self.engine!r}, table={self._table.name!r})"


def _now_ms(dialect: str) -> ColumnElement[int]:
    """The database's clock in ms since the epoch, as a SQL expression."""
    if dialect == "postgresql":
        return cast(func.floor(extract("epoch", func.clock_timestamp()) * 1000), BigInteger)
    # SQLite: julianday('now') has millisecond resolution; 2440587.5 is the Unix epoch's Julian day.
    return cast((func.julianday("now") - 2440587.5) * 86400000.0, BigInteger)


def _ms(seconds: float) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise FencingConfigurationError(f"durations must be positive numbers of seconds, not {seconds!r}")
    return max(1, round(seconds * 1000))


def _unavailable(exc: sa_exc.SQLAlchemyError, doing: str) -> NoReturn:
    raise unavailable_error(exc, doing, store="SQL idempotency store", gate="SQLIdempotencyStore") from exc
