"""The gateway's fast path takes exactly the calls its declared routes match, under a root_path
too: each call goes either to the fast path or on to the app, as Starlette's router would send it
to the declared route or not."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from fastapi.routing import APIRoute
from starlette.routing import Match

from app.core import errors
from app.gateway.fastpath import GatewayFastPath
from app.gateway.router import chat_completions, completions, router

HOT = [
    route
    for route in router.routes
    if isinstance(route, APIRoute) and route.endpoint in (chat_completions, completions)
]


def app_behind_the_fast_path() -> FastAPI:
    """An app that declares no gateway route, behind the fast path."""
    app = FastAPI()
    errors.install(app)

    @app.api_route("/{rest:path}", methods=["GET", "POST"])
    def passed(rest: str) -> PlainTextResponse:
        return PlainTextResponse("passed", status_code=299)

    app.add_middleware(GatewayFastPath)
    return app


def post(path: str, root_path: str) -> httpx.Response:
    """POST path (no key) through the fast path, served with that root_path."""

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app_behind_the_fast_path(), root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://cft") as client:
            return await client.post(path, json={})

    return asyncio.run(call())


@pytest.mark.parametrize(
    ("path", "root_path", "hot"),
    [
        ("/v1/chat/completions", "", True),
        ("/v1/completions", "", True),
        ("/api/v1/chat/completions", "/api", True),  # uvicorn --root-path /api: the full path
        ("/api/v1/completions", "/api", True),
        ("/v1/chat/completions", "/api", True),  # FastAPI(root_path=...): the path as sent
        ("/apiv1/chat/completions", "/api", False),
        ("/api", "/api", False),
        ("/api/v1/models", "/api", False),
        ("/v1/chat/completions/x", "", False),
    ],
)
def test_fast_path_takes_what_the_declared_routes_match(
    path: str, root_path: str, hot: bool
) -> None:
    scope = {"type": "http", "method": "POST", "path": path, "root_path": root_path}
    assert any(route.matches(scope)[0] is Match.FULL for route in HOT) is hot
    resp = post(path, root_path)
    # Only the fast path answers 401 (the declared routes' key check): the app behind it
    # declares no gateway route.
    assert (resp.status_code == 401) is hot, resp.text
    if hot:
        assert resp.json()["error"]["type"] == "authentication_error"
