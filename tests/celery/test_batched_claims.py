"""A fenced task's claims at start, batched: a RedisGate's and the fenced backend's in one round trip.

Against the real Redis. Batching is an optimisation only: every claim must
still land or be refused exactly as when sent one by one.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery

from celery_fencing import FencingToken, GateUnavailableError, GrantorMismatchError, StaleTokenError
from celery_fencing.celery.backend import FencedRedisBackend
from celery_fencing.gates.redis import RedisGate, run_script_calls
from tests.fixtures.services import armed


class PipelineSpy:
    """Counts, on one client, the commands written together in one round trip and those sent alone."""

    def __init__(self, client: redis.Redis) -> None:
        self.pipelines: list[int] = []
        self.single: list[str] = []
        pool, execute_command = client.connection_pool, client.execute_command
        get_connection = pool.get_connection

        def spy_get_connection(*args: Any, **kwargs: Any) -> Any:
            connection = get_connection(*args, **kwargs)
            pack = connection.pack_commands

            def spy_pack(commands: Any) -> Any:
                commands = list(commands)
                self.pipelines.append(len(commands))
                return pack(commands)

            connection.pack_commands = spy_pack
            return connection

        def spy_execute_command(*args: Any, **kwargs: Any) -> Any:
            self.single.append(str(args[0]))
            return execute_command(*args, **kwargs)

        pool.get_connection = spy_get_connection  # type: ignore[method-assign]
        client.execute_command = spy_execute_command  # type: ignore[method-assign]


def _backend(app: Celery) -> FencedRedisBackend:
    backend = app.backend
    assert isinstance(backend, FencedRedisBackend)
    return backend


def test_gate_and_result_claims_share_one_round_trip(app: Celery, redis_gate: RedisGate) -> None:
    """Both marks are raised, by one pipeline of two scripts and no other command."""
    backend = _backend(app)
    token = FencingToken("tid-1", 40, "zk-" + "a" * 32)
    # The first batch meets scripts the server has not seen (NOSCRIPT): those load alone.
    run_script_calls(
        [redis_gate.claim_call(FencingToken("warm", 1)), backend.claim_result_call("warm", FencingToken("warm", 1))]
    )
    spy = PipelineSpy(redis_gate.client)
    backend_spy = PipelineSpy(backend.client)
    run_script_calls([redis_gate.claim_call(token), backend.claim_result_call("tid-1", token)])
    assert spy.pipelines == [2] and spy.single == [] and backend_spy.single == []
    assert redis_gate.high_water("tid-1") == 40
    # The result's mark is at 40 too: an older execution of the task is refused...
    with pytest.raises(StaleTokenError):
        backend.claim_result("tid-1", FencingToken("tid-1", 39, "zk-" + "a" * 32))
    # ...and the same token (the same execution, writing its result) is not.
    backend.claim_result("tid-1", token)


def test_refusals_are_raised_as_when_sent_alone(app: Celery, redis_gate: RedisGate) -> None:
    """A refused gate claim raises StaleTokenError with the mark; then a refused result claim raises too;
    another grantor's token raises GrantorMismatchError. Nothing refused changes a mark."""
    backend = _backend(app)
    grantor = "zk-" + "b" * 32
    run_script_calls(
        [
            redis_gate.claim_call(FencingToken("r", 50, grantor)),
            backend.claim_result_call("t", FencingToken("r", 50, grantor)),
        ]
    )

    with pytest.raises(StaleTokenError) as refused:
        run_script_calls(
            [
                redis_gate.claim_call(FencingToken("r", 49, grantor)),
                backend.claim_result_call("t", FencingToken("r", 49, grantor)),
            ]
        )
    assert refused.value.high_water == 50
    assert redis_gate.high_water("r") == 50

    redis_gate.claim(FencingToken("r", 60, grantor))  # the gate is ahead, the result is not: the result refuses
    with pytest.raises(StaleTokenError, match="result of task t"):
        run_script_calls(
            [
                redis_gate.claim_call(FencingToken("r", 60, grantor)),
                backend.claim_result_call("t", FencingToken("r", 45, grantor)),
            ]
        )

    with pytest.raises(GrantorMismatchError):
        run_script_calls(
            [
                redis_gate.claim_call(FencingToken("r", 99, "zk-" + "c" * 32)),
                backend.claim_result_call("t", FencingToken("r", 99, "zk-" + "c" * 32)),
            ]
        )
    assert redis_gate.high_water("r") == 60


def test_lost_script_cache_falls_back_to_single_calls(private_redis_url: str, unique_name: str) -> None:
    """After SCRIPT FLUSH the pipeline gets NOSCRIPT: each claim runs alone, loads its script, and lands.

    On a redis-server of this session's own: SCRIPT FLUSH on the shared one would
    empty the script cache under every other worker's tests.
    """
    app = Celery("fenced-backend-test", backend="fenced+" + private_redis_url, set_as_current=False)
    app.conf.result_backend_transport_options = {"global_keyprefix": f"{unique_name}:"}
    client = redis.Redis.from_url(private_redis_url)
    try:
        backend = armed(_backend(app))
        redis_gate = armed(RedisGate(client, prefix=unique_name))
        redis_gate.claim(FencingToken("s", 1))  # scripts known to the server...
        redis_gate.client.script_flush()  # ...and forgotten
        token = FencingToken("s", 7)
        run_script_calls([redis_gate.claim_call(token), backend.claim_result_call("ts", token)])
        assert redis_gate.high_water("s") == 7
        with pytest.raises(StaleTokenError):
            backend.claim_result("ts", FencingToken("s", 6))
    finally:
        client.close()
        app.close()


def test_clients_of_other_servers_or_databases_are_not_batched(redis_url: str, unique_name: str) -> None:
    """Two databases of one server are two stores: each claim is sent on its own client."""
    base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
    first, second = redis.Redis.from_url(f"{base}/0"), redis.Redis.from_url(f"{base}/1")
    try:
        gates = [armed(RedisGate(first, prefix=unique_name)), armed(RedisGate(second, prefix=unique_name))]
        spies = [PipelineSpy(first), PipelineSpy(second)]
        token = FencingToken("d", 5)
        run_script_calls([gate.claim_call(token) for gate in gates])
        assert [spy.pipelines for spy in spies] == [[], []]
        assert [gate.high_water("d") for gate in gates] == [5, 5]
    finally:
        for client in (first, second):
            client.delete(f"{unique_name}:mark:d", f"{unique_name}:grantor:d", f"{unique_name}:floor")
            client.close()


def test_unreachable_redis_is_gate_unavailable() -> None:
    """A batch whose server cannot be reached falls back to single calls, which raise GateUnavailableError."""
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=None)
    gates = [RedisGate(client, prefix="a"), RedisGate(client, prefix="b")]
    with pytest.raises(GateUnavailableError):
        run_script_calls([gate.claim_call(FencingToken("u", 1)) for gate in gates])


def test_a_task_refused_by_its_gate_leaves_its_result_unclaimed(
    app: Celery, redis_gate: RedisGate, tmp_path: Any
) -> None:
    """On a domain resource, claims run one by one and stop at the first refusal: a task whose gate is
    held by a newer token (another task of the same account) does not touch its result's mark, so an
    older execution of that task can still store its result. (Batched, the result claim would land.)"""
    from celery_fencing.celery import FencedTask, install

    app.conf.update(fencing_source=f"sqlite:///{tmp_path / 'tokens.db'}", task_store_eager_result=False)
    install(app)
    redis_gate.claim(FencingToken("acct:1", 10**12))  # a newer writer of the account holds the mark

    @app.task(
        base=FencedTask,
        fencing_resource="acct:{n}",
        fencing_gates=lambda: [redis_gate],
        fencing_on_stale="ignore",
        shared=False,
    )
    def deposit(n: int) -> int:
        return n

    result = deposit.apply((1,))
    assert result.state != "SUCCESS"
    backend = _backend(app)
    assert backend.client.exists(backend.get_key_for_fence(result.id)) == 0


def test_batches_group_by_server_database_user_and_encoding(app: Celery, redis_url: str) -> None:
    """The grouping key: Celery's backend client and a redis.Redis of the same server batch together
    (their defaults differ only in spelling); another user, password, credential provider, database
    or encoding never does. Pure: no command is sent."""
    from redis.credentials import UsernamePasswordCredentialProvider

    from celery_fencing.gates.redis_batch import _server_of

    base = redis.Redis.from_url(redis_url)
    host, port = base.connection_pool.connection_kwargs["host"], base.connection_pool.connection_kwargs["port"]
    same = [_backend(app).client, base, redis.Redis(host=host, port=port), redis.Redis(host=host, port=port, db=0)]
    assert len({_server_of(client, n) for n, client in enumerate(same)}) == 1
    others = [
        redis.Redis(host=host, port=port, db=1),
        redis.Redis(host=host, port=port, username="alice", password="a"),
        redis.Redis(host=host, port=port, username="bob", password="b"),
        redis.Redis(host=host, port=port, credential_provider=UsernamePasswordCredentialProvider("carol", "c")),
        redis.Redis(host=host, port=port, credential_provider=UsernamePasswordCredentialProvider("carol", "c")),
        redis.Redis(host=host, port=port, encoding="latin-1"),
        redis.Redis(host=host, port=port + 1),
    ]
    keys = [_server_of(client, n) for n, client in enumerate(others, start=len(same))]
    assert len(set(keys)) == len(others) and _server_of(base, 0) not in keys
    for client in (base, *same[1:], *others):
        client.close()
