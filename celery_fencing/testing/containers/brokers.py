"""pytest-celery's Redis and RabbitMQ containers, addressed at their own IP and never at localhost.

pytest-celery's vendors build ``host_url`` as ``localhost:<port>`` from
pytest-docker-tools' ``get_addr``; on a machine that carries ``/.dockerenv`` that
is the container's internal port on the *host's* loopback, i.e. the machine's
own Redis or RabbitMQ. These subclasses take the address from the lab's data
network instead, and publish no port at all (see lab.py).
"""

from __future__ import annotations

from typing import Any

from pytest_celery.vendors.rabbitmq.container import RabbitMQContainer  # type: ignore[import-untyped]
from pytest_celery.vendors.redis.container import RedisContainer  # type: ignore[import-untyped]

from .defaults import RABBITMQ_IMAGE, RABBITMQ_PORT, READY_TIMEOUT, REDIS_IMAGE, REDIS_PORT
from .lab import ContainerLab, wait_until


class IsolatedRedisContainer(RedisContainer):  # type: ignore[misc]
    """Redis on the lab's data network: ``url`` by container name, ``host_url`` by its address."""

    address: str = ""

    @property
    def hostname(self) -> str:
        return str(self.name)

    @property
    def port(self) -> int:
        return REDIS_PORT

    @property
    def url(self) -> str:
        return f"redis://{self.name}:{REDIS_PORT}/{self.vhost}"

    @property
    def host_url(self) -> str:
        return f"redis://{self.address}:{REDIS_PORT}/{self.vhost}"

    @classmethod
    def image(cls) -> str:
        return REDIS_IMAGE

    @classmethod
    def ports(cls) -> dict[str, Any]:
        return {}


class IsolatedRabbitMQContainer(RabbitMQContainer):  # type: ignore[misc]
    """RabbitMQ on the lab's data network (guest/guest, vhost ``/``), addressed as the Redis one."""

    address: str = ""

    @property
    def hostname(self) -> str:
        return str(self.name)

    @property
    def port(self) -> int:
        return RABBITMQ_PORT

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.name}:{RABBITMQ_PORT}//"

    @property
    def host_url(self) -> str:
        return f"amqp://guest:guest@{self.address}:{RABBITMQ_PORT}//"

    @classmethod
    def image(cls) -> str:
        return RABBITMQ_IMAGE

    @classmethod
    def ports(cls) -> dict[str, Any]:
        return {}


def _redis_answers(container: IsolatedRedisContainer) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(container.host_url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _rabbitmq_answers(container: IsolatedRabbitMQContainer) -> bool:
    from kombu.connection import Connection

    try:
        with Connection(container.host_url, connect_timeout=1) as conn:  # type: ignore[no-untyped-call]
            conn.connect()
        return True
    except Exception:
        return False


def start_redis(lab: ContainerLab, image: str = REDIS_IMAGE) -> IsolatedRedisContainer:
    """Start Redis (no persistence) on *lab*'s data network and wait until it answers PING."""
    container = lab.run(
        IsolatedRedisContainer,
        role="redis",
        image=image,
        command=IsolatedRedisContainer.command(),
        networks=[lab.data],
    )
    container.address = lab.address(container._container, lab.data)
    lab.check_url(container.host_url)
    wait_until(lambda: _redis_answers(container), "Redis to answer PING")
    return container


def start_rabbitmq(lab: ContainerLab, image: str = RABBITMQ_IMAGE) -> IsolatedRabbitMQContainer:
    """Start RabbitMQ on *lab*'s data network and wait until it accepts an AMQP connection."""
    container = lab.run(
        IsolatedRabbitMQContainer,
        role="rabbitmq",
        image=image,
        command=["rabbitmq-server"],
        networks=[lab.data],
        environment={"RABBITMQ_LOGS": "-"},
    )
    container.address = lab.address(container._container, lab.data)
    lab.check_url(container.host_url)
    wait_until(lambda: _rabbitmq_answers(container), "RabbitMQ to accept AMQP connections", READY_TIMEOUT)
    return container
