"""A queue and key prefix of its own for each kit test that runs workers of app_under_test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis


@pytest.fixture
def kit_env(redis_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The environment of tests/testing/app_under_test.py for this test (its Redis keys removed after)."""
    env = {"KIT_REDIS_URL": redis_url, "KIT_QUEUE": unique_name}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{unique_name}*"))
    if keys:
        client.delete(*keys)
    client.close()
