"""docs/security.md cites only tests that exist, and its threat table gives every threat a test."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "security.md"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_cited_test_exists() -> None:
    """Each `tests/...py::name` the security page cites is a test function in that file."""
    references = REFERENCE.findall(PAGE.read_text())
    assert len(references) >= 20
    for file, name in references:
        path = ROOT / file
        assert path.exists(), f"{file} (cited in security.md) does not exist"
        assert name in _test_names(path), f"{file}::{name} (cited in security.md) does not exist"


def test_every_threat_row_cites_a_test() -> None:
    """Every row of the threat table names at least one test."""
    table = PAGE.read_text().split("## Threats at a glance", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| threat", "| ---"))]
    assert len(rows) >= 15
    for row in rows:
        assert REFERENCE.search(row), f"threat without a test: {row[:80]}"
