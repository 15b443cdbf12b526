"""A fenced task runs in a real worker and gets a token from the configured source."""

from __future__ import annotations

import pytest

from .conftest import Scenario


@pytest.mark.parametrize("pool", ["solo", "prefork", "threads"])
def test_fenced_task_gets_increasing_tokens(scenario: Scenario, pool: str) -> None:
    """Each execution of a fenced task carries a fresh token, strictly above the last one."""
    scenario.worker("w1", pool=pool, concurrency=2 if pool != "solo" else 1)
    first = scenario.send("whoami", "x").get(timeout=30)
    second = scenario.send("whoami", "x").get(timeout=30)
    assert first["resource"] == "plain:x"
    assert second["token"] > first["token"]
