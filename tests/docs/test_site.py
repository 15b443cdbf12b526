"""The docs site builds cleanly, and what it claims about tests and commands stays true."""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from celery_fencing.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_mkdocs_build_is_strict_clean(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds: no broken link, anchor or nav entry anywhere in the site."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "failure-modes" / "index.html").exists()


def test_nav_has_every_required_page() -> None:
    """The nav lists the overview, quickstart, concepts, sources, gates, Celery, configuration, operations,
    failure modes and comparison, in that order."""
    config = (ROOT / "mkdocs.yml").read_text()
    titles = re.findall(r"^  - ([^:]+): (\S+\.md)$", config, re.M)
    assert [t for t, _ in titles][:10] == [
        "Overview",
        "Quickstart",
        "Concepts",
        "Token sources",
        "Gates",
        "Celery integration",
        "Configuration reference",
        "Operations",
        "Failure-modes checklist",
        "Comparison",
    ]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_failure_modes_name_tests_that_exist() -> None:
    """Every test the failure-modes checklist cites exists, and every failure mode cites at least one."""
    text = (DOCS / "failure-modes.md").read_text()
    references = REFERENCE.findall(text)
    assert len(references) >= 14
    for file, name in references:
        path = ROOT / file
        assert path.exists(), f"{file} (cited in failure-modes.md) does not exist"
        assert name in _test_names(path), f"{file}::{name} (cited in failure-modes.md) does not exist"
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for section in sections:
        title = section.splitlines()[0]
        if title != "Before you ship":
            assert REFERENCE.search(section), f"failure mode {title!r} cites no test"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(subparsers.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_command_reference_lists_every_flag(command: str) -> None:
    """Each flag of each celery-fencing command has a row in the Operations page's command reference."""
    text = (DOCS / "operations.md").read_text().split("## Command reference", 1)[1]
    rows = [line for line in text.splitlines() if line.startswith(f"| `{command}` |")]
    for action in _subcommands()[command]._actions:
        if action.dest == "help":
            continue
        names = action.option_strings or [action.metavar or action.dest]
        assert any(all(f"`{name}" in row for name in names) for row in rows), (
            f"celery-fencing {command} {names}: add a row to the command reference in docs/operations.md"
        )


def test_readme_starts_with_install_then_demo() -> None:
    """The first two commands README.md gives a newcomer install the package and run the demo."""
    readme = (ROOT / "README.md").read_text()
    commands = [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
        for line in block.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert "pip install -e '.[all]'" in commands[0]
    assert commands[1].endswith("celery-fencing demo")
