"""Origin checks on real servers: in signed mode a gate refuses unsigned and forged tokens; with a
plausibility bound it refuses tokens above what the grantor (a real ZooKeeper, a SQLite file) has
issued. Each comes with the negative control: without the check, one forged token poisons the mark."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from celery_fencing import (
    MAX_TOKEN_VALUE,
    FencingToken,
    ForgedTokenError,
    GateUnavailableError,
    GrantorMismatchError,
    PlausibilityBound,
    RedisGate,
    SQLGate,
    SQLiteTokenSource,
    StaleTokenError,
    TokenSigner,
    ZooKeeperTokenSource,
    current_token,
)
from celery_fencing.signing import AllOf, SigningTokenSource
from celery_fencing.token import Mark
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.services import armed
from tests.fixtures.zookeeper import ZooKeeperServer

KEY_1, KEY_2 = secrets.token_hex(32), secrets.token_hex(32)


@pytest.fixture
def zk_source(zookeeper_server: ZooKeeperServer, unique_name: str) -> Iterator[ZooKeeperTokenSource]:
    source = ZooKeeperTokenSource.from_url(zookeeper_server.url(f"/{unique_name}", timeout=20))
    yield source
    source.close()


@pytest.fixture
def pg_engine(postgres_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(postgres_url, connect_args={"connect_timeout": 5})
    yield engine
    engine.dispose()


def _forgeries(good: FencingToken) -> dict[str, FencingToken]:
    """Ways to forge from one validly signed token, each a token a gate in signed mode must refuse."""
    other = TokenSigner({"k1": secrets.token_hex(32)})  # same key id, another key
    return {
        "unsigned": dataclasses.replace(good, signature=None),
        "value-raised": dataclasses.replace(good, value=MAX_TOKEN_VALUE),
        "value-plus-one": dataclasses.replace(good, value=good.value + 1),
        "resource-swapped": dataclasses.replace(good, resource=good.resource + "-other"),
        "grantor-swapped": dataclasses.replace(good, grantor="zk-attacker"),
        "unknown-key-id": dataclasses.replace(good, signature="k9:" + good.signature.split(":")[1]),  # type: ignore[union-attr]
        "wrong-key": other.sign(dataclasses.replace(good, value=MAX_TOKEN_VALUE, signature=None)),
        "tampered-header": FencingToken.from_header(good.to_header().replace(f":{good.value}:", f":{good.value + 7}:")),
    }


def test_signed_mode_refuses_unsigned_and_forged_tokens(
    zk_source: ZooKeeperTokenSource, redis_client: redis.Redis, pg_engine: sa.Engine, unique_name: str
) -> None:
    """Gates holding the key accept the minting service's signed tokens and refuse every forgery, changing nothing."""
    signer = TokenSigner({"k1": KEY_1})
    service = SigningTokenSource(zk_source, signer)
    redis_gate = armed(RedisGate(redis_client, prefix=unique_name, verifier=TokenSigner({"k1": KEY_1})))
    sql_gate = SQLGate(pg_engine, table=f"hw_{unique_name}", verifier=TokenSigner({"k1": KEY_1}))
    sql_gate.create_schema()
    try:
        good = service.mint("account:{1}")
        assert good.signature is not None and good.signature.startswith("k1:")
        redis_gate.set(good, "account:{1}:balance", 100)
        sql_gate.claim(good)
        for name, forged in _forgeries(good).items():
            for attempt in (
                lambda t: redis_gate.set(t, "account:{1}:balance", 0),
                lambda t: redis_gate.claim(t),
                sql_gate.claim,
            ):
                with pytest.raises(ForgedTokenError):
                    attempt(forged)
            assert redis_gate.mark("account:{1}") == Mark("account:{1}", good.value, good.grantor), name
            assert sql_gate.mark("account:{1}") == Mark("account:{1}", good.value, good.grantor), name
        assert int(redis_client.get("account:{1}:balance") or 0) == 100
        # The next signed token still passes: nothing was poisoned.
        nxt = service.mint("account:{1}")
        redis_gate.set(nxt, "account:{1}:balance", 110)
        sql_gate.claim(nxt)
    finally:
        sql_gate.table.drop(pg_engine, checkfirst=True)


def test_a_signing_source_signs_every_token_it_hands_out(
    zk_source: ZooKeeperTokenSource, redis_client: redis.Redis, unique_name: str
) -> None:
    """Task ids mint through mint_transient: a SigningTokenSource signs those too, so a fenced task on its
    task id passes a verifying gate; and it offers no way around the signature (no lease, no other mint)."""
    from celery import Celery

    from celery_fencing.celery import FencedTask, install

    signer = TokenSigner({"k1": KEY_1})
    service = SigningTokenSource(zk_source, signer)
    transient = service.mint_transient("task-1")
    assert transient.signature is not None and transient.signature.startswith("k1:")
    signer.verify(transient)
    for name in ("lease", "mint_unsigned", "_mint"):
        with pytest.raises(AttributeError):
            getattr(service, name)

    gate = armed(RedisGate(redis_client, prefix=unique_name, verifier=TokenSigner({"k1": KEY_1})))
    app = Celery("signed-task", set_as_current=False)
    app.conf.update(fencing_source=service, task_store_eager_result=False)
    install(app)

    @app.task(base=FencedTask, fencing_gates=lambda: [gate], shared=False)
    def on_task_id() -> int:
        token = current_token()
        gate.set(None, f"{unique_name}:k", token.value)
        return int(token.signature is not None)

    result = on_task_id.apply()
    assert result.successful(), result.traceback
    assert result.get() == 1
    app.close()


def test_without_signed_mode_one_forged_token_poisons_the_mark(
    zk_source: ZooKeeperTokenSource, redis_client: redis.Redis, unique_name: str
) -> None:
    """Negative control: a gate without a verifier takes a forged 2**63-1, and every honest token is refused after."""
    gate = armed(RedisGate(redis_client, prefix=unique_name))
    honest = zk_source.mint("account:{2}")
    gate.claim(honest)
    gate.claim(dataclasses.replace(honest, value=MAX_TOKEN_VALUE))
    with pytest.raises(StaleTokenError):
        gate.claim(zk_source.mint("account:{2}"))


def test_key_rotation(zk_source: ZooKeeperTokenSource, redis_client: redis.Redis, unique_name: str) -> None:
    """Gates holding the old and new key accept both; once the old key is dropped, its tokens are refused."""
    both = armed(
        RedisGate(redis_client, prefix=unique_name, verifier=TokenSigner({"k1": KEY_1, "k2": KEY_2}, current="k2"))
    )
    new_only = armed(RedisGate(redis_client, prefix=unique_name, verifier=TokenSigner({"k2": KEY_2})))
    old_token = SigningTokenSource(zk_source, TokenSigner({"k1": KEY_1})).mint("r")
    new_token = SigningTokenSource(zk_source, TokenSigner({"k1": KEY_1, "k2": KEY_2}, current="k2")).mint("r")
    both.claim(old_token)
    both.claim(new_token)
    new_only.claim(new_token)
    with pytest.raises(ForgedTokenError):
        new_only.claim(old_token)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TokenSigner({}),
        lambda: TokenSigner({"k1": "short"}),
        lambda: TokenSigner({"bad:id": KEY_1}),
        lambda: TokenSigner({"k1": KEY_1, "k2": KEY_2}),
        lambda: TokenSigner({"k1": KEY_1}, current="k2"),
    ],
    ids=["no-keys", "short-key", "bad-key-id", "ambiguous-current", "unknown-current"],
)
def test_bad_signer_configuration_is_refused(make: Callable[[], object]) -> None:
    """A signer without keys, with a short key, a bad key id or an unclear current key is a configuration error."""
    from celery_fencing import FencingConfigurationError

    with pytest.raises(FencingConfigurationError) as caught:
        make()
    assert KEY_1 not in str(caught.value) and KEY_2 not in str(caught.value)


def test_plausibility_bound_refuses_tokens_zookeeper_cannot_have_issued(
    zk_source: ZooKeeperTokenSource, zookeeper_server: ZooKeeperServer, redis_client: redis.Redis, unique_name: str
) -> None:
    """With a bound on the real ensemble's zxid, honest tokens pass and values above it are refused, mark unchanged."""
    bound = PlausibilityBound(zk_source, margin=0)
    gate = armed(RedisGate(redis_client, prefix=unique_name, verifier=bound))
    # Honest tokens from another client of the same ensemble, minted after the gate last looked, pass.
    with ZooKeeperTokenSource.from_url(zookeeper_server.url(f"/{unique_name}", timeout=20)) as other:
        for _ in range(3):
            gate.claim(other.mint("account:{3}"))
        honest = other.mint("account:{3}")
    gate.claim(honest)
    refused = {
        "max": dataclasses.replace(honest, value=MAX_TOKEN_VALUE),
        "next-epoch": dataclasses.replace(honest, value=honest.value + 2**32),
        "far-ahead": dataclasses.replace(honest, value=honest.value + 1_000_000),
        "no-grantor": dataclasses.replace(honest, grantor=None),
    }
    for name, token in refused.items():
        with pytest.raises(ForgedTokenError):
            gate.claim(token)
        assert gate.mark("account:{3}") == Mark("account:{3}", honest.value, honest.grantor), name
    with pytest.raises(GrantorMismatchError):
        gate.claim(dataclasses.replace(honest, grantor="zk-elsewhere"))


def test_plausibility_bound_reads_the_grantor_only_above_its_margin(
    zookeeper_server: ZooKeeperServer, unique_name: str, redis_client: redis.Redis
) -> None:
    """Within the margin above the last ceiling read, no grantor read is needed (ZooKeeper paused); above it, one is."""
    with ZooKeeperTokenSource.from_url(zookeeper_server.url(f"/{unique_name}", timeout=3)) as source:
        gate = armed(
            RedisGate(redis_client, prefix=unique_name, verifier=PlausibilityBound(source, margin=100, timeout=2))
        )
        token = source.mint("r")
        gate.claim(token)
        zookeeper_server.pause()
        try:
            gate.claim(dataclasses.replace(token, value=token.value + 50))  # within the margin: no read
            with pytest.raises(GateUnavailableError):
                gate.claim(dataclasses.replace(token, value=token.value + 10_000))  # needs the grantor
        finally:
            zookeeper_server.resume()
        assert gate.high_water("r") == token.value + 50


def test_plausibility_bound_on_a_sqlite_grantor_is_its_one_counter(tmp_path: Path) -> None:
    """SQLite counts once for every resource: a token above the counter is refused, whatever its resource."""
    from celery_fencing import MemoryGate

    source = SQLiteTokenSource(tmp_path / "tokens.db")
    try:
        for _ in range(50):
            source.mint("busy")
        quiet = source.mint("quiet")
        assert quiet.value == 51, "one counter: the first token of a resource comes after every earlier one"
        gate = MemoryGate(verifier=AllOf(PlausibilityBound(source, margin=0)))
        gate.claim(quiet)
        with pytest.raises(ForgedTokenError):
            gate.claim(dataclasses.replace(quiet, value=quiet.value + 1))  # no resource was minted that far
        gate.claim(source.mint("busy"))
        gate.claim(source.mint("quiet"))
    finally:
        source.close()


def test_signing_requires_a_grantor() -> None:
    """A token without a grantor id cannot be signed: the signature binds the grantor."""
    with pytest.raises(ForgedTokenError):
        TokenSigner({"k1": KEY_1}).sign(FencingToken("r", 1))
    assert "k1" in repr(TokenSigner({"k1": KEY_1})) and KEY_1 not in repr(TokenSigner({"k1": KEY_1}))


def test_plausibility_bound_on_etcd(etcd_server: EtcdServer, unique_name: str) -> None:
    """On a real etcd the bound is the store revision: an honest token passes, one far above it is refused."""
    from celery_fencing import MemoryGate
    from celery_fencing.sources.etcd import EtcdTokenSource

    with EtcdTokenSource(etcd_server.endpoints, prefix=f"/{unique_name}", timeout=10) as source:
        gate = MemoryGate(verifier=PlausibilityBound(source, margin=0))
        token = source.mint("r")
        assert source.ceiling() >= token.value
        gate.claim(token)
        with pytest.raises(ForgedTokenError):
            gate.claim(dataclasses.replace(token, value=token.value + 10_000))
