"""ZooKeeper, the production grantor: a token is the zxid of one ZooKeeper write."""

from __future__ import annotations

from .source import (
    MAX_ZNODE_NAME_LENGTH,
    Lease,
    ZooKeeperTLS,
    ZooKeeperTokenSource,
    resource_to_znode_name,
    znode_name_to_resource,
)

__all__ = [
    "MAX_ZNODE_NAME_LENGTH",
    "Lease",
    "ZooKeeperTLS",
    "ZooKeeperTokenSource",
    "resource_to_znode_name",
    "znode_name_to_resource",
]
