"""The gateway's two hot calls, dispatched without FastAPI's per-call machinery."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from fastapi.routing import APIRoute
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.gateway.keys import client_key
from app.gateway.proxy import proxy
from app.gateway.router import chat_completions, completions, router

Handler = Callable[[Request, Exception], Response | Awaitable[Response]]

# The two hot routes, by path: (kind, the declared route).
_FAST = {
    route.path: ("chat" if route.endpoint is chat_completions else "completions", route)
    for route in router.routes
    if isinstance(route, APIRoute) and route.endpoint in (chat_completions, completions)
}


class GatewayFastPath:
    """Dispatch POST /v1/chat/completions and /v1/completions straight to their handler.

    FastAPI's per-call routing, dependency solving and exception wrapping cost about as much
    CPU as the gateway itself (BENCHMARKS.md, Router). This runs the same two steps as the
    declared routes, `client_key` (their dependency) and then `proxy`, and maps errors through
    the app's own exception handlers. The routes stay declared on `router` (OpenAPI, the role
    sweep); every other request goes on to the app unchanged.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = (
            _FAST.get(_route_path(scope))
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if fast is None:
            await self.app(scope, receive, send)
            return
        kind, route = fast
        scope["route"] = route  # as FastAPI sets it (the metrics middleware reads its path)
        request = Request(scope, receive)
        try:
            response = await proxy(request, await client_key(request), kind)
        except Exception as exc:
            handler = _exception_handler(scope["app"], exc)
            if handler is None:
                raise
            answer = handler(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path routes are matched on: scope["path"] without the root_path prefix when the
    server put it there (`uvicorn --root-path`), as Starlette's router does."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


def _exception_handler(app: Starlette, exc: Exception) -> Handler | None:
    """The app's handler for exc (by its class's MRO, as Starlette looks it up), or None."""
    handlers = app.exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            handler: Handler = handlers[cls]
            return handler
    return None
