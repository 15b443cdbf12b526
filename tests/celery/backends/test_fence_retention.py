"""Retention of the database backends' fence rows: they expire, and Celery's cleanup deletes them, never early.

Over ``fenced+db+`` on PostgreSQL, SQLite and MariaDB (no ``UPDATE ...
RETURNING``: the two-statement path) and ``fenced+django-db`` on PostgreSQL
and SQLite. Windows of one second are waited out on the database's own clock
(the clock the rows expire on), polled, never slept. Cleanup runs as beat runs
it: the ``celery.backend_cleanup`` task.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery, states
from celery.app.task import Context

from celery_fencing import FencingToken
from celery_fencing.celery.backend_db import has_expiry_column
from celery_fencing.celery.db_fence import database_now
from celery_fencing.gates.sql.schema import result_fence_table
from celery_fencing.testing import wait_for

from .stores import DJANGO_ALIASES, Store, django_store, redis_store

DATABASE_STORES = ("db-postgresql", "db-sqlite", "db-mariadb", "django-postgresql", "django-sqlite")
SQLALCHEMY_STORES = ("db-postgresql", "db-sqlite", "db-mariadb")


def request_with(token: FencingToken | None) -> Context:
    request = Context(id="t", task="x", args=(), kwargs={})
    if token is not None:
        request.fencing_token = token
    return request


def window(store: Store, result_expires: float | None, *, horizon: float = 1, once: float | None = None) -> None:
    """Give the store's apps a result_expires, a re-delivery horizon (visibility_timeout) and a once-retention."""
    store.conf.update(result_expires=result_expires, broker_transport_options={"visibility_timeout": horizon})
    if once is not None:
        store.conf["fencing_once_retention"] = once


def sqlalchemy_url(store: Store) -> str:
    return store.plain_url.removeprefix("db+")


def _sqlalchemy_store(kind: str, url: str, name: str) -> Store:
    names = {"task": f"{name}_taskmeta", "group": f"{name}_tasksetmeta", "fence": f"{name}_taskfence"}
    return Store(kind, "fenced+db+" + url, "db+" + url, {"database_table_names": names})


def _drop_tables(store: Store) -> None:
    engine = sa.create_engine(sqlalchemy_url(store))
    try:
        with engine.begin() as conn:
            for table in store.conf["database_table_names"].values():
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {engine.dialect.identifier_preparer.quote(table)}")
    finally:
        engine.dispose()
    # Celery renames its models' tables for the whole process: give them their names back.
    from celery.backends.database.models import Task, TaskExtended, TaskSet

    for model in (Task, TaskExtended, TaskSet):
        model.configure()


def _store(request: pytest.FixtureRequest, kind: str, name: str, tmp_path: Path) -> Store:
    if kind == "redis":
        return redis_store(request.getfixturevalue("redis_url"), name)
    if kind == "db-postgresql":
        return _sqlalchemy_store(kind, request.getfixturevalue("postgres_url"), name)
    if kind == "db-sqlite":
        return _sqlalchemy_store(kind, f"sqlite:///{tmp_path / 'results.db'}", name)
    if kind == "db-mariadb":
        return _sqlalchemy_store(kind, request.getfixturevalue("mariadb_url"), name)
    request.getfixturevalue("django_project")
    return django_store(kind)


def _close(store: Store, name: str) -> None:
    for app in store.apps:
        if store.kind == "redis":
            keys = list(app.backend.client.scan_iter(f"{name}:*"))
            if keys:
                app.backend.client.delete(*keys)
        app.close()
    if store.kind in SQLALCHEMY_STORES:
        _drop_tables(store)


@pytest.fixture(params=DATABASE_STORES)
def db_store(request: pytest.FixtureRequest, unique_name: str, tmp_path: Path) -> Iterator[Store]:
    """One database result store (its tables or rows the test's own), its apps closed after the test."""
    built = _store(request, request.param, unique_name, tmp_path)
    yield built
    _close(built, unique_name)


@pytest.fixture(params=("db-postgresql", "db-sqlite", "db-mariadb"))
def sqlalchemy_store(request: pytest.FixtureRequest, unique_name: str, tmp_path: Path) -> Iterator[Store]:
    """One ``fenced+db+`` store, its tables dropped after the test."""
    built = _store(request, request.param, unique_name, tmp_path)
    yield built
    _close(built, unique_name)


@pytest.fixture(params=("redis", *DATABASE_STORES))
def any_store(request: pytest.FixtureRequest, unique_name: str, tmp_path: Path) -> Iterator[Store]:
    """Every fenced store, Redis (the reference) first."""
    built = _store(request, request.param, unique_name, tmp_path)
    yield built
    _close(built, unique_name)


def fence_of(store: Store, app: Celery, task_id: str) -> tuple[int, int | None] | None:
    """(mark, expires_at) of the task's fence row, read from the table itself, or None when there is none."""
    if store.kind in DJANGO_ALIASES:
        from celery_fencing.contrib.django.models import ResultFence

        rows = ResultFence.objects.using(DJANGO_ALIASES[store.kind]).filter(resource=task_id)
        found: Any = rows.values_list("token", "expires_at").first()
        return None if found is None else (int(found[0]), found[1])
    t = app.backend.fence_table
    engine = sa.create_engine(sqlalchemy_url(store))
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.select(t.c.token, t.c.expires_at).where(t.c.resource == task_id)).first()
    finally:
        engine.dispose()
    return None if row is None else (int(row[0]), row[1])


def has_fence(store: Store, app: Celery, task_id: str) -> bool:
    if store.kind == "redis":
        return bool(app.backend.client.exists(app.backend.get_key_for_fence(task_id)))
    return fence_of(store, app, task_id) is not None


def database_clock(store: Store) -> int:
    """The database's clock in epoch seconds: the clock the fence rows expire on."""
    if store.kind in DJANGO_ALIASES:
        from django.db import connections

        connection = connections[DJANGO_ALIASES[store.kind]]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {database_now(connection.vendor)}")
            return int(cursor.fetchone()[0])
    engine = sa.create_engine(sqlalchemy_url(store))
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql(f"SELECT {database_now(engine.dialect.name)}").scalar_one())
    finally:
        engine.dispose()


def wait_until_past(store: Store, epoch: int) -> None:
    """Poll the database's clock until it is past *epoch*: a row that expires then has expired."""
    wait_for(lambda: database_clock(store) >= epoch, 15, f"the database's clock to reach {epoch}")


def cleanup(app: Celery) -> None:
    """Run Celery's own cleanup, as beat runs it: the celery.backend_cleanup task."""
    app.tasks["celery.backend_cleanup"]()


def state_of(app: Celery, tid: str) -> str:
    return str(app.backend.get_task_meta(tid)["status"])


@pytest.mark.parametrize("result_expires", [1, None], ids=["expiring", "control-kept-for-good"])
def test_the_fence_of_a_task_that_stored_no_result_expires_and_cleanup_deletes_it(
    db_store: Store, unique_name: str, result_expires: int | None
) -> None:
    """A claimed fence with no result expires after its window and cleanup deletes it; without result_expires
    (the control: results kept for good) it has no expiry and stays."""
    window(db_store, result_expires)
    app, tid = db_store.app(), unique_name
    before = database_clock(db_store)
    app.backend.claim_result(tid, FencingToken(tid, 9))
    after = database_clock(db_store)
    found = fence_of(db_store, app, tid)
    assert found is not None
    mark, expires_at = found
    assert mark == 9
    if result_expires is None:
        assert expires_at is None
        wait_until_past(db_store, after + 2)
        cleanup(app)
        assert fence_of(db_store, app, tid) == (9, None), "a fence without expiry is kept for good"
        return
    assert expires_at is not None and before + 1 <= expires_at <= after + 1, "one second after the claim"
    wait_until_past(db_store, expires_at)
    cleanup(app)
    assert fence_of(db_store, app, tid) is None


def test_a_fence_row_inside_its_window_survives_cleanup(db_store: Store, unique_name: str) -> None:
    """With result_expires of an hour, the row of a stored result expires an hour after its write, and cleanup keeps
    it and its result."""
    window(db_store, 3600)
    app, tid = db_store.app(), unique_name
    app.backend.claim_result(tid, FencingToken(tid, 9))
    before = database_clock(db_store)
    app.backend.store_result(tid, "done", states.SUCCESS, request=request_with(FencingToken(tid, 9)))
    after = database_clock(db_store)
    found = fence_of(db_store, app, tid)
    assert found is not None and found[1] is not None
    assert before + 3600 <= found[1] <= after + 3600, "an hour after the write"
    cleanup(app)
    assert fence_of(db_store, app, tid) == found
    assert app.AsyncResult(tid).get(timeout=10) == "done"


@pytest.mark.parametrize(
    ("result_expires", "horizon", "once", "expected"),
    [(1, 600, None, 600), (1, 1, 900, 900), (7200, 1, 60, 7200)],
    ids=["horizon-over-result-expires", "once-retention-over-result-expires", "result-expires-over-once-retention"],
)
def test_the_window_is_result_expires_but_never_shorter_than_the_once_retention(
    db_store: Store, unique_name: str, result_expires: int, horizon: int, once: int | None, expected: int
) -> None:
    """The row's window is max(result_expires, fencing_once_retention), the once-retention being at least the
    re-delivery horizon: a copy the broker may still deliver finds the row."""
    window(db_store, result_expires, horizon=horizon, once=once)
    app, tid = db_store.app(), unique_name
    before = database_clock(db_store)
    app.backend.claim_result(tid, FencingToken(tid, 9))
    after = database_clock(db_store)
    found = fence_of(db_store, app, tid)
    assert found is not None and found[1] is not None
    assert before + expected <= found[1] <= after + expected


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "control"])
def test_the_fence_outlives_its_expired_result_within_the_horizon(
    db_store: Store, unique_name: str, fenced: bool
) -> None:
    """result_expires of 1 s under a 10-minute horizon: cleanup deletes the result but keeps the fence, so a stale
    copy's late write is dropped; the plain backend (control) stores it."""
    window(db_store, 1, horizon=600)
    app, tid = db_store.app(fenced=fenced), unique_name
    app.backend.store_result(tid, "newer", states.SUCCESS, request=request_with(FencingToken(tid, 9)))
    written = database_clock(db_store)
    wait_until_past(db_store, written + 2)
    cleanup(app)
    assert state_of(app, tid) == states.PENDING, "cleanup deleted the expired result"
    app.backend.store_result(tid, "stale", states.SUCCESS, request=request_with(FencingToken(tid, 7)))
    if fenced:
        assert fence_of(db_store, app, tid) is not None and fence_of(db_store, app, tid)[0] == 9  # type: ignore[index]
        assert state_of(app, tid) == states.PENDING, "the stale write was dropped"
    else:
        assert app.AsyncResult(tid).get(timeout=10) == "stale"


def test_after_its_fence_is_gone_a_late_stale_write_is_a_first_write(any_store: Store, unique_name: str) -> None:
    """As on Redis once the fence hash's TTL ran out: after cleanup deleted an expired fence, a stale token's write
    is stored and fences the result anew; before cleanup the expired row still drops it (databases only)."""
    window(any_store, 1)
    app, tid = any_store.app(), unique_name
    app.backend.claim_result(tid, FencingToken(tid, 9))
    app.backend.store_result(tid, "newer", states.SUCCESS, request=request_with(FencingToken(tid, 9)))
    if any_store.kind == "redis":
        wait_for(lambda: not has_fence(any_store, app, tid), 15, "the fence hash's TTL to run out")
    else:
        found = fence_of(any_store, app, tid)
        assert found is not None and found[1] is not None
        wait_until_past(any_store, found[1] + 1)  # the result (date_done + 1 s) has expired too
        app.backend.store_result(tid, "stale", states.SUCCESS, request=request_with(FencingToken(tid, 7)))
        assert app.AsyncResult(tid).get(timeout=10) == "newer", "an expired row fences until cleanup deletes it"
        cleanup(app)
        assert not has_fence(any_store, app, tid)
    app.backend.store_result(tid, "stale", states.SUCCESS, request=request_with(FencingToken(tid, 7)))
    assert app.AsyncResult(tid).get(timeout=10) == "stale"
    assert has_fence(any_store, app, tid), "the late write fences the result again"
    app.backend.store_result(tid, "older", states.SUCCESS, request=request_with(FencingToken(tid, 5)))
    assert app.AsyncResult(tid).get(timeout=10) == "stale"


def _legacy_table(store: Store, rows: list[tuple[str, int]]) -> None:
    """The fence table as it was made before expires_at, holding *rows* (task id, mark)."""
    name = store.conf["database_table_names"]["fence"]
    table = result_fence_table(sa.MetaData(), name)
    engine = sa.create_engine(sqlalchemy_url(store))
    try:
        table.create(engine)
        with engine.begin() as conn:
            for task_id, token in rows:
                conn.execute(table.insert().values(resource=task_id, token=token))
    finally:
        engine.dispose()


def test_a_fence_table_made_before_expiry_gets_the_column_on_first_use(
    sqlalchemy_store: Store, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An old fence table gets expires_at on first use; its old rows (NULL) go with their results in cleanup, as
    before, and new rows expire."""
    window(sqlalchemy_store, 1, horizon=600)
    old_with_result, old_alone = f"{unique_name}-a", f"{unique_name}-b"
    _legacy_table(sqlalchemy_store, [(old_with_result, 3), (old_alone, 3)])
    app = sqlalchemy_store.app()
    assert app.backend.inspect_fence_table().expiring is False
    with caplog.at_level(logging.WARNING, logger="celery_fencing"):
        app.backend.claim_result(unique_name, FencingToken(unique_name, 9))
    assert any("added the expires_at column" in r.getMessage() for r in caplog.records)
    assert app.backend.inspect_fence_table().expiring is True
    found = fence_of(sqlalchemy_store, app, unique_name)
    assert found is not None and found[1] is not None
    # The old row's task had stored its result (written here beside the fence), which then expires.
    sqlalchemy_store.app(fenced=False).backend.store_result(old_with_result, "x", states.SUCCESS)
    assert fence_of(sqlalchemy_store, app, old_with_result) == (3, None)
    wait_until_past(sqlalchemy_store, database_clock(sqlalchemy_store) + 2)
    cleanup(app)
    assert fence_of(sqlalchemy_store, app, old_with_result) is None, "a row without expiry goes with its result"
    assert fence_of(sqlalchemy_store, app, old_alone) == (3, None), "a row without expiry nor result is left"
    assert fence_of(sqlalchemy_store, app, unique_name) == found, "a new row stays inside its window"


@pytest.fixture
def dml_only_role(postgres_url: str, unique_name: str) -> Iterator[str]:
    """A PostgreSQL role that may read and write the test's tables but not alter them; its URL."""
    import psycopg

    admin = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    role = f"{unique_name}_dml"
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    user = postgres_url.split("://", 1)[1].split("@", 1)[0]
    yield postgres_url.replace(f"://{user}@", f"://{role}@", 1)
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_without_the_right_to_alter_the_table_the_backend_keeps_working_and_warns(
    postgres_url: str, dml_only_role: str, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database user who may not add expires_at gets a warning naming the ALTER TABLE to run, and claims and
    writes work as before (the rows then go with their results)."""
    import psycopg

    owner = _sqlalchemy_store("db-postgresql", postgres_url, unique_name)
    window(owner, 3600)
    _legacy_table(owner, [])
    owner.app(fenced=False).backend.ResultSession().close()  # Celery's own tables, made by their owner
    names = owner.conf["database_table_names"]
    with psycopg.connect(postgres_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        role = dml_only_role.split("://", 1)[1].split("@", 1)[0]
        for table in names.values():
            conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON "{table}" TO {role}')
        conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    limited = _sqlalchemy_store("db-postgresql", dml_only_role, unique_name)
    window(limited, 3600)
    app = limited.app()
    try:
        with caplog.at_level(logging.WARNING, logger="celery_fencing"):
            app.backend.claim_result(unique_name, FencingToken(unique_name, 9))
        warned = [r.getMessage() for r in caplog.records if "has no expires_at column" in r.getMessage()]
        assert len(warned) == 1 and f"ALTER TABLE {names['fence']} ADD COLUMN expires_at BIGINT NULL" in warned[0]
        app.backend.store_result(
            unique_name, "done", states.SUCCESS, request=request_with(FencingToken(unique_name, 9))
        )
        app.backend.store_result(
            unique_name, "stale", states.SUCCESS, request=request_with(FencingToken(unique_name, 7))
        )
        assert app.AsyncResult(unique_name).get(timeout=10) == "done"
        state = app.backend.inspect_fence_table()
        assert (state.exists, state.expiring) == (True, False) and "ADD COLUMN expires_at" in state.fix
        engine = sa.create_engine(postgres_url)
        with engine.connect() as conn:
            assert not has_expiry_column(conn, app.backend.fence_table)
        engine.dispose()
    finally:
        for made in (owner, limited):
            for each in made.apps:
                each.close()
        _drop_tables(owner)


@pytest.fixture(params=("django-postgresql", "django-sqlite"))
def unmigrated_django(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A fenced+django-db store whose database has celery_fencing migrated to 0004 only (no expires_at)."""
    from django.core.management import call_command

    request.getfixturevalue("django_project")
    store = django_store(request.param)
    alias = DJANGO_ALIASES[request.param]
    call_command("migrate", "celery_fencing", "0004", database=alias, verbosity=0)
    try:
        yield store
    finally:
        for app in store.apps:
            app.close()
        call_command("migrate", "celery_fencing", database=alias, verbosity=0)


def test_before_migration_0005_the_django_backend_keeps_working_and_warns(
    unmigrated_django: Store, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without migration 0005 the Django backend warns once, naming it, and fences as before: its rows go with their
    results in cleanup, a row without a result stays."""
    from celery_fencing.contrib.django.models import ResultFence

    window(unmigrated_django, 1, horizon=600)
    app, claimed = unmigrated_django.app(), f"{unique_name}-claimed"
    rows = ResultFence.objects.using(DJANGO_ALIASES[unmigrated_django.kind])
    with caplog.at_level(logging.WARNING, logger="celery_fencing"):
        app.backend.claim_result(claimed, FencingToken(claimed, 9))
        app.backend.store_result(
            unique_name, "done", states.SUCCESS, request=request_with(FencingToken(unique_name, 9))
        )
        app.backend.store_result(
            unique_name, "stale", states.SUCCESS, request=request_with(FencingToken(unique_name, 7))
        )
    warned = [r.getMessage() for r in caplog.records if "has no expires_at column" in r.getMessage()]
    assert len(warned) == 1 and "0005_resultfence_expires_at" in warned[0] and "manage.py migrate" in warned[0]
    assert app.AsyncResult(unique_name).get(timeout=10) == "done"
    state = app.backend.inspect_fence_table()
    assert (state.exists, state.expiring) == (True, False) and "0005_resultfence_expires_at" in state.fix
    wait_until_past(unmigrated_django, database_clock(unmigrated_django) + 2)
    cleanup(app)
    assert not rows.filter(resource=unique_name).exists(), "the row went with its expired result"
    assert list(rows.filter(resource=claimed).values_list("token", flat=True)) == [9], "no expiry: it stays"
