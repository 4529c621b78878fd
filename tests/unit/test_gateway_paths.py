"""The gateway's fast path matches the same paths as the declared routes, under a root_path too."""

from __future__ import annotations

from typing import Any

import pytest
from starlette._utils import get_route_path

from app.gateway.fastpath import _FAST, _route_path


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


def test_fast_path_serves_the_two_hot_routes_under_a_root_path() -> None:
    scope: Any = {"path": "/api/v1/chat/completions", "root_path": "/api"}
    assert _FAST[_route_path(scope)][0] == "chat"
    scope = {"path": "/api/v1/completions", "root_path": "/api"}
    assert _FAST[_route_path(scope)][0] == "completions"
