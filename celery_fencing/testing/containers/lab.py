"""One test's Docker networks and containers, reachable only at their own addresses.

Isolation from the machine's own services is structural, not a convention:

* every network is a user-defined bridge created with ``internal=True``: its
  containers have no route off it, so no container can reach a service of the
  host or the outside world;
* no container publishes a port: the test process talks to each container at
  its address on the network (the host has one on every bridge), so nothing a
  test starts ever answers on ``127.0.0.1``, and a URL with ``localhost`` in it
  can only name someone else's service;
* those addresses are read from the network itself, never from
  pytest-docker-tools' ``get_addr``: a machine that carries Docker's
  ``/.dockerenv`` marker makes it return internal ports, and pytest-celery's
  ``host_url`` then reads ``localhost:6379``, the machine's own Redis;
* :func:`assert_isolated_url` refuses any URL whose hosts are not this lab's
  containers, and the lab calls it on every URL it hands out.

Two networks per lab: ``coordination`` (ZooKeeper) and ``data`` (broker,
result backend, gates). A worker joins both, so it can be cut off either one.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import tarfile
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .defaults import LABEL

C = TypeVar("C")


class SharedServiceError(AssertionError):
    """A test was about to use a URL that does not point at one of its own containers."""


class LabAddressed:
    """A container of the lab, reached by its name from other containers and by its address from the test.

    Mixed into pytest-celery's container classes: ``url`` names the container
    (as workers on its network reach it), ``host_url`` its address on the
    lab's network (as the test process reaches it, never ``localhost``), and
    no port is published. A subclass sets :attr:`PORT` and :attr:`IMAGE` and
    says how a URL is spelled (:meth:`url_for`).
    """

    PORT: int
    IMAGE: str
    address: str = ""  # set by the lab once the container joined its network
    name: Any

    def url_for(self, host: str) -> str:
        raise NotImplementedError

    @property
    def hostname(self) -> str:
        return str(self.name)

    @property
    def port(self) -> int:
        return self.PORT

    @property
    def url(self) -> str:
        return self.url_for(str(self.name))

    @property
    def host_url(self) -> str:
        return self.url_for(self.address)

    @classmethod
    def image(cls) -> str:
        return cls.IMAGE

    @classmethod
    def ports(cls) -> dict[str, Any]:
        return {}


def url_hosts(url: str) -> list[str]:
    """The hosts a URL names, ``zookeeper://h1:2181,h2:2181/root`` included (userinfo dropped)."""
    netloc = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    hosts = []
    for part in netloc.split(","):
        host = part[1:].split("]", 1)[0] if part.startswith("[") else part.rsplit(":", 1)[0]
        hosts.append(host)
    return hosts


def assert_isolated_url(url: str, names: Iterable[str], subnets: Iterable[str]) -> str:
    """Return *url* if each of its hosts is a container name in *names* or an address in *subnets*.

    Raises :class:`SharedServiceError` otherwise: ``localhost``, loopback
    addresses and anything off the lab's networks (the machine's shared Redis,
    PostgreSQL, RabbitMQ or MariaDB) are refused before a client connects.
    """
    known = set(names)
    networks = [ipaddress.ip_network(s) for s in subnets]
    for host in url_hosts(url):
        if not host or host in known:  # hostless URLs (memory://) name no server at all
            continue
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise SharedServiceError(f"{url!r}: host {host!r} is not one of this test's containers") from None
        if not any(address in net for net in networks):
            raise SharedServiceError(
                f"{url!r}: {host} is not on this test's container networks {list(map(str, networks))}"
            )
    return url


class ContainerLab:
    """Creates, addresses and removes one test's networks and containers. Not thread-safe.

    *client* is a ``docker.DockerClient`` (default: ``docker.from_env()``).
    :meth:`close` removes everything the lab created, paused containers included.
    """

    def __init__(self, client: Any = None) -> None:
        import docker  # type: ignore[import-untyped]

        self.client = client if client is not None else docker.from_env()
        self.uid = uuid.uuid4().hex[:8]
        self._containers: list[Any] = []
        self._networks: list[Any] = []
        self.coordination = self._network("coordination")
        self.data = self._network("data")

    # --- networks and addresses -----------------------------------------------------

    def _network(self, role: str) -> Any:
        network = self.client.networks.create(
            f"cf-{self.uid}-{role}", driver="bridge", internal=True, labels={LABEL: self.uid}
        )
        self._networks.append(network)
        network.reload()
        return network

    def subnets(self) -> list[str]:
        """The lab's subnets, as CIDR strings."""
        return [cfg["Subnet"] for net in self._networks for cfg in net.attrs["IPAM"]["Config"]]

    def names(self) -> list[str]:
        """The lab's container names (each also the container's hostname and DNS name)."""
        return [c.name for c in self._containers]

    def check_url(self, url: str) -> str:
        """*url*, checked to name only this lab's containers (see :func:`assert_isolated_url`)."""
        return assert_isolated_url(url, self.names(), self.subnets())

    def address(self, container: Any, network: Any | None = None) -> str:
        """The container's address on *network* (default: the first network it joined)."""
        container.reload()
        networks = container.attrs["NetworkSettings"]["Networks"]
        name = network.name if network is not None else next(iter(networks))
        return str(networks[name]["IPAddress"])

    # --- containers -------------------------------------------------------------------

    def run(
        self,
        wrapper: Callable[[Any], C],
        *,
        role: str,
        image: str,
        command: list[str] | None,
        networks: list[Any],
        environment: dict[str, str] | None = None,
        files: dict[str, bytes] | None = None,
        shared: list[str] | None = None,
    ) -> C:
        """Start *image* as ``cf-<uid>-<role>`` on *networks*, with *files* put under ``/app`` first.

        *shared* are directories of the test's host bind-mounted at the same path
        (a test's pause points and events file: see worker.py).
        """
        name = f"cf-{self.uid}-{role}"
        raw = self.client.containers.create(
            image,
            command,
            name=name,
            hostname=name,
            environment=environment or {},
            labels={LABEL: self.uid},
            network=networks[0].name,
            volumes={path: {"bind": path, "mode": "rw"} for path in shared or []},
        )
        self._containers.append(raw)
        for network in networks[1:]:
            network.connect(raw)
        if files:
            raw.put_archive("/", _tar({f"app/{path}": data for path, data in files.items()}))
        raw.start()
        raw.reload()
        container = wrapper(raw)
        if isinstance(container, LabAddressed):  # the test reaches it on its first network
            container.address = self.address(raw, networks[0])
        return container

    def close(self) -> None:
        """Remove every container and network of the lab, the containers side by side (a few seconds saved
        per test); a paused one is unpaused first, as a frozen container cannot be killed."""
        with ThreadPoolExecutor(max_workers=max(1, len(self._containers))) as pool:
            list(pool.map(_remove, self._containers))
        self._containers.clear()
        for network in reversed(self._networks):
            with contextlib.suppress(Exception):
                network.remove()
        self._networks.clear()


def _remove(raw: Any) -> None:
    with contextlib.suppress(Exception):  # already gone, or the engine is going away: nothing left to do
        raw.reload()
        if raw.status == "paused":
            raw.unpause()
        raw.remove(force=True)


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(mode="w", fileobj=buffer) as archive:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
