"""Shared fixtures. Server fixtures live in tests/fixtures/, one module per server."""

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.zookeeper",
    # After zookeeper: it shares that module's port and process helpers.
    "tests.fixtures.etcd",
    "tests.fixtures.redis_cluster",
]
