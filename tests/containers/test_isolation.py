"""No container test can reach the machine's shared Redis, PostgreSQL, RabbitMQ or MariaDB."""

from __future__ import annotations

import pytest

from celery_fencing.testing.containers import ContainerLab, SharedServiceError, assert_isolated_url
from celery_fencing.testing.containers.brokers import start_redis

SHARED = [
    "redis://localhost:6379/0",  # what pytest-celery's host_url reads on a machine with /.dockerenv
    "redis://127.0.0.1:6379/0",
    "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "amqp://guest:guest@localhost:5672//",
    "mysql+pymysql://root@127.0.0.1:3306/test",
    "zookeeper://127.0.0.1:2181,cf-x-zk1:2181/fencing",
]


@pytest.mark.parametrize("url", SHARED)
def test_a_url_of_a_shared_service_is_refused(url: str) -> None:
    """The guard refuses loopback and unknown hosts, whatever the port, before any client connects."""
    with pytest.raises(SharedServiceError):
        assert_isolated_url(url, names=["cf-x-zk1"], subnets=["172.16.0.0/24"])


def test_the_lab_is_internal_and_publishes_no_port(fencing_container_lab: ContainerLab) -> None:
    """Lab networks have no route off them; containers publish nothing; their URLs pass the guard."""
    redis_container = start_redis(fencing_container_lab)
    for network in (fencing_container_lab.coordination, fencing_container_lab.data):
        network.reload()
        assert network.attrs["Internal"] is True
    raw = redis_container._container
    raw.reload()
    assert not raw.attrs["HostConfig"]["PortBindings"]
    assert not any(raw.attrs["NetworkSettings"]["Ports"].values())
    assert fencing_container_lab.check_url(redis_container.host_url) == redis_container.host_url
    assert fencing_container_lab.check_url(redis_container.url) == redis_container.url
    # From inside, the shared Redis is unreachable: the internal network has no way to the host's loopback.
    code, _ = raw.exec_run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"])
    assert code == 0  # its own Redis, on its own loopback
    gateway = fencing_container_lab.data.attrs["IPAM"]["Config"][0].get("Gateway", "")
    if gateway:
        code, out = raw.exec_run(["redis-cli", "-h", gateway, "-p", "6379", "--no-raw", "ping"])
        assert b"PONG" not in out
