"""The gate contract suite's adapter for DjangoGate, and Django set-up for this process and its children."""

from __future__ import annotations

from typing import Any

from celery_fencing import FencingToken, current_token
from celery_fencing.gates.django import DjangoGate, fenced_update
from tests.gates.adapters import AdapterSpec, GateAdapter, append_and_report, reporting_failure

#: Contract kinds -> database alias in tests/django/settings.py.
ALIASES = {"django_postgres": "postgres", "django_sqlite": "default"}


def setup_django() -> None:
    """Configure Django from tests.django.settings (the environment names the databases). Idempotent.

    Through ``settings.configure()``, not ``DJANGO_SETTINGS_MODULE``: that variable
    would reach every worker process later tests start, and Celery's Django fix-up
    would set Django up in them.
    """
    import django
    from django.apps import apps
    from django.conf import settings

    if not settings.configured:
        from tests.django import settings as project

        settings.configure(**{name: getattr(project, name) for name in dir(project) if name.isupper()})
    if not apps.ready:
        django.setup()


def sqlalchemy_engine(alias: str) -> Any:
    """A SQLAlchemy engine on the PostgreSQL database (and schema) of a Django alias, for SQLGate beside DjangoGate."""
    import sqlalchemy as sa
    from django.db import connections

    settings = connections[alias].settings_dict
    return sa.create_engine(
        f"postgresql+psycopg://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}",
        connect_args={"options": settings["OPTIONS"]["options"], "connect_timeout": 5},
    )


class DjangoAdapter(GateAdapter):
    """Transaction mode for writes, with column mode binding each data row to its resource (as SQLAdapter)."""

    def __init__(self, spec: AdapterSpec) -> None:
        setup_django()
        from tests.django.testapp.models import Item, LogEntry

        self.spec = spec
        self.alias = spec.url
        self.gate = DjangoGate(self.alias)
        self.items = Item.objects.using(self.alias)
        self.entries = LogEntry.objects.using(self.alias)
        self._item = Item

    def clear(self) -> None:
        """Empty the mark, data and log tables of this alias (the schema is this session's own)."""
        from django.db import connections

        self.gate.model.objects.using(self.alias).all().delete()
        self.items.all().delete()
        self.entries.all().delete()
        with connections[self.alias].cursor() as cursor:
            cursor.execute("DELETE FROM fencing_applied")

    def write(self, token: Any, key: str, value: int) -> None:
        with self.gate.transaction(token):
            checked = token if token is not None else _current()
            updated = fenced_update(self.items.filter(key=key), checked, resource_field="resource", value=value)
            if not updated:
                self.items.create(key=key, value=value, resource=checked.resource, fence=checked.value)

    def read(self, key: str) -> int | None:
        value: int | None = self.items.filter(key=key).values_list("value", flat=True).first()
        return value

    def plain_write(self, key: str, value: int) -> None:
        self.items.update_or_create(key=key, defaults={"value": value})

    def failing_write(self, token: FencingToken, key: str, value: int) -> None:
        with self.gate.transaction(token):
            self.items.filter(key=key).update(value=value, fence=token.value)
            raise RuntimeError("the task failed after its write, before COMMIT")

    def append(self, token: Any, key: str, item: int) -> None:
        with self.gate.transaction(token):
            self.entries.create(key=key, item=item)

    def log(self, key: str) -> list[int]:
        return list(self.entries.filter(key=key).order_by("id").values_list("item", flat=True))

    def close(self) -> None:
        from django.db import connections

        connections[self.alias].close()


def _current() -> FencingToken:
    token = current_token()
    assert token is not None
    return token


def child_append(alias: str, resource: str, key: str, seed: int, count: int, barrier: Any, queue: Any) -> None:
    """Child-process entry point: set Django up, wait for the others, append random tokens, report."""
    append_and_report(DjangoAdapter(AdapterSpec("django", alias)), resource, key, seed, count, barrier, queue)


def child_apply(alias: str, value: int, start: Any, queue: Any) -> None:
    """Child-process entry point: set Django up, wait for the start, run one execution of "task-1", report."""
    from tests.gates.test_applied_contract import report_one_execution

    with reporting_failure(DjangoAdapter(AdapterSpec("django", alias)), queue) as adapter:
        report_one_execution(adapter, value, start, queue)
