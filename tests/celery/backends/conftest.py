"""The backend contract suite's fixtures: one store per parameter (see :mod:`.stores`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .stores import STORES, Store, django_store, drop_postgresql_tables, postgresql_store, redis_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, unique_name: str) -> Iterator[Store]:
    """One result store, its fenced and plain apps closed and its keys or tables removed after the test."""
    kind = request.param
    built: Store
    if kind == "redis":
        built = redis_store(request.getfixturevalue("redis_url"), unique_name)
    elif kind == "postgresql":
        built = postgresql_store(request.getfixturevalue("postgres_url"), unique_name)
    else:
        request.getfixturevalue("django_project")
        built = django_store(kind)
    yield built
    for app in built.apps:
        _clean(built, app, unique_name)
        app.close()
    if kind == "postgresql":
        drop_postgresql_tables(request.getfixturevalue("postgres_url"), built)


def _clean(store: Store, app: Any, name: str) -> None:
    if store.kind == "redis":
        keys = list(app.backend.client.scan_iter(f"{name}:*"))
        if keys:
            app.backend.client.delete(*keys)
