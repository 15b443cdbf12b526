"""Shared fixtures. Server fixtures live in tests/fixtures/, one module per server."""

pytest_plugins = [
    # The testing kit's fixtures (fencing_*), which the ZooKeeper fixtures build on; also loaded by its
    # entry point, and pytest registers it once either way.
    "celery_fencing.testing",
    "tests.fixtures.services",
    "tests.fixtures.zookeeper",
    # After zookeeper: it shares that module's port and process helpers.
    "tests.fixtures.etcd",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.django",
]
