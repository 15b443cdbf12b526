"""Migration scenarios run in a spawned child process, on a database no migration has touched.

Each scenario is a module-level function ``(name, alias, environ) -> dict`` (spawn pickles it by
reference); the child configures Django from ``environ`` (see the ``fresh_database`` fixture),
runs it, and sends back what it saw, or the ``repr`` of what it raised.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

from django.db import connections

from .adapters import setup_django

Scenario = Callable[[str, str, dict[str, str]], dict[str, Any]]


def run_migration_scenario(scenario: Scenario, name: str, alias: str, environ: dict[str, str]) -> dict[str, Any]:
    """Run ``scenario(name, alias, environ)`` in a spawned child and return what it saw."""
    ctx = multiprocessing.get_context("spawn")
    queue: Any = ctx.Queue()
    proc = ctx.Process(target=_child, args=(scenario, name, alias, environ, queue))
    proc.start()
    result = queue.get(timeout=120)
    proc.join(timeout=30)
    assert isinstance(result, dict), result
    return result


def _child(scenario: Scenario, name: str, alias: str, environ: dict[str, str], queue: Any) -> None:
    """Child-process entry point: Django on a database of its own, then one migration scenario; report."""
    os.environ.update(environ)
    try:
        setup_django()
        queue.put(scenario(name, alias, environ))
    except BaseException as exc:
        queue.put(repr(exc))
        raise
    finally:
        connections.close_all()


def sa_connect_args(environ: dict[str, str]) -> dict[str, Any]:
    """SQLAlchemy connect arguments that put SQLGate in the fresh database's PostgreSQL schema, if it has one."""
    schema = environ.get("FENCING_DJANGO_SCHEMA_FOR_SA")
    return {"options": f"-c search_path={schema}", "connect_timeout": 5} if schema else {}
