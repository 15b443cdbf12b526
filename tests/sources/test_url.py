"""token_source_from_url: every scheme, and a clear error for every malformed URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_fencing import FencingConfigurationError, MemoryTokenSource, SQLiteTokenSource, token_source_from_url


def test_memory_url() -> None:
    assert isinstance(token_source_from_url("memory://"), MemoryTokenSource)


def test_sqlite_absolute_and_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sqlite:////abs is an absolute path, sqlite:///rel is relative to the working directory."""
    absolute = token_source_from_url(f"sqlite:///{tmp_path}/a.db")
    assert isinstance(absolute, SQLiteTokenSource) and absolute.path == tmp_path / "a.db"
    monkeypatch.chdir(tmp_path)
    relative = token_source_from_url("sqlite:///rel.db?timeout=2.5")
    assert isinstance(relative, SQLiteTokenSource)
    assert relative.path == Path("rel.db") and relative.timeout == 2.5
    absolute.close()
    relative.close()


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("", "token source URL"),
        (None, "token source URL"),
        ("tokens.db", "token source URL"),
        ("consul://h:8500", "unknown token source scheme 'consul'"),
        ("sqlite://host/x.db", "takes no host"),
        ("sqlite:///", "names no database file"),
        ("sqlite:///x.db?timeout=-1", "timeout='-1'"),
        ("sqlite:///x.db?timeout=nan", "timeout='nan'"),
        ("sqlite:///x.db?timeuot=1", "unknown parameter(s) timeuot"),
        ("memory://somewhere", "takes no host or path"),
    ],
    ids=repr,
)
def test_bad_urls_name_the_problem(url: str, names: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed URL raises FencingConfigurationError whose message names what is wrong."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FencingConfigurationError) as info:
        token_source_from_url(url)
    assert names in str(info.value)
    assert not list(tmp_path.iterdir()), "a refused URL must create nothing"
