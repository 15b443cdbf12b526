"""docs/architecture.md matches the code: every module is in it, and the layers it draws are the imports'."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_fencing"
DOC = ROOT / "docs" / "architecture.md"

CORE = {
    "token",
    "blocks",
    "exceptions",
    "protocols",
    "context",
    "policies",
    "lease_state",
    "signing",
    "urls",
    "values",
    "_lazy",
    "_version",
}
DRIVERS = {"redis", "sqlalchemy", "kazoo", "celery", "kombu", "django", "psycopg", "pymysql", "prometheus_client"}


def _modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts and p.name != "_version.py"]


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    """0 core types, 1 sources and gates, 2 the Celery layer, metrics and integrations, 3 the commands, the demo
    and the package itself (``celery_fencing``, whose names come from every layer)."""
    parts = module.split(".")[1:]
    if not parts:
        return 3
    if parts[0] in CORE:
        return 0
    if parts[0] in ("sources", "gates", "idempotency"):
        return 1
    if parts[0] in ("celery", "metrics", "contrib"):
        return 2
    return 3


def _imports(path: Path) -> list[tuple[str, bool]]:
    """The modules *path* imports, each with whether the import runs when the module is imported (module level)."""
    tree = ast.parse(path.read_text())
    package = _name(path) if path.name == "__init__.py" else _name(path).rsplit(".", 1)[0]
    top_level = {id(node) for node in tree.body}
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((target, id(node) in top_level))
    return found


def test_every_module_is_in_the_architecture_page_and_every_path_there_exists() -> None:
    text = DOC.read_text()
    named = set(re.findall(r"`(celery_fencing/[\w/]+\.py)`", text))
    modules = {str(p.relative_to(ROOT)) for p in _modules()}
    assert modules - named == set(), "modules missing from docs/architecture.md"
    assert named - modules == set(), "docs/architecture.md names modules that do not exist"


def test_core_types_import_no_driver() -> None:
    for path in _modules():
        if _layer(_name(path)) != 0 or path.parent != PACKAGE:
            continue
        for target, _ in _imports(path):
            assert target.split(".")[0] not in DRIVERS, f"{_name(path)} imports {target}"


def test_module_level_imports_go_down_the_layers() -> None:
    """At import time a module needs only its own layer and those below (lazy imports inside functions aside)."""
    for path in _modules():
        mine = _layer(_name(path))
        for target, at_import in _imports(path):
            if at_import and target.startswith("celery_fencing.") and target != "celery_fencing":
                assert _layer(target) <= mine, f"{_name(path)} (layer {mine}) imports {target} (layer {_layer(target)})"
