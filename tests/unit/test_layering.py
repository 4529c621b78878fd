"""Imports go one way (cft's programs -> workers -> app, and between app's packages), and the
demo simulator stays out of the production path."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Builds the cft parser (it imports each worker's module) and the API app, imports every other
# production module (all of app/ but the demo, all of workers/ and cft/), then reports what got
# loaded.
PRODUCTION_PATH = """
import importlib, pathlib, sys
from app.core.config import Settings
from cft.cli import build_parser

build_parser()
from app.main import create_app
create_app(Settings(), db_url="postgresql://127.0.0.1:1/none", engine_urls=[])
for top in ("app", "workers", "cft"):
    for path in sorted(pathlib.Path(top).rglob("*.py")):
        name = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
        if not name.startswith("app.demo") and not name.endswith("__main__"):
            importlib.import_module(name)
print(sorted(m for m in sys.modules if m == "openai" or m.startswith(("app.demo", "openai."))))
"""


def test_production_modules_never_load_the_demo() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PRODUCTION_PATH],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def _imports_of(path: Path, tops: set[str]) -> list[str]:
    """Every `import T...` and every "T.x" string (importlib) in one file, for T in tops.

    "cft.x" strings are logger and metric names, so for `cft` only imports count.
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if " " not in node.value and "cft" not in node.value else []
        rel = path.relative_to(ROOT)
        found += [f"{rel}:{node.lineno}: {n}" for n in names if n.split(".")[0] in tops]
    return found


def test_app_never_imports_workers_or_programs() -> None:
    found = [
        hit
        for path in sorted((ROOT / "app").rglob("*.py"))
        for hit in _imports_of(path, {"workers", "cft"})
    ]
    assert found == []


def test_workers_never_import_the_programs() -> None:
    found = [
        hit
        for path in sorted((ROOT / "workers").rglob("*.py"))
        for hit in _imports_of(path, {"cft"})
    ]
    assert found == []


def _sibling_imports(package: Path) -> dict[str, set[str]]:
    """Each module of a package and the modules of that package it imports, anywhere in it.

    Imports under `if TYPE_CHECKING:` and inside functions count: they tie the modules together
    as much as the others do.
    """
    prefix = ".".join(package.relative_to(ROOT).parts)
    modules = {p.stem for p in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in sorted(modules):
        loaded: list[str] = []  # dotted names each import may load
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                loaded += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level <= 1:
                # `from pkg import mod` loads pkg.mod; `from . import mod` is relative to prefix.
                base = ".".join(filter(None, [prefix if node.level else "", node.module]))
                loaded += [base, *(f"{base}.{a.name}" for a in node.names)]
        graph[name] = {
            last
            for head, _, last in (full.rpartition(".") for full in loaded)
            if head == prefix and last in modules and last != name
        }
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of the graph (its modules in order, the first repeated), or []."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        for nxt in sorted(graph[node]):
            if found := visit(nxt, [*path, node]):
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        if found := visit(start, []):
            return found
    return []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_engine_modules_import_one_way() -> None:
    graph = _sibling_imports(ROOT / "cft" / "engine")
    assert {"core", "scheduler", "model"} <= graph.keys() and "model" in graph["scheduler"]
    assert _cycle(graph) == []


def _app_package_imports() -> dict[str, set[str]]:
    """Each package of app/ (a top-level module counts as one) and the others it imports.

    Every import counts, under `if TYPE_CHECKING:` and inside functions too; a relative import
    is resolved against the module it is in.
    """
    app = ROOT / "app"
    packages = {p.stem for p in app.glob("*.py")} | {p.parent.name for p in app.glob("*/*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(app.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = parts[1]
        here = list(parts[:-1])  # the package a relative import starts from
        loaded: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                loaded += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                loaded += [module, *(f"{module}.{a.name}" for a in node.names)]
        graph.setdefault(package, set()).update(
            name.split(".")[1]
            for name in loaded
            if name.startswith("app.") and name.split(".")[1] in packages - {package}
        )
    return graph


def test_app_packages_import_one_way() -> None:
    graph = _app_package_imports()
    # The settings validate engine URLs with the engine kinds; the gateway drives them.
    assert "engines" in graph["core"] and "engines" in graph["gateway"]
    assert "datasets" in graph["training"]
    assert _cycle(graph) == []


# What the settings and the engine kinds load: no HTTP runtime (the gateway's aiohttp and
# httptools, the reconciler's httpx), no web framework, no database driver.
SETTINGS_PATH = """
import sys
import app.core.config, app.engines.compat, app.engines.kinds, app.engines.state
heavy = ("aiohttp", "httptools", "httpx", "fastapi", "starlette", "psycopg")
print(sorted(m for m in sys.modules if m.startswith("app.gateway") or m.split(".")[0] in heavy))
"""


def test_settings_and_engine_kinds_load_without_the_gateway_runtime() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SETTINGS_PATH], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout
