"""Harness fixtures for the embedded sources. ZooKeeper harnesses live beside them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import SourceHarness


@pytest.fixture
def memory_harness() -> Iterator[SourceHarness]:
    harness = SourceHarness("memory", "memory://", shared_across_processes=False)
    yield harness
    harness.close_all()


@pytest.fixture
def sqlite_harness(tmp_path: Path) -> Iterator[SourceHarness]:
    db = tmp_path / "tokens.db"
    harness = SourceHarness("sqlite", f"sqlite:///{db}")

    def restart() -> None:
        # A "restart" of the embedded grantor: every connection closes, new ones open the file again.
        harness.close_all()

    def make_unavailable() -> str:
        # An unwritable location stands in for a grantor that cannot be reached.
        blocked = tmp_path / "no-such-dir" / "tokens.db"
        return f"sqlite:///{blocked}"

    harness.restart = restart
    harness.make_unavailable = make_unavailable
    yield harness
    harness.close_all()
