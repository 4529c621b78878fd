"""docs/reference/sql.md is what the database's COMMENT ON says, for a fresh apply of sql/."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_sql_reference", ROOT / "docs" / "gen_sql_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sql_reference_matches_the_schema(pg_server: str):
    gen = _generator()
    fresh = gen.render_fresh(pg_server, dbname="cft_sql_reference_test")
    committed = gen.OUTPUT.read_text()
    assert fresh == committed, (
        f"docs/reference/sql.md is stale (sql/ or a COMMENT ON changed): run `{gen.REFRESH}`"
        " and commit the page"
    )
    # Every object of the catalog is listed, including ones nobody has commented yet.
    for name in (
        "### `tenant`",
        "### `obs.inference_log`",
        "`serve.can_promote(",
        "`loop.triggers(",
    ):
        assert name in committed, name
