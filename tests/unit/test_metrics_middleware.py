"""The pure ASGI metrics middleware, on a real Starlette app served by uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.core.metrics import REGISTRY, MetricsMiddleware
from tests.support.servers import serve_app

STREAM_PAUSE = 0.3


async def item(request: Request) -> Response:
    return JSONResponse({"id": request.path_params["item_id"]})


async def boom(request: Request) -> Response:
    raise RuntimeError("unhandled on purpose")


async def slow_stream(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first\n"
        await asyncio.sleep(STREAM_PAUSE)
        yield b"second\n"

    return StreamingResponse(chunks(), media_type="text/plain")


async def health(request: Request) -> Response:
    return Response("ok")


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    app = Starlette(
        routes=[
            Route("/healthz", health),
            Route("/items/{item_id}", item, methods=["GET", "POST"]),
            Route("/boom", boom),
            Route("/stream", slow_stream),
        ]
    )
    app.add_middleware(MetricsMiddleware)
    with serve_app(app) as base:
        yield base


def count(route: str, status: str, method: str = "GET") -> float:
    labels = {"method": method, "route": route, "status": status}
    return REGISTRY.get_sample_value("cft_http_requests_total", labels) or 0.0


def timing(route: str, method: str = "GET") -> tuple[float, float]:
    labels = {"method": method, "route": route}
    n = REGISTRY.get_sample_value("cft_http_request_duration_seconds_count", labels) or 0.0
    s = REGISTRY.get_sample_value("cft_http_request_duration_seconds_sum", labels) or 0.0
    return n, s


def test_counts_and_times_by_route_template_and_status(api: str) -> None:
    before, (n0, _) = count("/items/{item_id}", "200", "POST"), timing("/items/{item_id}", "POST")
    for i in range(3):
        assert httpx.post(f"{api}/items/{i}").json() == {"id": str(i)}
    assert count("/items/{item_id}", "200", "POST") - before == 3
    assert timing("/items/{item_id}", "POST")[0] - n0 == 3
    # A path no route matches is counted once, as "unmatched", with its status.
    unmatched = count("unmatched", "404")
    assert httpx.get(f"{api}/nowhere/{'x' * 40}").status_code == 404
    assert count("unmatched", "404") - unmatched == 1


def test_an_unhandled_error_counts_as_500(api: str) -> None:
    before = count("/boom", "500")
    assert httpx.get(f"{api}/boom").status_code == 500
    assert count("/boom", "500") - before == 1


def test_a_stream_is_timed_to_its_headers_not_its_end(api: str) -> None:
    n0, s0 = timing("/stream")
    resp = httpx.get(f"{api}/stream")
    assert resp.text == "first\nsecond\n"
    n1, s1 = timing("/stream")
    assert n1 - n0 == 1
    assert s1 - s0 < STREAM_PAUSE, "the histogram holds time to headers"
    assert count("/stream", "200") >= 1
