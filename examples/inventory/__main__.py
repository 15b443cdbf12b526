"""Run the inventory counter: ``python -m examples.inventory`` from the repository root.

Puts 50 widgets in stock, sends 40 orders of 1 to 3 widgets at once to two
real workers, and checks the stock: never oversold, every order answered
once, stock + reserved = 50. Needs Redis (``EXAMPLE_REDIS_URL``, also the
default broker). Exits 0 when the stock adds up.
"""

from __future__ import annotations

import re
import sys

from examples._support import delete_queues, delete_redis_keys, example_run, wait_until, workers

STOCK = 50
ORDERS = [(f"order-{n:02d}", 1 + n % 3) for n in range(40)]  # 79 widgets wanted, 50 in stock


def main() -> int:
    with example_run("inventory") as (namespace, tmp):
        from examples.inventory import tasks

        data = tasks.client()
        try:
            data.set(tasks.stock_key("widget"), STOCK)
            with workers("examples.inventory.tasks", ["w1", "w2"], queue=namespace, log_dir=tmp) as running:
                for order_id, quantity in ORDERS:
                    tasks.reserve.delay("widget", order_id, quantity)
                wait_until(
                    lambda: data.hlen(tasks.reservations_key("widget")) == len(ORDERS),
                    f"{len(ORDERS)} orders to be answered",
                    timeout=120,
                )
                logs = "".join(worker.log() for worker in running)
            stock = int(data.get(tasks.stock_key("widget")) or 0)
            outcomes = data.hgetall(tasks.reservations_key("widget"))
        finally:
            delete_redis_keys(tasks.REDIS_URL, f"{namespace}:*")
            delete_queues(tasks.app.conf.broker_url, namespace)
    reserved = sum(int(v) for v in outcomes.values() if v.isdigit())
    served = sum(1 for v in outcomes.values() if v.isdigit())
    fenced_out = len(re.findall(r"fenced out at \w+ on 'sku:widget'", logs))
    print(f"inventory: {STOCK} widgets, {len(ORDERS)} orders for {sum(q for _, q in ORDERS)} widgets, 2 workers")
    print(f"  reserved         {reserved} widgets for {served} orders; {len(ORDERS) - served} told 'out of stock'")
    print(f"  left in stock    {stock}  (stock + reserved = {stock + reserved}, expected {STOCK})")
    print(f"  fenced out       {fenced_out} stale attempts, each retried with a new token")
    ok = stock >= 0 and stock + reserved == STOCK and len(outcomes) == len(ORDERS)
    print("OK: never oversold, nothing lost" if ok else "FAILED: the stock does not add up")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
