"""ContainerFaults.pause against a stand-in for docker-py's container: retries the freezer's give-up, nothing else.

A pure unit test of the retry rule; the real pause (a worker container frozen
by the cgroup freezer) is exercised by tests/containers/.
"""

from __future__ import annotations

import pytest

docker_errors = pytest.importorskip("docker.errors")

from celery_fencing.testing.containers import faults  # noqa: E402
from celery_fencing.testing.containers.faults import ContainerFaults  # noqa: E402

FREEZE_GAVE_UP = "Cannot pause container 78ab: OCI runtime pause failed: unable to freeze: unknown"


class FakeDockerContainer:
    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.pauses = 0
        self.paused = False

    def pause(self) -> None:
        self.pauses += 1
        if self.failures:
            raise docker_errors.APIError(self.failures.pop(0))
        self.paused = True

    def unpause(self) -> None:
        self.paused = False


class Wrapped:
    """pytest-celery's container wrapper: the docker-py container is its ``_container``."""

    def __init__(self, container: FakeDockerContainer) -> None:
        self._container = container


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "PAUSE_RETRY_DELAY", 0.0)


def _faults() -> ContainerFaults:
    return ContainerFaults(lab=None)  # type: ignore[arg-type]  # pause and heal never look at the lab


def test_pause_tries_again_when_the_freezer_gave_up() -> None:
    container = FakeDockerContainer([FREEZE_GAVE_UP, FREEZE_GAVE_UP])
    fault = _faults()
    fault.pause(Wrapped(container))
    assert container.paused and container.pauses == 3
    fault.heal()
    assert not container.paused, "heal thaws a container paused after retries"


def test_pause_gives_up_after_its_attempts_with_the_runtime_error() -> None:
    container = FakeDockerContainer([FREEZE_GAVE_UP] * faults.PAUSE_ATTEMPTS)
    with pytest.raises(docker_errors.APIError, match="unable to freeze"):
        _faults().pause(Wrapped(container))
    assert container.pauses == faults.PAUSE_ATTEMPTS and not container.paused


def test_pause_raises_any_other_error_at_once() -> None:
    container = FakeDockerContainer(["Container 78ab is not running"])
    with pytest.raises(docker_errors.APIError, match="not running"):
        _faults().pause(Wrapped(container))
    assert container.pauses == 1
