"""Run the bank ledger: ``python -m examples.bank_ledger`` from the repository root.

Starts two real workers, sends 30 deposits to one account at once, and checks
the books: the balance is the exact sum and the ledger has one line per
deposit, although many attempts were fenced out on the way.
Needs PostgreSQL (``EXAMPLE_DATABASE_URL``) and a broker (``EXAMPLE_BROKER``,
Redis by default). Exits 0 when the books balance.
"""

from __future__ import annotations

import re
import sys

from examples._support import delete_queues, example_run, wait_until, workers

DEPOSITS = list(range(1, 31))


def main() -> int:
    with example_run("bank") as (namespace, tmp):
        from sqlalchemy import func, select

        from examples.bank_ledger import tasks

        tasks.metadata.create_all(tasks.engine())
        try:
            with tasks.engine().begin() as conn:
                conn.execute(tasks.accounts.insert().values(id=1, balance=0))
            with workers("examples.bank_ledger.tasks", ["w1", "w2"], queue=namespace, log_dir=tmp) as running:
                for amount in DEPOSITS:
                    tasks.deposit.delay(1, amount)

                def lines() -> int:
                    with tasks.engine().connect() as conn:
                        return int(conn.execute(select(func.count()).select_from(tasks.ledger)).scalar_one())

                wait_until(lambda: lines() == len(DEPOSITS), f"{len(DEPOSITS)} ledger lines", timeout=120)
                logs = "".join(worker.log() for worker in running)
            with tasks.engine().connect() as conn:
                balance = conn.execute(select(tasks.accounts.c.balance)).scalar_one()
                task_ids = conn.execute(select(func.count(func.distinct(tasks.ledger.c.task_id)))).scalar_one()
        finally:
            tasks.metadata.drop_all(tasks.engine())
            tasks.engine().dispose()
            delete_queues(tasks.app.conf.broker_url, namespace)
    fenced_out = re.findall(r"fenced out at (\w+) on 'account:1'", logs)
    expected = sum(DEPOSITS)
    print(f"bank ledger: deposits of 1, 2, ... {DEPOSITS[-1]} to account 1, sent at once to 2 workers")
    print(f"  final balance    {balance}  (expected {expected})")
    print(f"  ledger lines     {task_ids} deposits, each recorded once")
    print(
        f"  fenced out       {len(fenced_out)} stale attempts (at claim: {fenced_out.count('claim')}, "
        f"at write: {fenced_out.count('body')}), each retried with a new token"
    )
    ok = balance == expected and task_ids == len(DEPOSITS)
    print("OK: the books balance" if ok else "FAILED: the books do not balance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
