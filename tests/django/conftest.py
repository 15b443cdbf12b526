"""The Django gate tests' adapter fixture; the project itself is ``django_project`` (tests/fixtures/django.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gates.adapters import AdapterSpec

from .adapters import ALIASES, DjangoAdapter


@pytest.fixture(params=sorted(ALIASES))
def adapter(request: pytest.FixtureRequest, django_project: None) -> Iterator[DjangoAdapter]:
    """The contract suite's adapter for DjangoGate on one database, with empty tables."""
    built = DjangoAdapter(AdapterSpec("django", ALIASES[request.param]))
    built.clear()
    yield built
    built.close()
