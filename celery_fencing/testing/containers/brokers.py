"""pytest-celery's Redis and RabbitMQ containers, addressed at their own IP and never at localhost.

pytest-celery's vendors build ``host_url`` as ``localhost:<port>`` from
pytest-docker-tools' ``get_addr``; on a machine that carries ``/.dockerenv`` that
is the container's internal port on the *host's* loopback, i.e. the machine's
own Redis or RabbitMQ. These subclasses take the address from the lab's data
network instead, and publish no port at all (see lab.py).
"""

from __future__ import annotations

from pytest_celery.vendors.rabbitmq.container import RabbitMQContainer  # type: ignore[import-untyped]
from pytest_celery.vendors.redis.container import RedisContainer  # type: ignore[import-untyped]

from ..processes import wait_for
from .defaults import RABBITMQ_IMAGE, RABBITMQ_PORT, READY_TIMEOUT, REDIS_IMAGE, REDIS_PORT
from .lab import ContainerLab, LabAddressed


class IsolatedRedisContainer(LabAddressed, RedisContainer):  # type: ignore[misc]
    """Redis on the lab's data network: ``url`` by container name, ``host_url`` by its address."""

    PORT = REDIS_PORT
    IMAGE = REDIS_IMAGE

    def url_for(self, host: str) -> str:
        return f"redis://{host}:{REDIS_PORT}/{self.vhost}"


class IsolatedRabbitMQContainer(LabAddressed, RabbitMQContainer):  # type: ignore[misc]
    """RabbitMQ on the lab's data network (guest/guest, vhost ``/``), addressed as the Redis one."""

    PORT = RABBITMQ_PORT
    IMAGE = RABBITMQ_IMAGE

    def url_for(self, host: str) -> str:
        return f"amqp://guest:guest@{host}:{RABBITMQ_PORT}//"


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
    lab.check_url(container.host_url)
    wait_for(lambda: _redis_answers(container), READY_TIMEOUT, "Redis to answer PING", interval=0.1)
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
    lab.check_url(container.host_url)
    wait_for(lambda: _rabbitmq_answers(container), READY_TIMEOUT, "RabbitMQ to accept AMQP connections", interval=0.1)
    return container
