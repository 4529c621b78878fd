"""One generation over HTTP: its sampling, its place in the engine's queue, its answer.

The answer is one JSON response, or server-sent chunks ending with `data: [DONE]` (a failure
mid-stream ends it with an error event instead). A client that goes away cancels its request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi.responses import JSONResponse, Response, StreamingResponse

from cft.engine.core import Engine
from cft.engine.protocol import DONE, GenerationRequest, Reply, error_body, sse
from cft.engine.request import EngineError, GenRequest, Sampling

Endpoint = Literal["chat", "completions"]


async def generate(
    engine: Engine,
    body: GenerationRequest,
    ids: list[int],
    max_tokens: int | None,
    *,
    endpoint: Endpoint,
) -> Response:
    """Generate from prompt ids as body asks; the answer in vLLM's shape for the endpoint."""
    req = _submit(engine, body, ids, max_tokens, endpoint)
    chat = endpoint == "chat"
    reply = Reply(
        id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        created=int(time.time()),
        model=body.model,
        chat=chat,
        prompt_tokens=len(ids),
        stream_usage=bool(body.stream_options and body.stream_options.include_usage),
    )
    if not body.stream:
        return await _whole(engine, req, reply, endpoint)
    events = _events(engine, req, reply, endpoint)
    return StreamingResponse(events, media_type="text/event-stream")


def _sampling(
    engine: Engine, body: GenerationRequest, ids: list[int], max_tokens: int | None
) -> Sampling:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if max_tokens is None:
        max_tokens = min(engine.default_max_tokens, engine.model.max_model_len - len(ids))
    return Sampling(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=[s for s in stop if s],
    )


def _submit(
    engine: Engine,
    body: GenerationRequest,
    ids: list[int],
    max_tokens: int | None,
    endpoint: Endpoint,
) -> GenRequest:
    """Check the request and queue it; errors are counted under the endpoint."""
    if body.n != 1:
        raise EngineError("Only n=1 is supported by the local engine.")
    if not engine.model_exists(body.model):
        engine.metrics.requests.labels(endpoint, "unknown", "404").inc()
        raise EngineError(
            f"The model `{body.model}` does not exist.", status=404, error_type="NotFoundError"
        )
    req = GenRequest(
        prompt_ids=ids,
        adapter=None if body.model == engine.model.name else body.model,
        sampling=_sampling(engine, body, ids, max_tokens),
        loop=asyncio.get_running_loop(),
        queue=asyncio.Queue(),
    )
    try:
        engine.submit(req)
    except EngineError as e:
        engine.metrics.requests.labels(endpoint, body.model, str(e.status)).inc()
        raise
    engine.metrics.prompt_tokens.inc(len(ids))
    return req


async def _whole(engine: Engine, req: GenRequest, reply: Reply, endpoint: Endpoint) -> Response:
    """Wait for the whole generation; an error event becomes the error response."""
    text = ""
    try:
        while True:
            kind, payload = await req.queue.get()
            if kind == "delta":
                text += payload
            elif kind == "error":
                raise payload
            else:
                break
    except asyncio.CancelledError:
        req.cancelled = True
        raise
    engine.metrics.requests.labels(endpoint, reply.model, "200").inc()
    done: dict[str, Any] = payload
    return JSONResponse(reply.whole(text, done["finish_reason"], done["completion_tokens"]))


async def _events(
    engine: Engine, req: GenRequest, reply: Reply, endpoint: Endpoint
) -> AsyncIterator[str]:
    """The stream's server-sent events, as the request's tokens arrive."""
    try:
        if reply.chat:
            yield sse(reply.chunk("", None, role=True))
        while True:
            kind, payload = await req.queue.get()
            if kind == "delta":
                yield sse(reply.chunk(payload, None))
            elif kind == "error":
                err: EngineError = payload
                yield sse(error_body(err.message, err.error_type, err.status))
                engine.metrics.requests.labels(endpoint, reply.model, str(err.status)).inc()
                break
            else:
                yield sse(reply.chunk(None, payload["finish_reason"]))
                if reply.stream_usage:
                    yield sse(reply.usage_chunk(payload["completion_tokens"]))
                engine.metrics.requests.labels(endpoint, reply.model, "200").inc()
                break
        yield DONE
    finally:
        # A client that goes away stops costing decode steps.
        if req.finish_reason is None:
            req.cancelled = True
