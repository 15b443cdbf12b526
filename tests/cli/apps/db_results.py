"""An app whose results go to a fenced database backend, for the doctor's result-backend checks.

CFT_BROKER broker URL, CFT_SOURCE token source URL, CFT_RESULTS the result
backend (``fenced+db+<SQLAlchemy URL>``, or a plain one), CFT_TABLES the prefix of
the backend's table names (``<prefix>_taskmeta``, ``<prefix>_taskfence``, ...),
CFT_RESULT_EXPIRES seconds, or ``none`` for results kept for good (unset:
Celery's default, one day).
"""

from __future__ import annotations

import os

from celery import Celery

from celery_fencing.celery import FencedTask, install

app = install(Celery("db_results", broker=os.environ["CFT_BROKER"], backend=os.environ["CFT_RESULTS"]))
app.conf.fencing_source = os.environ["CFT_SOURCE"]
prefix = os.environ["CFT_TABLES"]
app.conf.database_table_names = {
    "task": f"{prefix}_taskmeta",
    "group": f"{prefix}_tasksetmeta",
    "fence": f"{prefix}_taskfence",
}
if "CFT_RESULT_EXPIRES" in os.environ:
    expires = os.environ["CFT_RESULT_EXPIRES"]
    app.conf.result_expires = None if expires == "none" else float(expires)


@app.task(base=FencedTask)
def work() -> str:
    """A fenced task with a result (never run by the doctor)."""
    return "done"
