"""A bank ledger on PostgreSQL: each deposit is a fenced read-modify-write.

What one ``deposit`` execution does:

1. It is fenced on its account (``fencing_resource="account:{account_id}"``):
   the token source mints a token for this execution.
2. Before the body runs, the token is **claimed** at the SQLGate
   (``fencing_gates``): the account's high-water mark rises to it, so any older
   deposit on this account still in flight (paused, re-delivered, slow) will
   have its write refused from now on.
3. The body reads the balance, then writes the new balance *and* a ledger line
   in one **guarded transaction** (``gate.transaction()``): its first statement
   checks the token against the mark, under the mark row's lock, so both
   writes commit only if no newer deposit claimed the account meanwhile.
4. A refused deposit raises ``StaleTokenError``; FencedTask's default policy
   for a domain resource retries it: new token, fresh read, redo.

Configuration (environment): ``EXAMPLE_DATABASE_URL`` (PostgreSQL),
``EXAMPLE_BROKER``, ``FENCING_SOURCE``, ``EXAMPLE_NAMESPACE`` (table and queue names).
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

from celery import Celery, Task
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, create_engine, insert, select, update
from sqlalchemy.engine import Engine

from celery_fencing.celery import FencedTask, install
from celery_fencing.gates.sql import SQLGate, applied_table, high_water_table

NAMESPACE = os.environ.get("EXAMPLE_NAMESPACE", "bank")
DATABASE_URL = os.environ.get("EXAMPLE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: Seconds between the read and the write: a fraud check, a currency conversion...
THINK = float(os.environ.get("EXAMPLE_THINK", "0.05"))

metadata = MetaData()
accounts = Table(
    f"{NAMESPACE}_accounts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("balance", BigInteger, nullable=False),
)
ledger = Table(
    f"{NAMESPACE}_ledger",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("account_id", Integer, nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("balance_after", BigInteger, nullable=False),
    Column("task_id", String(64), nullable=False),
    Column("token", BigInteger, nullable=False),
)
# The gate's tables (its marks, and the exactly-once records of the tasks that wrote),
# defined in our own metadata so create_all (or Alembic) makes them.
marks = high_water_table(metadata, f"{NAMESPACE}_marks")
applied = applied_table(metadata, f"{NAMESPACE}_applied")


@cache
def engine() -> Engine:
    # Per process (the pool here is threads; under prefork, build engines after fork).
    return create_engine(DATABASE_URL, pool_size=8, pool_pre_ping=True)


@cache
def gate() -> SQLGate:
    return SQLGate(engine(), table=marks.name, applied_table=applied.name, metadata=metadata)


app = install(Celery("bank_ledger", broker=os.environ.get("EXAMPLE_BROKER", "redis://127.0.0.1:6379/0")))
app.conf.update(
    task_default_queue=NAMESPACE,
    fencing_source=os.environ.get("FENCING_SOURCE", "sqlite:///bank-tokens.db"),
    # Retry a fenced-out deposit soon: the newer one that fenced it out is done by then.
    fencing_retry_countdown=0.05,
    fencing_retry_max_delay=1.0,
    fencing_max_retries=50,
)


def gates() -> list[Any]:
    """The gates a deposit claims its token on when it starts."""
    return [gate()]


@app.task(bind=True, base=FencedTask, fencing_resource="account:{account_id}", fencing_gates=gates)
def deposit(self: Task, account_id: int, amount: int) -> int:
    """Add *amount* to the account and record it in the ledger, exactly once."""
    with engine().connect() as conn:  # read after the claim: no older deposit can write past us now
        balance = conn.execute(select(accounts.c.balance).where(accounts.c.id == account_id)).scalar_one()
    time.sleep(THINK)
    new_balance = balance + amount
    token = self.request.fencing_token
    with gate().transaction(token) as conn:  # refused (and rolled back) if a newer deposit claimed the account
        conn.execute(update(accounts).where(accounts.c.id == account_id).values(balance=new_balance))
        conn.execute(
            insert(ledger).values(
                account_id=account_id,
                amount=amount,
                balance_after=new_balance,
                task_id=self.request.id,
                token=token.value,
            )
        )
    return int(new_balance)
