"""Shared fixtures. Server fixtures live in tests/fixtures/, one module per server."""

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.zookeeper",
]
