"""SQLGate column mode with a grantor column, on PostgreSQL, MariaDB and SQLite: another grantor's token
cannot write the row however large, a NULL grantor adopts the first, and a verifier applies here too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from celery_fencing import (
    MAX_TOKEN_VALUE,
    FencingToken,
    ForgedTokenError,
    GrantorMismatchError,
    MemoryTokenSource,
    PlausibilityBound,
    SQLGate,
    StaleTokenError,
)

from .adapters import make_engine


@pytest.fixture(params=["postgres", "mariadb", "sqlite"])
def setup(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> Iterator[tuple[sa.Engine, sa.Table]]:
    url = (
        f"sqlite:///{tmp_path / 'rows.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue(f"{request.param}_url")
    )
    engine = make_engine(url)
    metadata = sa.MetaData()
    accounts = sa.Table(
        f"acc_{unique_name}",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("balance", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.String(200)),
        sa.Column("fence", sa.BigInteger),
        sa.Column("fence_grantor", sa.String(64)),
    )
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(accounts).values(id=1, balance=100, owner="acct"))
    yield engine, accounts
    metadata.drop_all(engine)
    engine.dispose()


def _update(gate: SQLGate, engine: sa.Engine, table: sa.Table, token: FencingToken, balance: int) -> int:
    with engine.begin() as conn:
        return gate.fenced_update(
            conn,
            table,
            token,
            where=table.c.id == 1,
            values={"balance": balance},
            resource_column="owner",
            grantor_column="fence_grantor",
        )


def _row(engine: sa.Engine, table: sa.Table) -> tuple[int, int | None, str | None]:
    with engine.connect() as conn:
        row = conn.execute(sa.select(table.c.balance, table.c.fence, table.c.fence_grantor)).one()
    return int(row[0]), row[1], row[2]


def test_column_mode_refuses_another_grantor(setup: tuple[sa.Engine, sa.Table]) -> None:
    """The row adopts the first grantor; another grantor's token, even 2**63-1, raises and changes nothing."""
    engine, table = setup
    gate = SQLGate(engine)
    assert _update(gate, engine, table, FencingToken("acct", 10, "zk-old"), 110) == 1
    assert _row(engine, table) == (110, 10, "zk-old")
    with pytest.raises(GrantorMismatchError) as caught:
        _update(gate, engine, table, FencingToken("acct", MAX_TOKEN_VALUE, "zk-new"), 0)
    assert (caught.value.token_grantor, caught.value.expected_grantor) == ("zk-new", "zk-old")
    assert _row(engine, table) == (110, 10, "zk-old")
    with pytest.raises(StaleTokenError):
        _update(gate, engine, table, FencingToken("acct", 9, "zk-old"), 0)
    assert _update(gate, engine, table, FencingToken("acct", 11), 120) == 1  # no grantor: by value only
    assert _row(engine, table) == (120, 11, "zk-old")


def test_column_mode_uses_the_verifier(setup: tuple[sa.Engine, sa.Table]) -> None:
    """A gate's verifier applies to fenced_update too: a value the grantor cannot have issued changes nothing."""
    engine, table = setup
    source = MemoryTokenSource()
    gate = SQLGate(engine, verifier=PlausibilityBound(source, margin=0))
    token = source.mint("acct")
    assert _update(gate, engine, table, token, 105) == 1
    with pytest.raises(ForgedTokenError):
        _update(gate, engine, table, FencingToken("acct", MAX_TOKEN_VALUE, token.grantor), 0)
    assert _row(engine, table) == (105, token.value, token.grantor)
