"""The ZooKeeper vendor pytest-celery lacks: container, node and ensemble, as its Redis vendor has.

Each member runs ``QuorumPeerMain`` on a ``zoo.cfg`` written at start from the
``ZOO_CFG`` environment variable, so one image serves standalone servers and
ensemble members alike. Readiness is ZooKeeper's own ``srvr`` answer (a member
without a quorum answers that it is not serving), polled at the container's
address on the lab's coordination network.
"""

from __future__ import annotations

import socket
from typing import Any

from pytest_celery.api.base import CeleryTestCluster, CeleryTestNode  # type: ignore[import-untyped]
from pytest_celery.api.container import CeleryTestContainer  # type: ignore[import-untyped]

from ..processes import wait_for
from .defaults import READY_TIMEOUT, ZOOKEEPER_IMAGE, ZOOKEEPER_PORT, ZOOKEEPER_TICK_MS
from .lab import ContainerLab, LabAddressed

_START = (
    'mkdir -p /data /conf && printf "%s" "$ZOO_CFG" > /conf/zoo.cfg && printf "%s" "$ZOO_MY_ID" > /data/myid && '
    "exec java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dzookeeper.admin.enableServer=false "
    "-cp /conf:/usr/share/java/zookeeper.jar org.apache.zookeeper.server.quorum.QuorumPeerMain /conf/zoo.cfg"
)


class ZooKeeperContainer(LabAddressed, CeleryTestContainer):  # type: ignore[misc]
    """One ZooKeeper server in a container: ``url`` (``host:port``) by name, ``host_url`` by address."""

    PORT = ZOOKEEPER_PORT
    IMAGE = ZOOKEEPER_IMAGE

    @property
    def celeryconfig(self) -> dict[str, Any]:
        return {"url": self.url, "host_url": self.host_url, "hostname": self.name, "port": ZOOKEEPER_PORT}

    def url_for(self, host: str) -> str:
        return f"{host}:{ZOOKEEPER_PORT}"

    def srvr(self) -> str:
        """ZooKeeper's ``srvr`` four-letter answer ('' while it does not answer)."""
        try:
            with socket.create_connection((self.address, ZOOKEEPER_PORT), timeout=1) as conn:
                conn.sendall(b"srvr")
                chunks = []
                while chunk := conn.recv(4096):
                    chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
        except OSError:
            return ""

    def serving(self) -> bool:
        """True once this server serves clients (standalone, or a member of a quorum)."""
        return "Mode:" in self.srvr()


class ZooKeeperNode(CeleryTestNode):  # type: ignore[misc]
    """A ZooKeeper server as a pytest-celery node."""

    container: ZooKeeperContainer


class ZooKeeperEnsemble(CeleryTestCluster):  # type: ignore[misc]
    """One or more ZooKeeper servers serving together; :meth:`source_url` names them all."""

    def _set_nodes(self, *nodes: Any, node_cls: type[CeleryTestNode] = ZooKeeperNode) -> tuple[CeleryTestNode, ...]:
        return super()._set_nodes(*nodes, node_cls=node_cls)  # type: ignore[no-any-return]

    def source_url(self, root: str = "/fencing", session_timeout: float = 2.0, *, from_host: bool = False) -> str:
        """The ``zookeeper://`` token source URL for workers (or, *from_host*, for the test process)."""
        hosts = ",".join(n.container.host_url if from_host else n.container.url for n in self)
        return f"zookeeper://{hosts}{root}?session_timeout={session_timeout:g}"

    def ready(self) -> bool:
        return all(node.container.serving() for node in self)


def start_zookeeper(lab: ContainerLab, members: int = 1, image: str = ZOOKEEPER_IMAGE) -> ZooKeeperEnsemble:
    """Start a standalone server (*members* = 1) or an ensemble on *lab*'s coordination network; wait for it."""
    if members < 1 or members % 2 == 0:
        raise ValueError(f"a ZooKeeper ensemble needs an odd number of members, not {members}")
    names = [f"cf-{lab.uid}-zk{i}" for i in range(1, members + 1)]
    base = [
        f"tickTime={ZOOKEEPER_TICK_MS}",
        "dataDir=/data",
        f"clientPort={ZOOKEEPER_PORT}",
        "initLimit=20",
        "syncLimit=4",
        f"minSessionTimeout={2 * ZOOKEEPER_TICK_MS}",
        f"maxSessionTimeout={40 * ZOOKEEPER_TICK_MS}",
        "maxClientCnxns=0",
        "admin.enableServer=false",
        "4lw.commands.whitelist=*",
        "forceSync=no",
    ]
    if members > 1:
        base += [f"server.{i}={name}:2888:3888" for i, name in enumerate(names, 1)]
    cfg = "\n".join(base) + "\n"
    containers = []
    for i in range(1, members + 1):
        container = lab.run(
            ZooKeeperContainer,
            role=f"zk{i}",
            image=image,
            command=["sh", "-c", _START],
            networks=[lab.coordination],
            environment={"ZOO_CFG": cfg, "ZOO_MY_ID": str(i)},
        )
        containers.append(container)
    ensemble = ZooKeeperEnsemble(*containers)
    wait_for(ensemble.ready, READY_TIMEOUT, f"ZooKeeper ({members} member(s)) to serve", interval=0.1)
    lab.check_url(ensemble.source_url(from_host=True))
    return ensemble
