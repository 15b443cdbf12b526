"""`celery-fencing arm`: give Redis stores a floor, so a gate without a source can write again after a loss."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_fencing import (
    BelowFloorError,
    FencingToken,
    GateUnavailableError,
    RedisGate,
    SQLiteTokenSource,
    StoreUnarmedError,
)
from celery_fencing.cli import main


def arm(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["arm", *args], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def client(redis_url: str, unique_name: str) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(redis_url, decode_responses=True)
    yield connection
    keys = list(connection.scan_iter(f"{unique_name}*", count=1000))
    if keys:
        connection.delete(*keys)
    connection.close()


def test_arm_from_the_source_lets_new_tokens_in_and_keeps_older_ones_out(
    client: redis.Redis, redis_url: str, unique_name: str, tmp_path: Path
) -> None:
    """An unarmed store refuses a gate without a source; armed from the workers' source, it takes the tokens
    minted after, and refuses the ones minted before."""
    source = SQLiteTokenSource(tmp_path / "tokens.db")
    gate = RedisGate(client, prefix=unique_name)
    before = source.mint("account:1")
    with pytest.raises(StoreUnarmedError):
        gate.set(before, f"{unique_name}:k", "v")
    code, out, err = arm(
        "--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", redis_url, "--redis-prefix", unique_name
    )
    assert (code, err) == (0, ""), err
    floor = gate.floor()
    assert floor is not None and floor > before.value and f"floor {floor}" in out
    with pytest.raises(BelowFloorError):
        gate.set(before, f"{unique_name}:k", "v")
    gate.set(source.mint("account:1"), f"{unique_name}:k", "v")
    assert client.get(f"{unique_name}:k") == "v"
    source.close()


def test_arm_a_new_store_and_the_result_backend_with_floor_zero(
    client: redis.Redis, redis_url: str, unique_name: str
) -> None:
    """--floor 0 says the stores are new; a floor is only raised, never lowered."""
    gate = RedisGate(client, prefix=unique_name)
    gate.arm(7)
    code, out, _ = arm("--floor", "0", "--gate", redis_url, "--redis-prefix", unique_name)
    assert code == 0 and gate.floor() == 7 and "floor 7" in out, "a floor is never lowered"
    # The backend's floor key has no prefix of its own: arm it in a database of its own.
    backend_url = redis_url.rsplit("/", 1)[0] + "/11" if redis_url.count("/") > 2 else redis_url + "/11"
    backend_db = redis.Redis.from_url(backend_url, decode_responses=True)
    try:
        backend_db.delete("celery-task-fence:floor")
        code, out, _ = arm("--floor", "0", "--gate", f"fenced+{backend_url}")
        assert code == 0 and "floor 0" in out
        assert backend_db.get("celery-task-fence:floor") == "0" * 20
    finally:
        backend_db.delete("celery-task-fence:floor")
        backend_db.close()
    gate.set(FencingToken("account:1", 7), f"{unique_name}:k", "v")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "arm needs at least one --gate URL"),
        (("--gate", "redis://127.0.0.1:6379/0"), "arm needs exactly one of --source (mint the floor) and --floor N"),
        (("--gate", "sqlite:///marks.db", "--floor", "0"), "only Redis stores have floors"),
    ],
    ids=["no-gate", "no-floor", "not-redis"],
)
def test_bad_arguments_are_one_line_and_change_nothing(
    args: tuple[str, ...], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "marks.db").touch()
    code, out, err = arm(*args)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("junk", ["x" * 20, "00000000000000000005junk"])
def test_arm_replaces_a_floor_key_that_holds_no_floor(
    client: redis.Redis, redis_url: str, unique_name: str, tmp_path: Path, junk: str
) -> None:
    """A junk floor key refuses every token (it fails closed); a task's own arming leaves it, the operator's
    `arm` replaces it with a floor from the source, and tokens minted after it pass again."""
    source = SQLiteTokenSource(tmp_path / "tokens.db")
    gate = RedisGate(client, prefix=unique_name)
    client.set(gate.floor_key("account:1"), junk)
    assert RedisGate(client, prefix=unique_name).ensure_armed("account:1", source) is None
    assert client.get(gate.floor_key("account:1")) == junk, "a task's arming never replaces what it cannot read"
    with pytest.raises(GateUnavailableError, match="floor key"):
        gate.set(source.mint("account:1"), f"{unique_name}:k", "v")
    code, out, err = arm(
        "--source", f"sqlite:///{tmp_path / 'tokens.db'}", "--gate", redis_url, "--redis-prefix", unique_name
    )
    assert (code, err) == (0, ""), err
    floor = gate.floor()
    assert floor is not None and f"floor {floor}" in out
    gate.set(source.mint("account:1"), f"{unique_name}:k", "v")
    assert client.get(f"{unique_name}:k") == "v"
    source.close()
