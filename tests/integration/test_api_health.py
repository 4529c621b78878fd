"""The API over real HTTP: health with versions, metrics, OpenAI-shaped errors."""

from __future__ import annotations

import httpx
import pytest

from app.main import create_app
from tests.support.servers import serve_app


@pytest.fixture
def api(db_url):
    with serve_app(create_app(db_url=db_url)) as base:
        yield base


def test_healthz_reports_postgres_18_and_pgvector_08(api):
    body = httpx.get(f"{api}/healthz").json()
    assert body["status"] == "ok"
    assert body["database"]["postgres"].startswith("18.")
    assert body["database"]["pgvector"].startswith("0.8.")


def test_metrics_are_prometheus_text(api):
    httpx.get(f"{api}/healthz")
    text = httpx.get(f"{api}/metrics").text
    assert 'cft_http_requests_total{method="GET",route="/healthz",status="200"}' in text


def test_unknown_path_gets_openai_error_shape(api):
    r = httpx.get(f"{api}/v1/nothing-here")
    assert r.status_code == 404
    assert set(r.json()["error"]) >= {"message", "type", "code"}
