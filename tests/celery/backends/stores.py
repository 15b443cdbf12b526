"""The result stores the backend contract suite runs over, each as a fenced app and a plain one on the same storage.

``redis``: ``fenced+redis://`` (the entry point), keys under the test's prefix;
``postgresql``: ``fenced+db+postgresql+psycopg://`` (Celery's SQLAlchemy
backend), tables named after the test; ``django-postgresql`` and
``django-sqlite``: ``fenced+django-db`` on the test project's databases
(:mod:`tests.django.settings`, this session's schema and file), rows of the
test's own task ids. The plain app is the negative control: the same calls
with the guarantee switched off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from celery import Celery

from tests.fixtures.services import armed

#: Every store, as the suite's parameters name them.
STORES = ("redis", "postgresql", "django-postgresql", "django-sqlite")
DJANGO_ALIASES = {"django-postgresql": "postgres", "django-sqlite": "default"}


@dataclass
class Store:
    """One store of one test: the backend URL with and without fencing, and the settings both apps take."""

    kind: str
    fenced_url: str
    plain_url: str
    conf: dict[str, Any] = field(default_factory=dict)
    #: Environment a worker process needs to reach the same store.
    env: dict[str, str] = field(default_factory=dict)
    apps: list[Celery] = field(default_factory=list)

    def app(self, *, fenced: bool = True) -> Celery:
        app = Celery(f"backend-contract-{self.kind}", backend=self.fenced_url if fenced else self.plain_url)
        app.conf.update(self.conf)
        self.apps.append(app)
        if fenced and self.kind == "redis":
            armed(app.backend)  # the tests make their tokens by hand
        return app

    def worker_env(self) -> dict[str, str]:
        return {"FT_CONF": json.dumps(self.conf), **self.env}

    @property
    def worker_app(self) -> str:
        """The module ``celery -A`` loads for a worker on this store: the Django stores need Django set up first."""
        if self.kind in DJANGO_ALIASES:
            return "tests.celery.backends.django_worker"
        return "tests.celery.app_under_test"

    def stored_result(self, app: Celery, task_id: str) -> tuple[str, Any] | None:
        """The state and result stored for *task_id*, read from the store itself (the key, the table row), or None."""
        if self.kind == "redis":
            raw = app.backend.client.get(app.backend.get_key_for_task(task_id))
            meta = json.loads(raw) if raw else None
            return None if meta is None else (meta["status"], meta["result"])
        if self.kind == "postgresql":
            url = self.plain_url.removeprefix("db+").replace("postgresql+psycopg://", "postgresql://")
            table = self.conf["database_table_names"]["task"]
            with psycopg.connect(url, connect_timeout=5) as conn:
                row = conn.execute(f'SELECT status, result FROM "{table}" WHERE task_id = %s', (task_id,)).fetchone()
            return None if row is None else (row[0], json.loads(row[1]))  # encoded by result_serializer (JSON)
        from django_celery_results.models import TaskResult

        found = TaskResult.objects.using(DJANGO_ALIASES[self.kind]).filter(task_id=task_id).first()
        return None if found is None else (found.status, json.loads(found.result))

    def has_fence(self, app: Celery, task_id: str) -> bool:
        """Whether the fenced backend of *app* holds a fence for *task_id*."""
        backend = app.backend
        if self.kind == "redis":
            return bool(backend.client.exists(backend.get_key_for_fence(task_id)))
        if self.kind == "postgresql":
            table = backend.fence_table
            with backend.ResultSession() as session:
                return session.execute(table.select().where(table.c.resource == task_id)).first() is not None
        from celery_fencing.contrib.django.models import ResultFence

        return bool(ResultFence.objects.using(DJANGO_ALIASES[self.kind]).filter(resource=task_id).exists())


def redis_store(redis_url: str, name: str) -> Store:
    conf = {"result_backend_transport_options": {"global_keyprefix": f"{name}:"}}
    return Store("redis", "fenced+" + redis_url, redis_url, conf)


def postgresql_store(postgres_url: str, name: str) -> Store:
    names = {"task": f"{name}_taskmeta", "group": f"{name}_tasksetmeta", "fence": f"{name}_taskfence"}
    return Store("postgresql", "fenced+db+" + postgres_url, "db+" + postgres_url, {"database_table_names": names})


def drop_postgresql_tables(postgres_url: str, store: Store) -> None:
    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True, connect_timeout=5) as conn:
        for table in store.conf["database_table_names"].values():
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')
    # Celery renames its models' tables for the whole process: give them their names back.
    from celery.backends.database.models import Task, TaskExtended, TaskSet

    for model in (Task, TaskExtended, TaskSet):
        model.configure()


def django_store(kind: str) -> Store:
    from tests.django import routers

    alias = DJANGO_ALIASES[kind]
    routers.results_alias = alias
    return Store(kind, "fenced+django-db", "django-db", env={"FENCING_DJANGO_RESULTS": alias})
