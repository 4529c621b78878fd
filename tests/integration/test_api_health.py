"""The API over real HTTP: health with versions, metrics, OpenAI-shaped errors."""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

import httpx
import pytest

from app.core.config import Settings
from app.core.http_server import KEEP_ALIVE_S
from app.main import create_app
from tests.support.servers import free_port, serve_app


@pytest.fixture
def api(db_url):
    with serve_app(create_app(db_url=db_url)) as base:
        yield base


def test_healthz_reports_postgres_18_and_pgvector_08(api):
    body = httpx.get(f"{api}/healthz").json()
    assert body["status"] == "ok"
    assert body["database"]["postgres"].startswith("18.")
    assert body["database"]["pgvector"].startswith("0.8.")


def test_metrics_are_served_on_their_own_port_only(db_url, tmp_path):
    # Metric labels name every tenant's routes and adapters: the public port never serves them.
    port = free_port()
    settings = Settings(home=tmp_path, metrics_port=port)
    with serve_app(create_app(settings, db_url=db_url, engine_urls=[])) as api:
        httpx.get(f"{api}/healthz")
        assert httpx.get(f"{api}/metrics").status_code == 404
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'cft_http_requests_total{method="GET",route="/healthz",status="200"}' in text
    with pytest.raises(httpx.ConnectError):  # the listener stops with the app
        httpx.get(f"http://127.0.0.1:{port}/metrics")


def test_unknown_path_gets_openai_error_shape(api):
    r = httpx.get(f"{api}/v1/nothing-here")
    assert r.status_code == 404
    assert set(r.json()["error"]) >= {"message", "type", "code"}


def test_an_idle_keep_alive_connection_outlives_client_pools(api):
    """httpx (the OpenAI SDK) reuses connections idle up to 5 s, uvicorn's default keep-alive:
    a request on a connection the server is closing fails with a reset. Ours stay open
    longer, so the same connection still answers after 6 s idle."""
    assert KEEP_ALIVE_S > 60
    url = urlsplit(api)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        first.read()
        assert first.status == 200
        sock = conn.sock
        time.sleep(6)
        conn.request("GET", "/healthz")  # raises RemoteDisconnected if the server closed it
        again = conn.getresponse()
        again.read()
        assert again.status == 200 and conn.sock is sock
    finally:
        conn.close()
