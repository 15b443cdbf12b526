"""A private Django project for the gate tests: this session's own PostgreSQL schema and SQLite file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.gates.adapters import AdapterSpec

from .adapters import ALIASES, DjangoAdapter, setup_django


@pytest.fixture(scope="session")
def django_project(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Configure Django once per session and migrate both databases (the mark table by its migration)."""
    schema = "dj_" + uuid.uuid4().hex[:12]
    plain_url = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    # Read by tests/django/settings.py, here and in spawned children; removed at the end.
    names = {
        "FENCING_DJANGO_POSTGRES": plain_url,
        "FENCING_DJANGO_SCHEMA": schema,
        "FENCING_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "gates.db"),
    }
    os.environ.update(names)
    try:
        setup_django()
        from django.core.management import call_command

        for alias in ALIASES.values():
            call_command("migrate", database=alias, run_syncdb=True, verbosity=0)
        yield
    finally:
        from django.db import connections

        connections.close_all()
        for name in names:
            os.environ.pop(name, None)
        with psycopg.connect(plain_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=sorted(ALIASES))
def adapter(request: pytest.FixtureRequest, django_project: None) -> Iterator[DjangoAdapter]:
    """The contract suite's adapter for DjangoGate on one database, with empty tables."""
    built = DjangoAdapter(AdapterSpec("django", ALIASES[request.param]))
    built.clear()
    yield built
    built.close()
