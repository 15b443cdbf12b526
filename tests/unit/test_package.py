"""The package surface: a complete sorted __all__, and no driver pulled in by import."""

from __future__ import annotations

import subprocess
import sys

import celery_fencing


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted (case-sensitively) and every name in it resolves."""
    assert list(celery_fencing.__all__) == sorted(celery_fencing.__all__)
    for name in celery_fencing.__all__:
        assert getattr(celery_fencing, name) is not None, name


def test_public_names_are_in_all() -> None:
    """Every public module-level name defined by the package root is listed in __all__."""
    # isidentifier: the package's pytest11 entry point makes pytest rewrite the asserts of every module of the
    # distribution, and a rewritten module carries the names "@py_builtins" and "@pytest_ar".
    public = {n for n in vars(celery_fencing) if not n.startswith("_") and n.isidentifier()}
    submodules = {
        "celery",
        "blocks",
        "cli",
        "context",
        "contrib",
        "demo",
        "exceptions",
        "gates",
        "idempotency",
        "lease_state",
        "metrics",
        "operations",
        "policies",
        "protocols",
        "signing",
        "sources",
        "testing",
        "token",
        "urls",
        "values",
    }
    assert public - submodules - {"annotations", "importlib", "TYPE_CHECKING", "Any"} <= set(celery_fencing.__all__)


def test_import_pulls_in_no_driver() -> None:
    """`import celery_fencing` imports no driver: celery, kazoo, redis, sqlalchemy, django, metrics libraries."""
    code = (
        "import sys, celery_fencing\n"
        "drivers = {'celery', 'kazoo', 'redis', 'sqlalchemy', 'kombu', 'django'}\n"
        "drivers |= {'prometheus_client', 'opentelemetry'}\n"
        "loaded = drivers & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
