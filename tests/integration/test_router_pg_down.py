"""PostgreSQL down: the router keeps answering and the log writer lands every record later."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core import embedded
from app.core.auth import create_key
from app.core.config import get_settings
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from cft.serve import create_app
from tests.support.db import TEST_TUNING, dedicated_server
from tests.support.factories import make_route, make_tenant
from tests.support.servers import metrics_text, serve_app
from workers import base_model

pytestmark = pytest.mark.slow
BASE = base_model.BUNDLED


@pytest.fixture
def own_server() -> Iterator[tuple[Path, str]]:
    """A dedicated embedded server: the session's one must not go down."""
    with dedicated_server("cft-pgdown-", tuning=TEST_TUNING) as server:
        yield server


def restart(pgdata: Path, url: str) -> None:
    """Start the stopped server again (same data directory, same socket)."""
    assert embedded.start(pgdata) == url


def can_connect(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def test_calls_answer_while_postgres_is_down_and_logs_land_after(
    own_server: tuple[Path, str], models_dir: Path, tmp_path: Path
):
    pgdata, url = own_server
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        tenant = make_tenant(c)
        route = make_route(c, tenant_id=tenant["id"], base_model=BASE)
        key = create_key(c, tenant_id=tenant["id"], role="client")
    settings = get_settings().model_copy(update={"serving_dir": tmp_path / "serving"})
    eng = Engine(BASE, models_dir, max_loras=1)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": route["name"], "prompt": "Hi", "max_tokens": 2, "user": "u"}
    try:
        with (
            serve_app(create_engine_app(eng), ready_path="/health") as engine_url,
            serve_app(create_app(settings, db_url=url, engine_urls=[engine_url])) as api,
        ):
            first = httpx.post(api + "/v1/completions", json=body, headers=headers, timeout=60)
            assert first.status_code == 200, first.text
            ids = [first.headers["x-request-id"]]
            embedded.stop(pgdata)
            assert not can_connect(url)
            for _ in range(3):
                resp = httpx.post(api + "/v1/completions", json=body, headers=headers, timeout=60)
                assert resp.status_code == 200, resp.text
                ids.append(resp.headers["x-request-id"])
            metrics = metrics_text()
            assert "cft_router_log_queue_depth" in metrics
            restart(pgdata, url)
            assert can_connect(url)
            deadline = time.monotonic() + 30
            with psycopg.connect(url, autocommit=True) as c:
                while True:
                    n = c.execute(
                        "SELECT count(*) FROM obs.inference_log WHERE request_id = ANY(%s::uuid[])",
                        (ids,),
                    ).fetchone()[0]
                    if n == len(ids):
                        break
                    assert time.monotonic() < deadline, f"only {n} of {len(ids)} records landed"
                    time.sleep(0.2)
    finally:
        eng.close()
