"""Whole-host faults on worker containers: frozen (``docker pause``) and partitioned, then healed.

``docker pause`` freezes every process of the container with the cgroup
freezer: the worker's heartbeats, its ZooKeeper session pings and the task body
stop at once, as a VM freeze or a long GC stop would stop them, and nothing
inside can notice until it is thawed. A partition disconnects the container
from one of the lab's networks (ZooKeeper's, or the broker's and gates'); its
sockets on that network go dead without a reset, as behind a broken switch.
"""

from __future__ import annotations

import time
from typing import Any

from .lab import ContainerLab

#: ``docker pause`` attempts before giving up. The cgroup freezer gives up on its
#: own when a process does not reach the frozen state in time (busy machine, a
#: process mid-syscall), thaws the container and reports "unable to freeze"; a
#: second attempt a moment later freezes it (moby/moby#48205).
PAUSE_ATTEMPTS = 5
PAUSE_RETRY_DELAY = 0.2


class ContainerFaults:
    """Pause and partition a lab's containers; :meth:`heal` undoes whatever is still in force."""

    def __init__(self, lab: ContainerLab) -> None:
        self.lab = lab
        self._paused: list[Any] = []
        self._cut: list[tuple[Any, Any]] = []

    def pause(self, container: Any) -> None:
        """Freeze every process of *container* (``docker pause``), retrying a freeze the kernel gave up on."""
        import docker.errors  # type: ignore[import-untyped]

        for attempt in range(1, PAUSE_ATTEMPTS + 1):
            try:
                container._container.pause()
                break
            except docker.errors.APIError as exc:
                if "unable to freeze" not in str(exc) or attempt == PAUSE_ATTEMPTS:
                    raise
                time.sleep(PAUSE_RETRY_DELAY * attempt)  # back off; the runtime has thawed it again
        self._paused.append(container)

    def unpause(self, container: Any) -> None:
        """Thaw *container*: its processes go on from where they were frozen."""
        container._container.unpause()
        self._paused.remove(container)

    def partition_from_zookeeper(self, container: Any) -> None:
        """Cut *container* off the coordination network: its ZooKeeper session can no longer be kept."""
        self._cut_off(container, self.lab.coordination)

    def partition_from_broker(self, container: Any) -> None:
        """Cut *container* off the data network: broker, result backend and gates."""
        self._cut_off(container, self.lab.data)

    def _cut_off(self, container: Any, network: Any) -> None:
        network.disconnect(container._container)
        self._cut.append((container, network))

    def heal(self) -> None:
        """Reconnect every partitioned container and thaw every paused one."""
        while self._cut:
            container, network = self._cut.pop()
            network.connect(container._container)
        while self._paused:
            self.unpause(self._paused[-1])
