"""Imports go one way (workers -> app), and the demo simulator stays out of the production path."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Builds the cft parser (it imports each worker's module) and the API app, imports every other
# production module (all of app/ but the demo, all of workers/), then reports what got loaded.
PRODUCTION_PATH = """
import importlib, pathlib, sys
from app.core.config import Settings
from workers.cli import build_parser

build_parser()
from app.main import create_app
create_app(Settings(), db_url="postgresql://127.0.0.1:1/none", engine_urls=[])
for top in ("app", "workers"):
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


def _imports_of_workers(path: Path) -> list[str]:
    """Every `import workers...` and every "workers.x" string (importlib) in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if " " not in node.value else []
        rel = path.relative_to(ROOT)
        found += [f"{rel}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "workers"]
    return found


def test_app_never_imports_workers() -> None:
    found = [
        hit for path in sorted((ROOT / "app").rglob("*.py")) for hit in _imports_of_workers(path)
    ]
    assert found == []
