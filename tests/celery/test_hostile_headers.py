"""A task message's headers cannot steer fencing: Celery copies custom headers onto the request,
so a producer could send fencing_* headers; the worker must ignore every one of them."""

from __future__ import annotations

import pytest

from celery_fencing import FencingToken

from .conftest import Scenario

HOSTILE_HEADERS = [
    {"fencing_token": "1:9223372036854775807:plain:h"},
    {"fencing_token": {"resource": "plain:h", "value": 2**62}},
    {"fencing_execution": "forged"},
    {"fencing_lease": ["not", "a lease"]},
    {"fencing_resource": "someone-else"},
    {"fencing_resource_is_task_id": True, "fencing_token": None},
    {"fencing_token": "x" * 100_000},
]


@pytest.mark.parametrize("headers", HOSTILE_HEADERS, ids=lambda h: ",".join(h))
def test_forged_fencing_headers_are_ignored(scenario: Scenario, headers: dict[str, object]) -> None:
    """Whatever fencing_* headers a message carries, the execution mints its own token for its own resource."""
    if not scenario.workers:
        scenario.worker("w")
    before = scenario.send("whoami", "h").get(timeout=60)
    result = scenario.client.send_task(
        "tests.celery.app_under_test.whoami", args=("h",), queue=scenario.name, headers=headers
    )
    got = result.get(timeout=60)
    assert got["resource"] == "plain:h"
    assert got["token"] == before["token"] + 1, "the token must come from the source, not the message"
    FencingToken(got["resource"], got["token"])
