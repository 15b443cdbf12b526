"""Behaviour specific to the embedded sources: SQLite durability, memory volatility."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from celery_fencing import MemoryTokenSource, SQLiteTokenSource, TokenUnavailableError


def test_sqlite_values_survive_a_new_process(tmp_path: Path) -> None:
    """A token minted by a process that exited is below the next process's first token."""
    db = tmp_path / "t.db"
    code = "import sys; from celery_fencing import SQLiteTokenSource as S; print(S(sys.argv[1]).mint('r').value)"
    first = int(
        subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, check=True, text=True).stdout
    )
    second = int(
        subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, check=True, text=True).stdout
    )
    assert second > first


def test_sqlite_uses_durable_settings(tmp_path: Path) -> None:
    """The counter file is in WAL mode: the setting that makes synchronous=FULL cheap and durable."""
    source = SQLiteTokenSource(tmp_path / "t.db")
    source.mint("r")
    conn = sqlite3.connect(tmp_path / "t.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    source.close()


def test_sqlite_lock_held_too_long_times_out(tmp_path: Path) -> None:
    """A file locked by another writer past the timeout gives TokenUnavailableError, not a hang."""
    db = tmp_path / "t.db"
    source = SQLiteTokenSource(db, timeout=0.3)
    source.mint("r")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(TokenUnavailableError, match="locked"):
            source.mint("r", timeout=0.5)
    finally:
        blocker.execute("ROLLBACK")
    assert source.mint("r").value == 2


def test_sqlite_closed_source_refuses(tmp_path: Path) -> None:
    """A closed source raises instead of silently reopening."""
    source = SQLiteTokenSource(tmp_path / "t.db")
    source.close()
    source.close()
    with pytest.raises(TokenUnavailableError, match="closed"):
        source.mint("r")


def test_sqlite_child_after_fork_mints_on_its_own_connection(tmp_path: Path) -> None:
    """A forked child mints through a fresh connection and still never repeats a value."""
    source = SQLiteTokenSource(tmp_path / "t.db")
    parent_first = source.mint("r").value
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.write(write, str(source.mint("r").value).encode())
        finally:
            os._exit(0)
    os.close(write)
    child_value = int(os.read(read, 64))
    os.waitpid(pid, 0)
    assert child_value > parent_first
    assert source.mint("r").value > child_value


def _open_and_mint(path: str, start: Any, results: Any) -> None:
    start.wait()
    try:
        source = SQLiteTokenSource(path, timeout=10.0)
        token = source.mint("r")
        results.put(("ok", source.grantor, token.value))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put(("error", type(exc).__name__, str(exc)))


def test_sqlite_many_processes_opening_a_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Workers of a fresh deployment start together: none fails with "database is locked".

    Switching a new file to WAL and creating its tables race between
    processes; SQLite reports some of those conflicts at once instead of
    waiting, and a worker that gave up there refused to start (a CI failure
    of the demo). Every process must open the file, agree on one grantor id,
    and mint a distinct token.
    """
    context = multiprocessing.get_context("fork")
    processes = 8
    for attempt in range(10):
        path = str(tmp_path / f"fresh-{attempt}.db")
        start = context.Event()
        results = context.Queue()
        children = [context.Process(target=_open_and_mint, args=(path, start, results)) for _ in range(processes)]
        for child in children:
            child.start()
        start.set()
        outcomes = [results.get(timeout=60) for _ in children]
        for child in children:
            child.join(timeout=30)
        errors = [outcome for outcome in outcomes if outcome[0] != "ok"]
        assert errors == [], f"round {attempt}: {errors}"
        assert len({grantor for _, grantor, _ in outcomes}) == 1
        assert sorted(value for _, _, value in outcomes) == list(range(1, processes + 1))


def test_memory_source_warns_it_is_volatile(caplog: pytest.LogCaptureFixture) -> None:
    """The memory source says loudly that it loses its counter, and marks itself volatile."""
    with caplog.at_level(logging.WARNING, logger="celery_fencing"):
        source = MemoryTokenSource()
    assert source.volatile is True
    assert any("volatile" in r.getMessage() for r in caplog.records)


def test_memory_source_restarts_from_scratch() -> None:
    """What volatile means: a new memory source mints values an old one already gave out."""
    first = MemoryTokenSource()
    old = [first.mint("r").value for _ in range(3)]
    assert MemoryTokenSource().mint("r").value in old
