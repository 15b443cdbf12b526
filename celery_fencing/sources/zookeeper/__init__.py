"""ZooKeeper, the production grantor: a token is the zxid of one ZooKeeper write.

One role per module, as kazoo splits its client from its recipes:

* :mod:`.source`: :class:`ZooKeeperTokenSource`, minting, and the facade over the rest;
* :mod:`.writer`: the create-or-setData write that mints;
* :mod:`.grantor`: the ensemble's grantor id, and the token a write's stat makes;
* :mod:`.session`: the client, its connection state, fork handling;
* :mod:`.calls`: requests bounded by a deadline;
* :mod:`.config`: URL, hosts, digest and TLS checking, the password-masking logger;
* :mod:`.names`: resource names as znode names, and the layout under the root;
* :mod:`.prune`: deleting idle resources' znodes;
* :mod:`.lease`: exclusive mode, the lock queue and :class:`ZooKeeperLease`;
* :mod:`.lock_delay`: the holder record and the lock-delay;
* :mod:`.orphans`: lock nodes a session may have left behind.

docs/sources.md ("ZooKeeper") tells how it behaves and why.
"""

from __future__ import annotations

from .config import ZooKeeperTLS
from .lease import ZooKeeperLease
from .names import MAX_ZNODE_NAME_LENGTH, resource_to_znode_name, znode_name_to_resource
from .source import ZooKeeperTokenSource

__all__ = [
    "MAX_ZNODE_NAME_LENGTH",
    "Lease",
    "ZooKeeperLease",
    "ZooKeeperTLS",
    "ZooKeeperTokenSource",
    "resource_to_znode_name",
    "znode_name_to_resource",
]

#: The name before 0.2, when the etcd source's lease was already EtcdLease.
Lease = ZooKeeperLease
