"""vLLM's OpenAI-compatible HTTP API (the subset cft uses) over the engine."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from workers.engine.core import Engine
from workers.engine.request import EngineError, GenRequest, Sampling


class StreamOptions(BaseModel):
    """OpenAI's stream_options."""

    include_usage: bool = False


class _Common(BaseModel):
    # Unknown fields are ignored, as vLLM does (it logs them).
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None


class ChatMessage(BaseModel):
    """One chat message; content is text or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Common):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_Common):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int]
    echo: bool = False


class LoadLoRAAdapterRequest(BaseModel):
    """POST /v1/load_lora_adapter."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    """POST /v1/unload_lora_adapter."""

    lora_name: str
    lora_int_id: int | None = None


def _error(
    message: str,
    error_type: str,
    status: int,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    # vLLM's ErrorResponse: the OpenAI shape with the HTTP status as the code.
    body = {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


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
    async def models() -> dict[str, Any]:
        created = int(time.time())
        perm = {"object": "model_permission", "allow_sampling": True, "allow_view": True}
        cards = [
            {
                "id": engine.model.name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": engine.model.path,
                "parent": None,
                "max_model_len": engine.model.max_model_len,
                "permission": [perm],
            }
        ]
        cards += [
            {
                "id": a.name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": a.path,
                "parent": engine.model.name,
                "max_model_len": None,
                "permission": [perm],
            }
            for a in list(engine.adapters.by_name.values())
        ]
        return {"object": "list", "data": cards}

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
        return await _generate(engine, body, ids, max_tokens, chat=True)

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
        return await _generate(engine, body, ids, body.max_tokens, chat=False)

    return app


async def _generate(
    engine: Engine, body: _Common, ids: list[int], max_tokens: int | None, *, chat: bool
) -> Response:
    endpoint = "chat" if chat else "completions"
    if body.n != 1:
        raise EngineError("Only n=1 is supported by the local engine.")
    if not engine.model_exists(body.model):
        engine.metrics.requests.labels(endpoint, "unknown", "404").inc()
        raise EngineError(
            f"The model `{body.model}` does not exist.", status=404, error_type="NotFoundError"
        )
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if max_tokens is None:
        max_tokens = min(engine.default_max_tokens, engine.model.max_model_len - len(ids))
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=[s for s in stop if s],
    )
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    adapter = None if body.model == engine.model.name else body.model
    req = GenRequest(prompt_ids=ids, adapter=adapter, sampling=sampling, loop=loop, queue=queue)
    try:
        engine.submit(req)
    except EngineError as e:
        engine.metrics.requests.labels(endpoint, body.model, str(e.status)).inc()
        raise
    engine.metrics.prompt_tokens.inc(len(ids))
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    prompt_tokens = len(ids)

    def usage(completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    if not body.stream:
        text = ""
        try:
            while True:
                kind, payload = await queue.get()
                if kind == "delta":
                    text += payload
                elif kind == "error":
                    raise payload
                else:
                    break
        except asyncio.CancelledError:
            req.cancelled = True
            raise
        engine.metrics.requests.labels(endpoint, body.model, "200").inc()
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": payload["finish_reason"],
            "stop_reason": None,
        }
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": body.model,
                "choices": [choice],
                "usage": usage(payload["completion_tokens"]),
            }
        )

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: str | None, finish: str | None, *, role: bool = False) -> str:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if chat:
            d: dict[str, Any] = {}
            if role:
                d["role"] = "assistant"
            if delta is not None:
                d["content"] = delta
            choice["delta"] = d
        else:
            choice["text"] = delta or ""
        data: dict[str, Any] = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": body.model,
            "choices": [choice],
        }
        if include_usage:
            data["usage"] = None
        return f"data: {json.dumps(data)}\n\n"

    async def events() -> AsyncIterator[str]:
        try:
            if chat:
                yield chunk("", None, role=True)
            while True:
                kind, payload = await queue.get()
                if kind == "delta":
                    yield chunk(payload, None)
                elif kind == "error":
                    err = payload
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "error": {
                                    "message": err.message,
                                    "type": err.error_type,
                                    "param": None,
                                    "code": err.status,
                                }
                            }
                        )
                        + "\n\n"
                    )
                    engine.metrics.requests.labels(endpoint, body.model, str(err.status)).inc()
                    break
                else:
                    yield chunk(None if chat else "", payload["finish_reason"])
                    if include_usage:
                        final = {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": body.model,
                            "choices": [],
                            "usage": usage(payload["completion_tokens"]),
                        }
                        yield f"data: {json.dumps(final)}\n\n"
                    engine.metrics.requests.labels(endpoint, body.model, "200").inc()
                    break
            yield "data: [DONE]\n\n"
        finally:
            # A client that goes away stops costing decode steps.
            if req.finish_reason is None:
                req.cancelled = True

    return StreamingResponse(events(), media_type="text/event-stream")
