"""`celery-fencing doctor` and `arm` on the database result backends, through the installed command, on real databases.

doctor looks at the fence table of ``fenced+db+`` (PostgreSQL, SQLite) and
``fenced+django-db`` (the session's Django project, on PostgreSQL and SQLite)
without creating or altering anything; ``arm`` refuses them in one line,
since they have no floor.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from celery import Celery

from celery_fencing import FencingToken
from celery_fencing.cli import main
from celery_fencing.gates.sql.schema import result_fence_table

from .conftest import Done, run_cli

DJANGO_ALIASES = {"django-postgresql": "postgres", "django-sqlite": "default"}


def doctor(app: str, env: dict[str, str]) -> tuple[Done, dict[str, Any]]:
    done = run_cli(["doctor", "-A", app, "--json"], env=env, timeout=120)
    assert "Traceback" not in done.err, done.err
    return done, json.loads(done.out)


def results(report: dict[str, Any], status: str) -> list[dict[str, str]]:
    return [c for c in report["checks"] if c["area"] == "results" and c["status"] == status]


def messages(report: dict[str, Any], status: str) -> list[str]:
    return [c["message"] for c in results(report, status)]


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A SQLAlchemy URL of a database of this test's own: the session's PostgreSQL database, or a new SQLite file."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


@pytest.fixture
def tables(database: str, unique_name: str) -> Iterator[dict[str, str]]:
    """The backend's table names, the test's own; dropped after the test."""
    names = {
        "task": f"{unique_name}_taskmeta",
        "group": f"{unique_name}_tasksetmeta",
        "fence": f"{unique_name}_taskfence",
    }
    yield names
    engine = sa.create_engine(database)
    with engine.begin() as conn:
        for table in names.values():
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    engine.dispose()
    from celery.backends.database.models import Task, TaskExtended, TaskSet

    for model in (Task, TaskExtended, TaskSet):
        model.configure()  # Celery renames its models' tables for the whole process


def env_for(database: str, unique_name: str, redis_url: str, tmp_path: Path, **more: str) -> dict[str, str]:
    return {
        "CFT_BROKER": redis_url,
        "CFT_SOURCE": f"sqlite:///{tmp_path / 'tokens.db'}",
        "CFT_RESULTS": "fenced+db+" + database,
        "CFT_TABLES": unique_name,
        **more,
    }


def table_names(database: str) -> set[str]:
    engine = sa.create_engine(database)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_fence_table_with_its_expiry_passes(
    database: str, tables: dict[str, str], unique_name: str, redis_url: str, tmp_path: Path
) -> None:
    """A fenced+db+ backend whose fence table exists with expires_at: the table answers, the rows' retention is
    reported, and there is no finding about results."""
    app = Celery("made", backend="fenced+db+" + database)
    app.conf.database_table_names = tables
    app.backend.claim_result(unique_name, FencingToken(unique_name, 1))  # makes the table as a worker would
    app.close()
    done, report = doctor("tests.cli.apps.db_results", env_for(database, unique_name, redis_url, tmp_path))
    assert done.code == 0, json.dumps(report, indent=1)
    ok = messages(report, "ok")
    assert any(f"the result fence table {tables['fence']} at" in m and "with its expiry column" in m for m in ok)
    assert any("fence rows expire 86400s after their last write" in m for m in ok), ok
    assert [c for c in report["checks"] if c["area"] == "results" and c["status"] != "ok"] == []


def test_doctor_creates_nothing_on_a_new_database(
    database: str, tables: dict[str, str], unique_name: str, redis_url: str, tmp_path: Path
) -> None:
    """On a database the backend never wrote to, doctor says the fence table is made on first use, and leaves the
    database as it found it (no fence table, none of Celery's)."""
    before = table_names(database)
    done, report = doctor("tests.cli.apps.db_results", env_for(database, unique_name, redis_url, tmp_path))
    assert done.code == 0, json.dumps(report, indent=1)
    assert any("is made on the first claim or write" in m for m in messages(report, "ok"))
    assert table_names(database) == before


def test_a_fence_table_without_expiry_is_a_warning_naming_the_alter_table(
    database: str, tables: dict[str, str], unique_name: str, redis_url: str, tmp_path: Path
) -> None:
    """A fence table made before expires_at: a warning whose fix is the ALTER TABLE to run; doctor does not run it."""
    engine = sa.create_engine(database)
    result_fence_table(sa.MetaData(), tables["fence"]).create(engine)
    done, report = doctor("tests.cli.apps.db_results", env_for(database, unique_name, redis_url, tmp_path))
    assert done.code == 1
    (warning,) = results(report, "warning")
    assert "has no expires_at column" in warning["message"]
    assert f"ALTER TABLE {tables['fence']} ADD COLUMN expires_at BIGINT NULL" in warning["fix"]
    columns = {column["name"] for column in sa.inspect(engine).get_columns(tables["fence"])}
    engine.dispose()
    assert "expires_at" not in columns


def test_results_kept_for_good_are_a_note(
    database: str, tables: dict[str, str], unique_name: str, redis_url: str, tmp_path: Path
) -> None:
    """result_expires = None keeps results and fence rows for good: advice (a note), not a failure."""
    env = env_for(database, unique_name, redis_url, tmp_path, CFT_RESULT_EXPIRES="none")
    done, report = doctor("tests.cli.apps.db_results", env)
    assert done.code == 0, json.dumps(report, indent=1)
    assert any("kept for good" in m for m in messages(report, "note"))


def test_an_unreachable_database_is_an_error(unique_name: str, redis_url: str, tmp_path: Path) -> None:
    """A fenced+db+ backend whose database does not answer is an error, not a traceback."""
    database = "postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2"
    done, report = doctor("tests.cli.apps.db_results", env_for(database, unique_name, redis_url, tmp_path))
    assert done.code == 1
    assert any("the result fence table cannot be read" in m for m in messages(report, "error"))


def test_a_plain_database_backend_is_a_warning_with_the_fenced_url(
    database: str, tables: dict[str, str], unique_name: str, redis_url: str, tmp_path: Path
) -> None:
    """The plain db+ backend lets a stale result overwrite a newer one: a warning whose fix is its fenced+ URL."""
    env = {**env_for(database, unique_name, redis_url, tmp_path), "CFT_RESULTS": "db+" + database}
    done, report = doctor("tests.cli.apps.db_results", env)
    assert done.code == 1
    (warning,) = results(report, "warning")
    assert "plain db+" in warning["message"] and "fenced+db+" in warning["fix"]


@pytest.fixture(params=list(DJANGO_ALIASES))
def django_alias(request: pytest.FixtureRequest) -> str:
    """The alias of the session's Django project the results go to (its databases are migrated)."""
    request.getfixturevalue("django_project")
    return DJANGO_ALIASES[request.param]


def django_env(alias: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    # The Django project's databases come from the FENCING_DJANGO_* the session's fixture put in os.environ.
    return {
        "CFT_BROKER": redis_url,
        "CFT_SOURCE": f"sqlite:///{tmp_path / 'tokens.db'}",
        "FENCING_DJANGO_RESULTS": alias,
    }


def test_a_migrated_django_backend_passes(django_alias: str, redis_url: str, tmp_path: Path) -> None:
    """fenced+django-db on a database with every migration: the fence table answers with its expiry column."""
    done, report = doctor("tests.cli.apps.django_results", django_env(django_alias, redis_url, tmp_path))
    assert done.code == 0, json.dumps(report, indent=1)
    assert any(f"database {django_alias!r}" in m and "with its expiry column" in m for m in messages(report, "ok"))


@pytest.mark.parametrize(
    ("target", "status", "says"),
    [("0004", "warning", "has no expires_at column"), ("0003", "error", "does not exist")],
    ids=["without-0005", "without-0004"],
)
def test_missing_django_migrations_are_reported_with_the_migrate_command(
    django_alias: str, redis_url: str, tmp_path: Path, target: str, status: str, says: str
) -> None:
    """Without migration 0005 the missing expiry is a warning, without 0004 the missing table an error; the fix is
    manage.py migrate for that database."""
    from django.core.management import call_command

    call_command("migrate", "celery_fencing", target, database=django_alias, verbosity=0)
    try:
        done, report = doctor("tests.cli.apps.django_results", django_env(django_alias, redis_url, tmp_path))
    finally:
        call_command("migrate", "celery_fencing", database=django_alias, verbosity=0)
    assert done.code == 1
    (finding,) = results(report, status)
    assert says in finding["message"]
    assert finding["fix"].startswith(f"manage.py migrate celery_fencing --database {django_alias}")


def arm(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["arm", *args], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "gate",
    ["fenced+db+{postgres}", "fenced+django-db", "fenced+django-db://", "{postgres}"],
    ids=["fenced-db", "fenced-django-db", "fenced-django-db-url", "sql-gate"],
)
def test_arm_refuses_database_stores_in_one_line_and_arms_nothing(
    gate: str, postgres_url: str, redis_url: str, unique_name: str
) -> None:
    """arm on a database result backend (or a SQL gate's database) exits 2 with one line saying it has no floor and
    why; a Redis store named before it is not armed either."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        code, out, err = arm(
            "--floor",
            "5",
            "--gate",
            redis_url,
            "--redis-prefix",
            unique_name,
            "--gate",
            gate.format(postgres=postgres_url),
        )
        armed = client.get(f"{unique_name}:floor")
    finally:
        client.delete(f"{unique_name}:floor")
        client.close()
    assert code == 2 and err.count("\n") == 1, err
    assert "only Redis stores have floors" in err and "a restart loses neither" in err, err
    if gate.startswith("fenced+"):
        assert "is a database result backend, which has no floor to raise" in err
    assert armed is None and out == "", "the Redis store named first is not armed"
