"""ZooKeeper digest auth and ACLs on a real server: a source with credentials creates its znodes for its
user only, and a client without them (or with a wrong password) can neither read, change nor delete
the token, grantor, lock or holder znodes; without credentials (the negative control) anyone can."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from celery_fencing import FencingConfigurationError, ZooKeeperTokenSource, token_source_from_url
from celery_fencing.cli import main
from celery_fencing.sources.zookeeper import resource_to_znode_name
from tests.fixtures.zookeeper import ZooKeeperServer

PASSWORD = "s3cr@t:pw/x"  # characters that must be percent-encoded in the URL
ENCODED = "s3cr%40t%3Apw%2Fx"


def url_for(server: ZooKeeperServer, root: str, password: str = ENCODED) -> str:
    return f"zookeeper://alice:{password}@{server.hosts}{root}?timeout=20"


@pytest.fixture
def intruder(zookeeper_server: ZooKeeperServer) -> Iterator[Callable[..., KazooClient]]:
    clients: list[KazooClient] = []

    def connect(auth: tuple[str, str] | None = None) -> KazooClient:
        client = KazooClient(zookeeper_server.hosts, auth_data=[auth] if auth else None)
        client.start(timeout=30)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.stop()
        client.close()


def _attacks(client: KazooClient, root: str, resource: str) -> dict[str, Callable[[], object]]:
    token = f"{root}/tokens/{resource_to_znode_name(resource)}"
    holder = f"{root}/holders/{resource_to_znode_name(resource)}"
    return {
        "read token": lambda: client.get(token),
        "set token": lambda: client.set(token, b"x"),
        "delete token": lambda: client.delete(token),
        "set grantor": lambda: client.set(f"{root}/grantor", b"zk-attacker"),
        "delete grantor": lambda: client.delete(f"{root}/grantor"),
        "create under root": lambda: client.create(f"{root}/evil", b""),
        "create under tokens": lambda: client.create(f"{root}/tokens/evil", b""),
        "set holder": lambda: client.set(holder, b"{}"),
        "open the ACL": lambda: client.set_acls(f"{root}/tokens", OPEN_ACL_UNSAFE),
    }


def test_client_without_the_acl_cannot_touch_the_fencing_root(
    zookeeper_server: ZooKeeperServer, unique_name: str, intruder: Callable[..., KazooClient]
) -> None:
    """With digest credentials every znode the source made refuses other clients (NoAuth), wrong password included."""
    root = f"/{unique_name}"
    with ZooKeeperTokenSource.from_url(url_for(zookeeper_server, root)) as source:
        assert source.username == "alice" and PASSWORD not in repr(source)
        first = source.mint("acct")
        with source.lease("acct") as lease:
            assert lease.token.grantor == first.grantor
        for name, (who, auth) in {
            "anonymous": ("anonymous", None),
            "wrong password": ("alice", ("digest", "alice:wrong")),
            "other user": ("mallory", ("digest", f"mallory:{PASSWORD}")),
        }.items():
            client = intruder(auth)
            for attack, run in _attacks(client, root, "acct").items():
                with pytest.raises(NoAuthError):
                    run()
                    pytest.fail(f"{name} ({who}) could {attack}")
        acl, _ = intruder(("digest", f"alice:{PASSWORD}")).get_acls(f"{root}/tokens")
        assert [entry.id.scheme for entry in acl] == ["digest"] and acl[0].id.id.startswith("alice:")
        assert source.mint("acct").value > first.value  # the owner still mints, with its grantor id
        with ZooKeeperTokenSource.from_url(url_for(zookeeper_server, root)) as again:
            assert again.grantor_id() == first.grantor


def test_without_credentials_any_client_can_reset_the_tokens(
    zookeeper_server: ZooKeeperServer, unique_name: str, intruder: Callable[..., KazooClient]
) -> None:
    """Negative control: znodes made without credentials are open; an anonymous client deletes the grantor id."""
    root = f"/{unique_name}"
    with ZooKeeperTokenSource.from_url(zookeeper_server.url(root, timeout=20)) as source:
        source.mint("acct")
        client = intruder()
        client.set(f"{root}/tokens/acct", b"x")
        client.delete(f"{root}/grantor")


def test_owner_without_credentials_is_refused_by_its_own_acl(
    zookeeper_server: ZooKeeperServer, unique_name: str
) -> None:
    """A source that lost its credentials (a misconfigured worker) cannot mint on a protected root: it fails loudly."""
    from celery_fencing import TokenUnavailableError

    root = f"/{unique_name}"
    with ZooKeeperTokenSource.from_url(url_for(zookeeper_server, root)) as owner:
        owner.mint("acct")
    for url in (zookeeper_server.url(root, timeout=20), url_for(zookeeper_server, root, "wrong")):
        with ZooKeeperTokenSource.from_url(url) as stranger, pytest.raises(TokenUnavailableError) as caught:
            stranger.mint("acct")
        assert "NoAuth" in str(caught.value) and "wrong" not in str(caught.value)


def test_inspect_uses_the_credentials_and_never_prints_the_password(
    zookeeper_server: ZooKeeperServer, unique_name: str, redis_url: str
) -> None:
    """inspect reads an ACL-protected root with the URL's credentials; its output shows *** instead of the password."""
    url = url_for(zookeeper_server, f"/{unique_name}")
    with ZooKeeperTokenSource.from_url(url) as source:
        token = source.mint("acct")
    out = io.StringIO()
    argv = ["inspect", "--source", url, "--gate", redis_url, "--redis-prefix", unique_name, "acct"]
    code = main(argv, out=out, err=out)
    assert code == 0, out.getvalue()
    assert str(token.value) in out.getvalue() and token.grantor in out.getvalue()  # type: ignore[operator]
    assert PASSWORD not in out.getvalue() and ENCODED not in out.getvalue()


@pytest.mark.parametrize(
    "url",
    [
        "zookeeper://alice@h:2181/r",
        "zookeeper://:pw@h:2181/r",
        "zookeeper://alice:@h:2181/r",
        "zookeeper://al:ice:pw@h:2181/r?bogus=1",
        "zookeeper://alice:pw@h:2181/r?tls=maybe",
        "zookeeper://alice:pw@h:2181/r?tls=false&ca=/x",
        "zookeeper://alice:pw@h:2181/r?certfile=/x",
        "zookeeper://alice:pw@/r",
        "zookeeper://alice:pw@h:99999/r",
    ],
)
def test_bad_credentials_or_tls_in_the_url_are_refused_without_echoing_the_password(url: str) -> None:
    """Malformed credentials or TLS options are a FencingConfigurationError whose message never holds the password."""
    with pytest.raises(FencingConfigurationError) as caught:
        token_source_from_url(url)
    assert ":pw@" not in str(caught.value) and ":ice:pw" not in str(caught.value)
