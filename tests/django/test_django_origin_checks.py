"""Origin checks at DjangoGate, on PostgreSQL and SQLite: with ``verifier=`` every way the gate takes a token
(claim, transaction, guard, fenced_update) refuses unsigned, forged and implausible tokens before any query,
mark and data unchanged; the negative control shows a gate without one taking a forged token and being poisoned.

The forgeries are those of tests/security/test_origin_checks.py, where the other gates meet them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from celery_fencing import (
    MAX_TOKEN_VALUE,
    FencingToken,
    ForgedTokenError,
    GrantorMismatchError,
    PlausibilityBound,
    SQLiteTokenSource,
    StaleTokenError,
    TokenSigner,
)
from celery_fencing.gates.django import DjangoGate
from celery_fencing.signing import SigningTokenSource
from celery_fencing.token import Mark
from tests.security.test_origin_checks import KEY_1, _forgeries

from .adapters import DjangoAdapter

RESOURCE = "account:1"


@pytest.fixture
def source(tmp_path: Path) -> Iterator[SQLiteTokenSource]:
    """A real grantor: a SQLite token file."""
    opened = SQLiteTokenSource(tmp_path / "tokens.db")
    yield opened
    opened.close()


def _takers(gate: DjangoGate, adapter: DjangoAdapter) -> dict[str, Callable[[FencingToken], object]]:
    """Every way a DjangoGate takes a token, each writing the balance row (value 0) if it gets through.

    Each runs inside the caller's atomic block (see _refuses and _takes), which guard() needs."""
    row = adapter.items.filter(key=RESOURCE)

    def in_transaction(token: FencingToken) -> None:
        with gate.transaction(token):
            row.update(value=0)

    def in_guard(token: FencingToken) -> None:
        gate.guard(token)
        row.update(value=0)

    return {
        "claim": gate.claim,
        "transaction": in_transaction,
        "guard": in_guard,
        "fenced_update": lambda token: gate.fenced_update(row, token, resource_field="resource", value=0),
    }


def _balance(adapter: DjangoAdapter) -> tuple[int, int | None]:
    row = adapter.items.get(key=RESOURCE)
    return row.value, row.fence


def _refuses(
    adapter: DjangoAdapter, gate: DjangoGate, refused: Mapping[str, tuple[FencingToken, type]], balance: tuple[int, Any]
) -> None:
    """Each token is refused with its error every way, sending no query (each in an atomic block of the caller's,
    whose BEGIN on SQLite is not the gate's), and changes neither the mark nor the balance row."""
    mark = gate.mark(RESOURCE)
    for name, (token, error) in refused.items():
        for way, take in _takers(gate, adapter).items():
            with transaction.atomic(using=adapter.alias):
                with CaptureQueriesContext(connections[adapter.alias]) as queries, pytest.raises(error):
                    take(token)
                assert queries.captured_queries == [], (name, way, queries.captured_queries)
        assert gate.mark(RESOURCE) == mark, name
        assert _balance(adapter) == balance, name


def _takes(adapter: DjangoAdapter, gate: DjangoGate, token: FencingToken) -> None:
    """The token is accepted every way (each in an atomic block of the caller's): it is the mark, its writes landed."""
    for take in _takers(gate, adapter).values():
        with transaction.atomic(using=adapter.alias):
            take(token)
    assert gate.mark(RESOURCE) == Mark(RESOURCE, token.value, token.grantor)
    assert _balance(adapter) == (0, token.value)


def test_signed_mode_refuses_unsigned_and_forged_tokens(adapter: DjangoAdapter, source: SQLiteTokenSource) -> None:
    """A DjangoGate holding the key takes signed tokens everywhere and refuses every forgery before any query."""
    service = SigningTokenSource(source, TokenSigner({"k1": KEY_1}))
    gate = DjangoGate(adapter.alias, verifier=TokenSigner({"k1": KEY_1}))
    good = service.mint(RESOURCE)
    assert good.signature is not None and good.signature.startswith("k1:")
    adapter.items.create(key=RESOURCE, value=0, resource=RESOURCE)
    _takes(adapter, gate, good)
    assert gate.fenced_update(adapter.items.filter(key=RESOURCE), good, resource_field="resource", value=100) == 1
    forgeries = {name: (forged, ForgedTokenError) for name, forged in _forgeries(good).items()}
    _refuses(adapter, gate, forgeries, (100, good.value))
    # The next signed token still passes everywhere: nothing was poisoned.
    _takes(adapter, gate, service.mint(RESOURCE))


def test_plausibility_bound_refuses_tokens_the_source_cannot_have_issued(
    adapter: DjangoAdapter, source: SQLiteTokenSource
) -> None:
    """A bound on a real SQLite grantor: honest tokens pass, values above its counter and grantor-less tokens are
    refused before any query, another grantor's raise GrantorMismatchError; mark and data unchanged."""
    gate = DjangoGate(adapter.alias, verifier=PlausibilityBound(source, margin=0))
    adapter.items.create(key=RESOURCE, value=100, resource=RESOURCE)
    honest = source.mint(RESOURCE)
    gate.claim(honest)
    assert gate.mark(RESOURCE) == Mark(RESOURCE, honest.value, honest.grantor)
    refused = {
        "max": (dataclasses.replace(honest, value=MAX_TOKEN_VALUE), ForgedTokenError),
        "next": (dataclasses.replace(honest, value=honest.value + 1), ForgedTokenError),
        "far-ahead": (dataclasses.replace(honest, value=honest.value + 1_000_000), ForgedTokenError),
        "no-grantor": (dataclasses.replace(honest, grantor=None), ForgedTokenError),
        "other-grantor": (dataclasses.replace(honest, grantor="sqlite-elsewhere"), GrantorMismatchError),
    }
    _refuses(adapter, gate, refused, (100, None))
    # Minted after the bound last read the counter: it reads again, and the honest token passes everywhere.
    _takes(adapter, gate, source.mint(RESOURCE))


def test_without_a_verifier_one_forged_token_poisons_the_mark(
    adapter: DjangoAdapter, source: SQLiteTokenSource
) -> None:
    """Negative control: the same forged token that the verifying gates refuse is taken by a DjangoGate without
    a verifier, and every honest token is refused after it."""
    service = SigningTokenSource(source, TokenSigner({"k1": KEY_1}))
    gate = DjangoGate(adapter.alias)
    good = service.mint(RESOURCE)
    gate.claim(good)
    forged = _forgeries(good)["value-raised"]
    gate.claim(forged)
    assert gate.mark(RESOURCE) == Mark(RESOURCE, MAX_TOKEN_VALUE, good.grantor)
    with pytest.raises(StaleTokenError):
        gate.claim(service.mint(RESOURCE))
