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


#: The most lines a module of the package may hold: past it, a module has usually taken on a second role.
MAX_MODULE_LINES = 500


def test_no_module_of_the_package_is_over_the_size_limit() -> None:
    sizes = {_name(path): len(path.read_text().splitlines()) for path in _modules()}
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert too_long == {}, f"split these by role (docs/architecture.md): {too_long}"


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


def _module_graph(roots: list[Path]) -> dict[str, set[str]]:
    """Each module of *roots* and the modules of *roots* it imports when it is imported.

    Module level only (an import inside a function runs later, and one under
    ``if TYPE_CHECKING`` never); ``from package import module`` depends on
    the module, and on the package only for a name the package defines.
    """
    paths = {_name(p): p for root in roots for p in root.rglob("*.py") if "migrations" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        statements: list[ast.stmt] = []
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            statements += node.body if isinstance(node, ast.If) else [node]
        targets: set[str] = set()
        for node in statements:
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, node.module] if node.module else base)
                submodules = {f"{module}.{alias.name}" for alias in node.names} & set(paths)
                targets.update(submodules)
                if len(submodules) < len(node.names):
                    targets.add(module)
        graph[name] = set()
        for target in targets:
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def test_no_import_cycle() -> None:
    """No module of the package, reliability/ or benchmarks/ imports, at import time, one that imports it back."""
    graph = _module_graph([PACKAGE, ROOT / "reliability", ROOT / "benchmarks"])
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    assert len(graph) > 150, "the graph must cover the package"
    for module in sorted(graph):
        visit(module, [])
