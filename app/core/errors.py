"""Domain errors, mapped to HTTP once, with OpenAI-shaped bodies everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

# What "PostgreSQL is unavailable" looks like from the driver: no pooled connection in time,
# or a connection that cannot be opened or was lost.
DB_UNAVAILABLE = (PoolTimeout, psycopg.OperationalError)


class CftError(Exception):
    """Base of every error a client can cause or observe."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.headers = headers or {}
        self.param = param


class BadRequest(CftError):
    """The request is malformed or violates a rule the client can fix."""


class Unprocessable(CftError):
    """The request parsed but a value is invalid (same status as FastAPI's validation)."""

    status_code = 422
    code = "invalid_value"


class Unauthorized(CftError):
    """No valid API key."""

    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(CftError):
    """The key is valid but its role may not do this."""

    status_code = 403
    error_type = "permission_error"
    code = "forbidden"


class NotFound(CftError):
    """The thing does not exist for this tenant."""

    status_code = 404
    error_type = "not_found_error"
    code = "not_found"


class Conflict(CftError):
    """The request conflicts with the current state (e.g. the promotion gate refused)."""

    status_code = 409
    error_type = "conflict_error"
    code = "conflict"


class PayloadTooLarge(CftError):
    """The body is over the documented limit."""

    status_code = 413
    code = "payload_too_large"


class TooManyRequests(CftError):
    """A key, tenant or client address went over its request rate; retry after Retry-After."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class Unavailable(CftError):
    """A dependency (the database, an engine) is down; retry later."""

    status_code = 503
    error_type = "service_unavailable"
    code = "unavailable"


class DatabaseUnavailable(Unavailable):
    """PostgreSQL is unavailable (see DB_UNAVAILABLE); the client should retry in a second."""

    def __init__(self, message: str = "the database is unavailable") -> None:
        super().__init__(message, headers={"Retry-After": "1"})


@contextmanager
def database_required(*, detail: bool = False) -> Iterator[None]:
    """Raise DatabaseUnavailable (503, Retry-After) for a DB_UNAVAILABLE error inside.

    With detail, the message ends with the driver's first line (e.g. the pool's timeout).
    """
    try:
        yield
    except DB_UNAVAILABLE as exc:
        message = "the database is unavailable"
        if detail:
            message += f": {str(exc).splitlines()[0] if str(exc) else exc}"
        raise DatabaseUnavailable(message) from exc


def error_body(
    message: str, error_type: str, code: str, param: str | None = None
) -> dict[str, Any]:
    """The OpenAI error shape."""
    return {"error": {"message": message, "type": error_type, "code": code, "param": param}}


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    parts = []
    first_param = None
    for err in exc.errors()[:5]:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
        where = ".".join(loc) or "body"
        first_param = first_param or where
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts) or "invalid request", first_param


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into the OpenAI shape."""

    @app.exception_handler(CftError)
    async def _cft(_: Request, exc: CftError) -> JSONResponse:
        return JSONResponse(
            error_body(exc.message, exc.error_type, exc.code, exc.param),
            exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation(exc)
        return JSONResponse(
            error_body(message, "invalid_request_error", "invalid_value", param), 422
        )

    @app.exception_handler(psycopg.DataError)
    async def _data(_: Request, exc: psycopg.DataError) -> JSONResponse:
        # SQLSTATE class 22 (and psycopg's own NUL-byte refusal): a value the client sent is
        # not representable, e.g. a NUL character in a text field. The client's error, not ours.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return JSONResponse(
            error_body(f"invalid value: {first}", "invalid_request_error", "invalid_value"), 422
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 401: "invalid_api_key"}
        return JSONResponse(
            error_body(
                str(exc.detail), "invalid_request_error", codes.get(exc.status_code, "error")
            ),
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )
