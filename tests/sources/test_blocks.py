"""Token blocks (celery_fencing.blocks): one coordinator write reserves many tokens for one process.

Against real ZooKeeper servers and real SQLite files: how many writes a block
costs, that a fresh mint is above every token handed out before it (by any
process), that a block never crosses fork() or a ZooKeeper session, that the
scale is part of the grantor's identity, and that tokens of roots from
versions that minted raw zxids order below the new ones.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from celery_fencing import (
    FencingConfigurationError,
    GrantorMismatchError,
    MemoryGate,
    StaleTokenError,
    token_source_from_url,
)
from celery_fencing.blocks import DEFAULT_BLOCK_SIZE, SCALE_BITS, TokenBlock, validate_block_size
from celery_fencing.protocols import BlockSource
from celery_fencing.sources import SQLiteTokenSource
from celery_fencing.sources.zookeeper import ZooKeeperTokenSource
from celery_fencing.token import FencingToken
from tests.fixtures.kazoo_client import started_client
from tests.fixtures.zookeeper import ZooKeeperServer, expire_session

# The bookkeeping, alone ----------------------------------------------------------------


def test_a_block_hands_out_its_values_in_order_then_nothing() -> None:
    """A block gives first..last once each, in order, then None; install replaces what was left."""
    block = TokenBlock()
    assert block.take() is None
    block.install(10, 12, "g")
    assert [block.take(), block.take(), block.take(), block.take()] == [(10, "g"), (11, "g"), (12, "g"), None]
    block.install(20, 29, "h")
    block.install(40, 41, "i")
    assert block.left() == 2 and block.take() == (40, "i")


def test_a_block_is_only_for_the_session_it_was_reserved_in() -> None:
    """A block reserved in one coordinator session is not handed out in another."""
    block = TokenBlock()
    block.install(1, 5, "g", session=111)
    assert block.take(session=222) is None
    assert block.take(session=111) == (1, "g")


def test_a_block_skips_its_values_below_a_floor_and_keeps_the_rest() -> None:
    """skip_below(floor) leaves floor..last to hand out; a floor at or below the next value skips nothing."""
    block = TokenBlock()
    block.install(10, 19, "g")
    assert block.skip_below(10) is False and block.left() == 10
    assert block.skip_below(15) is True and block.take() == (15, "g")
    assert block.skip_below(100) is True and block.take() is None and block.left() == 0
    assert block.skip_below(200) is False, "an empty block has nothing to skip"


def test_a_block_never_crosses_fork() -> None:
    """A forked child finds its parent's block empty, so two processes never hand out one token."""
    block = TokenBlock()
    block.install(1, 100, "g")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it could take, and leave without running pytest's cleanup
        os.write(write, repr((block.take(), block.left())).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    assert child == "(None, 0)"
    assert block.take() == (1, "g"), "the parent keeps its block"


@pytest.mark.parametrize(
    ("value", "message"),
    [(0, "from 1"), (DEFAULT_BLOCK_SIZE + 1, "to 1024"), ("8", "int"), (True, "int"), (2.0, "int")],
)
def test_bad_block_sizes_are_refused(value: object, message: str) -> None:
    """A block size outside 1..2**SCALE_BITS, or not an int, is refused with one line naming the limits."""
    with pytest.raises(FencingConfigurationError, match=message):
        validate_block_size(value)


# SQLite -------------------------------------------------------------------------------


def test_sqlite_block_costs_one_transaction_and_a_fresh_mint_tops_it(tmp_path: Path) -> None:
    """A block of 8 is one counter step of 8; another process's fresh mint is above all of it."""
    path = tmp_path / "tokens.db"
    first, second = SQLiteTokenSource(path, block=8), SQLiteTokenSource(path, block=8)
    try:
        tokens = [first.mint_in_block(f"task-{n}").value for n in range(8)]
        assert tokens == list(range(tokens[0], tokens[0] + 8))
        assert first.ceiling("x") == tokens[-1], "eight tokens, one step of the counter"
        fresh = second.mint_transient("task-late")
        assert fresh.value > max(tokens)
        # The first process's next block starts above the second's.
        assert first.mint_in_block("task-9").value > fresh.value
    finally:
        first.close()
        second.close()


def _child_tokens(path: str, out: multiprocessing.Queue[list[int]]) -> None:
    source = SQLiteTokenSource(path, block=16)
    out.put([source.mint_in_block(f"child-{n}").value for n in range(20)])
    source.close()


def test_sqlite_processes_never_share_a_token(tmp_path: Path) -> None:
    """Two processes drawing from blocks of one file get disjoint tokens (each reserves its own)."""
    path = str(tmp_path / "tokens.db")
    source = SQLiteTokenSource(path, block=16)
    mine = [source.mint_in_block(f"parent-{n}").value for n in range(5)]
    out: multiprocessing.Queue[list[int]] = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_child_tokens, args=(path, out))
    child.start()
    theirs = out.get(timeout=60)
    child.join(60)
    mine += [source.mint_in_block(f"parent-{n}").value for n in range(5, 30)]
    source.close()
    assert len(set(mine) | set(theirs)) == len(mine) + len(theirs)
    assert mine == sorted(mine) and theirs == sorted(theirs)


def test_sqlite_block_one_is_a_transaction_per_token(tmp_path: Path) -> None:
    """block=1 (in the URL) turns blocks off: every token is a step of the counter, as before blocks."""
    source = token_source_from_url(f"sqlite:///{tmp_path / 'tokens.db'}?block=1")
    try:
        assert isinstance(source, SQLiteTokenSource) and source.block_size == 1
        values = [source.mint_in_block("r").value for _ in range(3)]
        assert values == [1, 2, 3] and source.ceiling("r") == 3
    finally:
        source.close()


@pytest.mark.parametrize(
    "url", ["sqlite:///{d}/t.db?block=0", "sqlite:///{d}/t.db?block=x", "zookeeper://h:2181/r?block=2048"]
)
def test_bad_block_in_a_url_is_refused(tmp_path: Path, url: str) -> None:
    """A block parameter out of range, or not a number, is refused naming the parameter; nothing is created."""
    with pytest.raises(FencingConfigurationError, match=r"block=.* must be a whole number from 1"):
        token_source_from_url(url.format(d=tmp_path))
    assert not (tmp_path / "t.db").exists()


# ZooKeeper ----------------------------------------------------------------------------


def test_zookeeper_block_is_one_write_for_a_thousand_tokens(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """1,024 tokens from a block cost one ZooKeeper write: zxid * 2**10 + 0..1023, in order."""
    source = make_source()
    assert isinstance(source, BlockSource) and source.block_size == DEFAULT_BLOCK_SIZE
    tokens = [source.mint_in_block(f"task-{n}") for n in range(DEFAULT_BLOCK_SIZE)]
    _, stat = admin.get(f"{source.root}/transient")
    assert stat.version == 0, "one create of the shared znode, no setData"
    first = stat.mzxid << SCALE_BITS
    assert [token.value for token in tokens] == list(range(first, first + DEFAULT_BLOCK_SIZE))
    assert {token.grantor for token in tokens} == {source.grantor_id()}
    source.mint_in_block("task-next")
    _, stat = admin.get(f"{source.root}/transient")
    assert stat.version == 1, "the block used up, the next token is the next write's"


def test_zookeeper_fresh_mint_is_above_every_block_handed_out_before(
    make_source: Callable[..., ZooKeeperTokenSource],
) -> None:
    """A block token may be below another process's earlier token; a fresh mint never is."""
    old, new = make_source(), make_source()
    old.mint_in_block("warm-up")  # old's block is reserved first
    later = new.mint_in_block("task-x")  # new reserves a block above it
    from_old_block = old.mint_in_block("task-x")
    assert from_old_block.value < later.value, "handed out later, by another process, yet lower"
    fresh = old.mint_transient("task-x")
    assert fresh.value > later.value
    assert old.mint_in_block("task-y").value == fresh.value + 1, "the fresh write's block replaces the old one"
    assert old.ceiling() >= max(later.value, fresh.value + DEFAULT_BLOCK_SIZE - 1)


def test_zookeeper_block_skips_below_a_floor_minted_by_another_process(
    make_source: Callable[..., ZooKeeperTokenSource],
) -> None:
    """A floor minted after this process reserved its block is above all of it: skipping uses the block up,
    so the next token is a fresh write, above the floor; the other process's block is untouched."""
    old, new = make_source(), make_source()
    old.mint_in_block("warm-up")
    floor = new.mint_transient("celery-fencing:floor")  # another process arms a store
    assert old.mint_in_block("task-a").value < floor.value, "the premise: the old block is below the floor"
    assert old.skip_block_below(floor.value) is True
    assert old.mint_in_block("task-b").value > floor.value
    assert new.skip_block_below(floor.value) is False and new.mint_in_block("task-c").value == floor.value + 1


def test_zookeeper_block_is_dropped_with_its_session(
    make_source: Callable[..., ZooKeeperTokenSource], zookeeper_server: ZooKeeperServer, admin: KazooClient
) -> None:
    """After the session expires, the next token is a new write in the new session, not the old block's."""
    with started_client(zookeeper_server.hosts, timeout=4.0) as client:
        source = make_source(client=client)
        before = source.mint_in_block("a")
        expire_session(client, zookeeper_server.hosts)
        after = source.mint_in_block("b")
        _, stat = admin.get(f"{source.root}/transient")
        assert stat.version == 1 and after.value == stat.mzxid << SCALE_BITS > before.value


def test_zookeeper_block_one_writes_every_token(
    make_source: Callable[..., ZooKeeperTokenSource], zookeeper_server: ZooKeeperServer, admin: KazooClient
) -> None:
    """``?block=1`` turns blocks off: every token is a write of its own, still on the scale."""
    root = f"/{os.urandom(4).hex()}"
    source = token_source_from_url(f"zookeeper://{zookeeper_server.hosts}{root}?block=1")
    try:
        assert isinstance(source, ZooKeeperTokenSource) and source.block_size == 1
        tokens = [source.mint_in_block("r") for _ in range(3)]
        _, stat = admin.get(f"{root}/transient")
        assert stat.version == 2 and tokens[-1].value == stat.mzxid << SCALE_BITS
    finally:
        source.close()


def test_zookeeper_records_its_scale_and_refuses_another(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """The scale is stored beside the grantor id; a root on another scale is refused before any mint."""
    source = make_source()
    source.mint("r")
    data, _ = admin.get(f"{source.root}/token-scale")
    assert data == str(SCALE_BITS).encode()
    admin.set(f"{source.root}/token-scale", b"12")
    with pytest.raises(GrantorMismatchError, match=r"scales its tokens by 2\*\*12 .* this source by 2\*\*10"):
        make_source().mint_in_block("r")
    assert not admin.exists(f"{source.root}/transient"), "nothing was minted"


def test_zookeeper_tokens_order_above_marks_of_raw_zxids(
    make_source: Callable[..., ZooKeeperTokenSource], admin: KazooClient
) -> None:
    """A root minted by a version without blocks (marks are raw zxids, no token-scale): new tokens pass them."""
    source = make_source()
    grantor = source.grantor_id()
    admin.delete(f"{source.root}/token-scale")  # as an older version left the root
    admin.set(f"{source.root}/grantor", grantor.encode())
    legacy = FencingToken("acct:1", int(admin.exists(source.root).mzxid) + 10_000, grantor)
    gate = MemoryGate()
    gate.claim(legacy)
    fresh = make_source().mint_in_block("acct:1")
    gate.claim(fresh)  # above the raw zxid
    assert gate.high_water("acct:1") == fresh.value
    with pytest.raises(StaleTokenError):
        gate.claim(legacy)
    assert admin.get(f"{source.root}/token-scale")[0] == str(SCALE_BITS).encode()
