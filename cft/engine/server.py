"""vLLM's OpenAI-compatible HTTP API (the subset cft uses) over the engine: routes and errors."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from cft.engine.core import Engine
from cft.engine.generate import generate
from cft.engine.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    UnloadLoRAAdapterRequest,
    error_body,
)
from cft.engine.request import EngineError


def _error(
    message: str,
    error_type: str,
    status: int,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(message, error_type, status, param), status_code=status, headers=headers
    )


def _text_of(message: ChatMessage) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        parts = []
        for part in content:
            if part.get("type") != "text":
                raise EngineError(f"Unsupported content part type: {part.get('type')!r}.")
            parts.append(str(part.get("text", "")))
        content = "".join(parts)
    return {"role": message.role, "content": content or ""}


def create_app(engine: Engine) -> FastAPI:
    """The engine's FastAPI app."""
    app = FastAPI(title="cft engine", docs_url=None, redoc_url=None)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return _error(exc.message, exc.error_type, exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts, param = [], None
        for err in exc.errors()[:5]:
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            param = param or loc
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        return _error("; ".join(parts) or "invalid request", "BadRequestError", 400, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        return _error(str(exc.detail), kind, exc.status_code)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        created = int(time.time())
        base = engine.model
        cards = [
            ModelCard(
                id=base.name,
                created=created,
                root=base.path,
                parent=None,
                max_model_len=base.max_model_len,
            )
        ]
        cards += [
            ModelCard(id=a.name, created=created, root=a.path, parent=base.name, max_model_len=None)
            for a in list(engine.adapters.by_name.values())
        ]
        return ModelList(data=cards)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        await run_in_threadpool(engine.load_adapter, body.lora_name, body.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        await run_in_threadpool(engine.unload_adapter, body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        messages = [_text_of(m) for m in body.messages]
        ids = engine.model.chat_prompt_ids(messages)
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await generate(engine, body, ids, max_tokens, endpoint="chat")

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> Response:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise EngineError("Only one prompt per request is supported (got a list).")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = engine.model.text_prompt_ids(prompt)
        else:
            ids = [int(t) for t in prompt]
        if body.echo:
            raise EngineError("echo is not supported by the local engine.")
        return await generate(engine, body, ids, body.max_tokens, endpoint="completions")

    return app
