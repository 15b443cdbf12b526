"""The Django gate tests' fixtures: an adapter per database, PostgreSQL's alone, and a database no migration has
touched; the project itself is ``django_project`` (tests/fixtures/django.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.gates.adapters import AdapterSpec

from .adapters import ALIASES, DjangoAdapter


def _cleared_adapter(alias: str) -> Iterator[DjangoAdapter]:
    built = DjangoAdapter(AdapterSpec("django", alias))
    built.clear()
    yield built
    built.close()


@pytest.fixture(params=sorted(ALIASES))
def adapter(request: pytest.FixtureRequest, django_project: None) -> Iterator[DjangoAdapter]:
    """The contract suite's adapter for DjangoGate on one database, with empty tables."""
    yield from _cleared_adapter(ALIASES[request.param])


@pytest.fixture
def pg(django_project: None) -> Iterator[DjangoAdapter]:
    """The adapter on PostgreSQL alone, with empty tables."""
    yield from _cleared_adapter("postgres")


@pytest.fixture(params=sorted(ALIASES))
def fresh_database(
    request: pytest.FixtureRequest, django_project: None, postgres_url: str, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    """A database no migration has touched: an empty PostgreSQL schema or SQLite file, and its environment."""
    alias = ALIASES[request.param]
    schema = "djm_" + uuid.uuid4().hex[:12]
    plain_url = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    sqlite_path = tmp_path / "fresh.db"
    environ = {"FENCING_DJANGO_SCHEMA": schema, "FENCING_DJANGO_SQLITE": str(sqlite_path)}
    if alias == "postgres":
        environ["SQLALCHEMY_URL"] = postgres_url.replace("postgresql://", "postgresql+psycopg://", 1)
        environ["FENCING_DJANGO_SCHEMA_FOR_SA"] = schema
    else:
        environ["SQLALCHEMY_URL"] = f"sqlite:///{sqlite_path}"
    with psycopg.connect(plain_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield alias, environ
    finally:
        with psycopg.connect(plain_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
