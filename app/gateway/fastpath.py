"""The gateway's hot calls, dispatched without FastAPI's per-call machinery.

`app/gateway/api.py` declares which of its routes this serves (`FAST_PATH`); everything else
about them (path, method, handler, dependencies) is read from the app's routes as declared, so
what runs here is what the route says. FastAPI's per-call routing, dependency solving and
exception wrapping cost about as much CPU as the gateway itself (BENCHMARKS.md, Router): this
runs the route's dependencies and then its handler, and maps errors through the app's own
exception handlers. Only dependencies that are plain `async def` functions of the request run
here; `routes` refuses, when the app is built, a fast route that declares anything else
(another dependency, a parameter read from the request, a body), so nothing a route declares
is silently skipped. While the app has dependency overrides (tests), FastAPI serves the calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import routing
from fastapi.dependencies.models import Dependant
from fastapi.security.base import SecurityBase
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request, Exception], Response | Awaitable[Response]]


class FastPathError(RuntimeError):
    """A route declared for the fast path asks for something the fast path does not run."""


@dataclass(frozen=True)
class Step:
    """One dependency to await: its function, the name of its request parameter (if any) and
    the handler's parameters that take its value (none for a route's `dependencies=[...]`)."""

    call: Callable[..., Awaitable[Any]]
    request_param: str | None
    names: tuple[str, ...]


@dataclass(frozen=True)
class FastRoute:
    """A declared route as the fast path runs it."""

    route: BaseRoute  # the declared route, set as scope["route"] as FastAPI sets it
    methods: frozenset[str]
    endpoint: Callable[..., Awaitable[Response]]
    request_param: str | None
    steps: tuple[Step, ...]


def routes(
    app_routes: Sequence[BaseRoute], endpoints: Collection[Callable[..., Any]]
) -> dict[str, FastRoute]:
    """The fast path's routes by path: the app's routes whose handler is one of endpoints, with
    their dependencies as declared (the route's, its router's and the app's). Raises
    FastPathError for one that declares something the fast path would not run, or for an
    endpoint no route serves."""
    found: dict[str, FastRoute] = {}
    served: set[Callable[..., Any]] = set()
    for rc in routing.iter_route_contexts(app_routes):
        endpoint, path = rc.endpoint, rc.path
        if endpoint not in endpoints or endpoint is None or path is None:
            continue
        if not isinstance(rc.original_route, routing.APIRoute):
            continue
        where = f"{sorted(rc.methods or ())} {path} ({endpoint.__qualname__})"
        found[path] = _fast_route(rc, where)
        served.add(endpoint)
    missing = [e.__qualname__ for e in endpoints if e not in served]
    if missing:
        raise FastPathError(f"no route of the app serves {', '.join(missing)}")
    return found


def _fast_route(rc: Any, where: str) -> FastRoute:
    """One route as the fast path runs it, or FastPathError saying what it would skip."""

    def refuse(what: str) -> FastPathError:
        return FastPathError(
            f"the gateway's fast path serves {where} without FastAPI's dependency solver and"
            f" would skip {what}: give the route only `async def` dependencies that take the"
            " Request alone, or take it off the fast path (app/gateway/api.py, FAST_PATH)"
        )

    if "{" in rc.path:
        raise refuse("its path parameters")
    if rc.response_model is not None:
        raise refuse(f"its response model {rc.response_model!r} (return a Response)")
    if rc.max_body_size is not None:
        raise refuse("its body size limit")
    if not inspect.iscoroutinefunction(rc.endpoint):
        raise refuse("running a sync handler in a thread")
    dependant: Dependant = rc.dependant
    steps: list[Step] = []
    for dep in dependant.dependencies:
        call = dep.call
        name = getattr(call, "__qualname__", repr(call))
        if (
            not inspect.iscoroutinefunction(call)
            or isinstance(call, SecurityBase)
            or dep.own_oauth_scopes
            or dep.dependencies
            or _own_params(dep)
        ):
            raise refuse(f"dependency {name}")
        assert call is not None
        names = (dep.name,) if dep.name else ()
        same = next((s for s in steps if s.call is call), None) if dep.use_cache else None
        if same is None:
            steps.append(Step(call, dep.request_param_name, names))
        else:
            steps[steps.index(same)] = Step(call, same.request_param, same.names + names)
    extra = _own_params(dependant)
    if extra:
        raise refuse(f"its {extra}")
    return FastRoute(
        route=rc.original_route,
        methods=frozenset(rc.methods or ()),
        endpoint=rc.endpoint,
        request_param=dependant.request_param_name,
        steps=tuple(steps),
    )


def _own_params(dependant: Dependant) -> str:
    """What a dependant reads besides the Request ('' for nothing), as words for an error."""
    read = [
        kind
        for kind, fields in (
            ("path parameters", dependant.path_params),
            ("query parameters", dependant.query_params),
            ("headers", dependant.header_params),
            ("cookies", dependant.cookie_params),
            ("body", dependant.body_params),
        )
        if fields
    ]
    read += [
        kind
        for kind, param in (
            ("websocket", dependant.websocket_param_name),
            ("HTTPConnection parameter", dependant.http_connection_param_name),
            ("Response parameter", dependant.response_param_name),
            ("background tasks", dependant.background_tasks_param_name),
            ("security scopes", dependant.security_scopes_param_name),
        )
        if param
    ]
    return ", ".join(read)


class GatewayFastPath:
    """Dispatch the fast routes (`routes`) straight to their dependencies and handler.

    Every other request, and every request while the app has dependency overrides, goes on to
    the app unchanged; the routes stay declared there (OpenAPI, the role sweep).
    """

    def __init__(self, app: ASGIApp, *, routes: dict[str, FastRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.routes.get(_route_path(scope)) if scope["type"] == "http" else None
        if fast is None or scope["method"] not in fast.methods or scope["app"].dependency_overrides:
            await self.app(scope, receive, send)
            return
        scope["route"] = fast.route  # as FastAPI sets it (the metrics middleware reads its path)
        request = Request(scope, receive)
        try:
            kwargs: dict[str, Any] = {}
            if fast.request_param:
                kwargs[fast.request_param] = request
            for step in fast.steps:
                value = await (
                    step.call(**{step.request_param: request})
                    if step.request_param
                    else step.call()
                )
                for name in step.names:
                    kwargs[name] = value
            response = await fast.endpoint(**kwargs)
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
