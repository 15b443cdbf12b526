"""DjangoGate in the grantor property suite (hypothesis): on PostgreSQL and SQLite its marks follow the model of
marks with grantors in tests/security/test_grantor_properties.py, for any sequence of claims and writes
(transaction mode and guard), tokens of other grantors and none included.

Here rather than in tests/security because the Django project (its own PostgreSQL schema and SQLite file)
is set up by this directory's conftest; the model, the operations and the settings are imported, not copied."""

from __future__ import annotations

import uuid

from django.db import transaction
from hypothesis import given

from celery_fencing import FencingToken
from tests.security.test_grantor_properties import ON_A_DATABASE, _check_against_model, ops

from .adapters import DjangoAdapter


@ON_A_DATABASE
@given(ops)
def test_django_gate_follows_the_grantor_model(
    adapter: DjangoAdapter, operations: list[tuple[str, str, int, str | None]]
) -> None:
    """DjangoGate's upsert follows the model in claims, gate.transaction() and guard() in the caller's block."""
    ns = uuid.uuid4().hex[:10] + ":"

    def write(token: FencingToken) -> None:
        key = f"{ns}key-{token.resource}"
        if token.value % 2:
            adapter.write(token, key, 1)
        else:
            with transaction.atomic(using=adapter.alias):
                adapter.gate.guard(token)
                adapter.entries.create(key=key, item=token.value)

    _check_against_model(adapter.gate, write, operations, ns)
