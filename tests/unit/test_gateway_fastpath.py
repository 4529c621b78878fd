"""The gateway's fast path runs what its routes declare: the same paths as Starlette's router
(under a root_path too), every dependency of the route, or a refusal when the app is built."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import pytest
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.testclient import TestClient
from starlette._utils import get_route_path

from app.core.config import Settings
from app.gateway import api as gateway_api
from app.gateway import fastpath
from app.gateway.fastpath import FastPathError, GatewayFastPath, _route_path
from app.gateway.keys import client_key
from app.main import create_app


@pytest.mark.parametrize(
    ("path", "root_path"),
    [
        ("/v1/chat/completions", ""),
        ("/v1/completions", ""),
        ("/api/v1/chat/completions", "/api"),  # uvicorn --root-path /api: the full path
        ("/v1/chat/completions", "/api"),  # FastAPI(root_path=...): the path as sent
        ("/apiv1/chat/completions", "/api"),
        ("/api", "/api"),
        ("/api/v1/models", "/api"),
    ],
)
def test_route_path_is_starlettes(path: str, root_path: str) -> None:
    scope: Any = {"type": "http", "path": path, "root_path": root_path}
    assert _route_path(scope) == (get_route_path(scope) or path)


def _app_fast_routes() -> dict[str, fastpath.FastRoute]:
    app = create_app(Settings(), db_url="postgresql://127.0.0.1:1/none", engine_urls=[])
    fast = [m for m in app.user_middleware if m.cls is GatewayFastPath]
    assert len(fast) == 1
    routes: dict[str, fastpath.FastRoute] = fast[0].kwargs["routes"]
    return routes


def test_the_app_serves_the_two_hot_routes_with_their_declared_key_check() -> None:
    routes = _app_fast_routes()
    assert set(routes) == {"/v1/chat/completions", "/v1/completions"}
    chat = routes["/v1/chat/completions"]
    assert chat.endpoint is gateway_api.chat_completions and chat.methods == {"POST"}
    assert [(s.call, s.names) for s in chat.steps] == [(client_key, ("key",))]
    scope: Any = {"path": "/api/v1/completions", "root_path": "/api"}
    assert routes[_route_path(scope)].endpoint is gateway_api.completions


CALLS: list[str] = []


async def audit(request: Request) -> None:
    CALLS.append(f"audit {request.url.path}")


async def caller(request: Request) -> str:
    CALLS.append("caller")
    return request.headers.get("x-caller", "nobody")


def _app(router: APIRouter, *endpoints: Any, **include: Any) -> FastAPI:
    """An app that serves endpoints of router on the fast path, as create_app wires it; a
    middleware inside the fast path notes every request FastAPI's own routing gets."""
    app = FastAPI()
    app.include_router(router, **include)

    @app.middleware("http")
    async def behind(request: Request, call_next: Any) -> Any:
        CALLS.append("fastapi")
        return await call_next(request)

    app.add_middleware(GatewayFastPath, routes=fastpath.routes(app.routes, endpoints))
    CALLS.clear()
    return app


def test_every_dependency_a_fast_route_declares_runs_on_the_fast_path() -> None:
    router = APIRouter()

    @router.post("/hot", dependencies=[Depends(audit)])
    async def hot(request: Request, who: Annotated[str, Depends(caller)]) -> Response:
        return Response(who)

    @router.post("/twice")
    async def twice(
        a: Annotated[str, Depends(caller)], b: Annotated[str, Depends(caller)]
    ) -> Response:
        return Response(a + b)

    app = _app(router, hot, twice, dependencies=[Depends(audit)])
    with TestClient(app) as client:
        r = client.post("/hot", headers={"x-caller": "ada"})
        assert (r.status_code, r.text) == (200, "ada")
        # The app's, then the route's dependency (once: cached, as FastAPI does), then the
        # parameter's; FastAPI's routing never saw the call.
        assert CALLS == ["audit /hot", "caller"]
        CALLS.clear()
        assert client.post("/twice", headers={"x-caller": "b"}).text == "bb"
        assert CALLS == ["audit /twice", "caller"]


def test_a_dependency_override_hands_the_call_to_fastapi() -> None:
    router = APIRouter()

    @router.post("/hot")
    async def hot(who: Annotated[str, Depends(caller)]) -> Response:
        return Response(who)

    async def fake() -> str:
        return "override"

    app = _app(router, hot)
    app.dependency_overrides[caller] = fake
    with TestClient(app) as client:
        assert client.post("/hot").text == "override"
    assert CALLS == ["fastapi"]


async def with_query(request: Request, limit: Annotated[int, Query()] = 1) -> int:
    return limit


async def with_yield(request: Request) -> AsyncIterator[str]:
    yield "x"


def sync_dependency(request: Request) -> str:
    return "x"


async def nested(who: Annotated[str, Depends(caller)]) -> str:
    return who


@pytest.mark.parametrize(
    ("dependency", "skipped"),
    [
        (with_query, "dependency with_query"),
        (with_yield, "dependency with_yield"),
        (sync_dependency, "dependency sync_dependency"),
        (nested, "dependency nested"),
    ],
)
def test_a_dependency_the_fast_path_would_skip_refuses_to_build_the_app(
    dependency: Any, skipped: str
) -> None:
    router = APIRouter()

    @router.post("/hot")  # a default, not an annotation: these are strings, read as globals
    async def hot(value: Any = Depends(dependency)) -> Response:
        return Response(str(value))

    with pytest.raises(FastPathError, match=f"/hot.*would skip {skipped}"):
        _app(router, hot)
    # The same through an include's dependencies, and on the gateway's own routes.
    with pytest.raises(FastPathError, match="would skip"):
        _app(gateway_api.router, *gateway_api.FAST_PATH, dependencies=[Depends(dependency)])


def test_what_a_fast_route_reads_itself_refuses_to_build_the_app() -> None:
    router = APIRouter()

    @router.post("/query")
    async def query(limit: int = 3) -> Response:
        return Response(str(limit))

    @router.post("/model")
    async def model(request: Request) -> dict[str, str]:
        return {}

    @router.post("/sync")
    def sync(request: Request) -> Response:
        return Response()

    for endpoint, skipped in (
        (query, "its query parameters"),
        (model, "its response model"),
        (sync, "running a sync handler"),
    ):
        with pytest.raises(FastPathError, match=skipped):
            _app(router, endpoint)

    async def undeclared(request: Request) -> Response:
        return Response()

    with pytest.raises(FastPathError, match="no route of the app serves"):
        _app(router, undeclared)


def test_a_dependency_added_to_the_gateways_routes_runs_before_the_key_check() -> None:
    app = FastAPI()
    app.include_router(gateway_api.router, dependencies=[Depends(audit)])
    routes = fastpath.routes(app.routes, gateway_api.FAST_PATH)
    for route in routes.values():
        assert [(s.call, s.names) for s in route.steps] == [(audit, ()), (client_key, ("key",))]
