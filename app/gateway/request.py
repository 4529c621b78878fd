"""What the gateway reads from a call: its headers (parsed once), body, route, user and id."""

from __future__ import annotations

import os
import uuid
from typing import Any

import orjson
from starlette.requests import Request

from app.core.errors import BadRequest, Unavailable
from app.gateway.service import RouterRuntime

# Request headers the gateway reads, found in one pass over the raw list.
_WANTED = frozenset({b"authorization", b"x-cft-route", b"x-cft-user", b"x-request-id"})
_HEADERS_KEY = "cft.headers"


class RequestIds:
    """Random (version 4) request ids cut from a 4 KiB os.urandom buffer: one system call per
    256 ids instead of one per call (each is a chance for the kernel to preempt the loop)."""

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        # A forked child must not replay the parent's buffer.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._buf, self._pos = b"", 0

    def next(self) -> uuid.UUID:
        """A fresh random UUID."""
        if self._pos >= len(self._buf):
            self._buf, self._pos = os.urandom(4096), 0
        raw = self._buf[self._pos : self._pos + 16]
        self._pos += 16
        return uuid.UUID(bytes=raw, version=4)


_ids = RequestIds()


def get_runtime(request: Request) -> RouterRuntime | None:
    """The router runtime of the app serving request, or None (no engines configured)."""
    runtime: RouterRuntime | None = getattr(request.app.state, "router", None)
    return runtime


def get_runtime_or_raise(request: Request) -> RouterRuntime:
    """The router runtime, or 503 when this server has no inference engine configured."""
    runtime = get_runtime(request)
    if runtime is None:
        raise Unavailable("this server has no inference engine configured (set CFT_ENGINE_URLS)")
    return runtime


def _headers(request: Request) -> dict[bytes, bytes]:
    """The gateway's request headers (first value of each), parsed once per request."""
    scope = request.scope
    found: dict[bytes, bytes] | None = scope.get(_HEADERS_KEY)
    if found is None:
        found = {}
        for name, value in scope["headers"]:
            if name in _WANTED and name not in found:
                found[name] = value
        scope[_HEADERS_KEY] = found
    return found


def header(request: Request, name: bytes) -> str | None:
    """The first value of one of the gateway's headers (lower-case name), or None."""
    value = _headers(request).get(name)
    return value.decode("latin-1") if value is not None else None


def parse_body(raw: bytes) -> dict[str, Any]:
    """The call's JSON object (400 when it is not one)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


# The OpenAI request fields the gateway passes to an engine (docs/serving.md). Anything else,
# engine-specific extras included, is refused: an engine must never receive a field cft has
# not decided to allow (one that picks a model or adapter, a guided-decoding grammar, ...).
COMMON_FIELDS = frozenset({
    "model", "user", "stream", "stream_options", "max_tokens", "temperature", "top_p", "stop",
    "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "n",
})  # fmt: skip
FIELDS = {
    "chat": COMMON_FIELDS
    | {"messages", "max_completion_tokens", "top_logprobs", "response_format"},
    "completions": COMMON_FIELDS | {"prompt", "echo", "suffix"},
}


def check_fields(body: dict[str, Any], kind: str) -> None:
    """400 naming the first field the gateway does not pass, or an `n` other than 1."""
    allowed = FIELDS[kind]
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise BadRequest(
            f"field {unknown[0]!r} is not supported by this router; supported:"
            f" {', '.join(sorted(allowed))}",
            param=unknown[0],
        )
    if body.get("n", 1) != 1:
        raise BadRequest("`n` must be 1: each call is one answer, logged and rated", param="n")


def route_name(request: Request, body: dict[str, Any]) -> str:
    """The route the call names: the X-Cft-Route header, else `model`."""
    name = header(request, b"x-cft-route") or body.get("model")
    if not isinstance(name, str) or not name:
        raise BadRequest('name the route in `model` (e.g. "support-es") or the X-Cft-Route header')
    return name


def user(request: Request, body: dict[str, Any]) -> str | None:
    """The end user the call is for: the X-Cft-User header, else `user`, else None."""
    found = header(request, b"x-cft-user") or body.get("user")
    return str(found) if found not in (None, "") else None


def request_id(request: Request) -> str:
    """The caller's X-Request-Id when it is a UUID, else a fresh random one."""
    given = header(request, b"x-request-id")
    return str(uuid.UUID(given) if _is_uuid(given) else _ids.next())


def _is_uuid(value: str | None) -> bool:
    if not value:
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
