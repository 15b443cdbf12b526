"""etcd v3 as the grantor: a token is the store revision of one write.

Minting is one ``put`` on a per-resource key, ``<prefix>/tokens/<name>``; the
token is ``header.revision`` of the put's response, which is the revision that
put created. etcd keeps one revision counter for its whole key space, advanced
through the raft log by every write, so revisions grow across leader changes,
member restarts, and deletion and re-creation of keys; they are 64-bit. Keys'
``version`` (reset when a key is re-created) is deliberately not used.

The client speaks etcd's JSON gRPC-gateway (``POST /v3/kv/put``, keys in
base64) with the standard library's ``http.client``: no dependency, and every
request has its own socket timeout. The maintained alternatives were heavier
for what a grantor needs: ``etcd3`` (unmaintained since 2020, generated code for
an old protobuf, grpcio) and ``etcd3gw`` (requests, futurist, pbr).

Exclusive mode
--------------
``with source.lease(resource) as lease:`` grants an etcd lease (``lease_ttl``
seconds, kept alive by a thread of the lease), takes etcd's lock on
``<prefix>/locks/<name>`` with it (``/v3/lock/lock``: the lock key is
``<name>/<lease id>``, deleted when the lease ends), and mints in one
transaction ``IF create_revision(lock key) == ours THEN put(token key)``: a
holder whose lock key is gone (lease expired, revoked, key deleted) can never
mint. The token is that put's revision, so tokens of both modes are revisions
of writes to the same key and order in mint order; it is above the lock key's
create revision too. The lock is for efficiency; the token stays the safety.

Grantor identity
----------------
The first source to reach a cluster stores a random id under
``<prefix>/grantor`` (a transaction that puts it only if the key was never
created); every token carries it (``etcd-<32 hex digits>``) and the gates keep
it with the mark, so a wiped or different cluster, whose revisions count from
the start again, meets :class:`~celery_fencing.GrantorMismatchError` at the
gates instead of being compared with the old marks. Each mint is a
transaction ``IF value(<prefix>/grantor) == <id> THEN put(token key)``, so a
token never carries the id of data it was not minted from; when the id
changed, the source reads the new one and mints again. A snapshot restore
restores the id with the data (restore with ``--bump-revision``, below).

Every response header also names the ``cluster_id`` (and the ``member_id`` that
answered: members change on failover, so it is logged, not checked). The
source pins the cluster id on first contact (or takes ``cluster_id=`` from the
caller) and refuses to mint from any other cluster. It also refuses a token that
is not above every token it minted before the mint was sent: revisions go
backwards only when the grantor's state was replaced, as by
``etcdutl snapshot restore`` without ``--bump-revision``, which re-issues
revisions already handed out (see docs/etcd.md).

Error handling
--------------
No call can hang: each request is bounded by the time left before the
caller's deadline (``timeout``). A member that refuses the connection, times
out, or answers "unavailable", "no leader" or "leader changed" is left for the
next endpoint, with a short backoff once every endpoint failed, until the
deadline; then :class:`~celery_fencing.TokenUnavailableError` is raised with
the last error chained. A put whose reply was lost may still have been
applied: that only advances the revision, and its token escapes no one.

Threads and processes
---------------------
A source is thread-safe: each thread keeps its own keep-alive HTTP connection
per endpoint. Connections never cross ``fork()``: a child notices the new pid
and opens its own, leaving the parent's untouched; leases taken in the parent
are lost in the child.

One role per module, as for ZooKeeper:

* :mod:`.source`: :class:`EtcdTokenSource`, minting, and the facade over the rest;
* :mod:`.grantor`: the cluster's grantor id, and the token a put's revision makes;
* :mod:`.lease`: exclusive mode, etcd's lock and :class:`EtcdLease`;
* :mod:`.gateway`: requests to the members' JSON gateway, failover, the cluster id, fork handling;
* :mod:`.config`: endpoints, key prefix, seconds, and the ``etcd://`` URL;
* :mod:`.keys`: resource names as etcd key names, and the layout under the prefix.

docs/etcd.md tells how it behaves and why.
"""

from __future__ import annotations

from .keys import resource_to_key_name
from .lease import EtcdLease
from .source import EtcdTokenSource

__all__ = ["EtcdLease", "EtcdTokenSource", "resource_to_key_name"]
