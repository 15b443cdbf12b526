"""Image names, ports and timings of the container kit (the images scripts/containers.sh builds)."""

from __future__ import annotations

# Built offline from Debian's packages by scripts/containers.sh (Dockerfiles in images/);
# with a registry, any image that runs the same command will do.
ZOOKEEPER_IMAGE = "celery-fencing/zookeeper:3.8"
REDIS_IMAGE = "celery-fencing/redis:7"
RABBITMQ_IMAGE = "celery-fencing/rabbitmq:3"
WORKER_IMAGE = "celery-fencing/worker:latest"

ZOOKEEPER_PORT = 2181
REDIS_PORT = 6379
RABBITMQ_PORT = 5672

# ZooKeeper's tick: sessions may last 2 to 40 ticks (0.5 s to 10 s), so a test can
# outlast a session in seconds.
ZOOKEEPER_TICK_MS = 250

# Seconds a container may take to serve (a JVM or an Erlang VM starts in a few seconds).
READY_TIMEOUT = 90.0

# The label on every network and container the kit creates: `docker ps --filter label=...`.
LABEL = "org.celery-fencing.testing"
