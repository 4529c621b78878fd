"""Make an `openai.OpenAI` / `openai.AsyncOpenAI` client log its chat completions to cft.

    client = cft_sdk.openai.wrap(openai.OpenAI(base_url=..., api_key=...), cft, route="support")
    resp = client.chat.completions.create(model=..., messages=[...])
    cft.feedback(resp.cft_request_id, thumbs=1)

Whatever provider the client talks to, each `chat.completions.create` call (streaming or not,
sync or async) is logged as one record once its answer is complete: the record goes onto the
cft client's queue (no network I/O on the caller's path), and the call's result is returned
as it came. The request id is chosen before the call, sent as `X-Request-Id` (so a cft router
on the path logs the same id, and the second record is reported "existing" instead of
doubling), and set on the result as `cft_request_id` (a stream has it before the first chunk).

Not wrapped: `with_raw_response` / `with_streaming_response` and clients made by
`client.with_options(...)` (wrap those too). openai is never imported here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from cft_sdk.client import Client
from cft_sdk.ids import new_request_id

T = TypeVar("T")
log = logging.getLogger("cft_sdk")


def wrap(
    client: T,
    cft: Client,
    *,
    route: str | None = None,
    adapter_id: str | None = None,
    experiment: str | None = None,
    variant: str | None = None,
    send_request_id: bool = True,
) -> T:
    """Log every chat completion of client to cft (in place; returns client).

    route defaults to the cft client's route; per call, `cft_route=`, `cft_request_id=`,
    `cft_parent_request_id=` (a regeneration of that request) and `cft_experiment=` may be
    passed to create() and are not sent to the provider.
    """
    completions = client.chat.completions  # type: ignore[attr-defined]
    original = completions.create
    if getattr(original, "__cft_wrapped__", False):
        return client
    defaults = _Defaults(cft, route, adapter_id, experiment, variant, send_request_id)
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(original) or inspect.iscoroutinefunction(
        getattr(original, "__wrapped__", None)
    ):

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = _Call(defaults, kwargs)
            try:
                result = await original(*args, **call.kwargs)
            except Exception as exc:
                call.failed(exc)
                raise
            if call.stream:
                return _AsyncLoggedStream(result, call)
            return call.done(result)

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = _Call(defaults, kwargs)
            try:
                result = original(*args, **call.kwargs)
            except Exception as exc:
                call.failed(exc)
                raise
            if call.stream:
                return _LoggedStream(result, call)
            return call.done(result)

    wrapper.__cft_wrapped__ = True  # type: ignore[attr-defined]
    completions.create = wrapper
    return client


class _Defaults:
    def __init__(
        self,
        cft: Client,
        route: str | None,
        adapter_id: str | None,
        experiment: str | None,
        variant: str | None,
        send_request_id: bool,
    ) -> None:
        self.cft = cft
        self.route = route
        self.adapter_id = adapter_id
        self.experiment = experiment
        self.variant = variant
        self.send_request_id = send_request_id


class _Call:
    """One create() call: its request id, timings, and the record it becomes."""

    def __init__(self, d: _Defaults, kwargs: dict[str, Any]) -> None:
        self.d = d
        # These configure the record and are removed before the call.
        self.request_id = str(kwargs.pop("cft_request_id", None) or new_request_id())
        self.route = kwargs.pop("cft_route", None) or d.route
        self.parent = kwargs.pop("cft_parent_request_id", None)
        self.experiment = kwargs.pop("cft_experiment", None) or d.experiment
        if d.send_request_id:
            headers = dict(kwargs.get("extra_headers") or {})
            headers.setdefault("X-Request-Id", self.request_id)
            kwargs["extra_headers"] = headers
        self.kwargs = kwargs
        self.stream = bool(kwargs.get("stream"))
        self.started = time.perf_counter()
        self.first_token_ms: int | None = None
        self.pieces: list[str] = []
        self.model: str | None = None
        self.usage: Any = None
        self.finish_reason: str | None = None
        self.logged = False

    def done(self, response: Any) -> Any:
        """Log a complete (non-streaming) response and tag it with the request id."""
        choices = getattr(response, "choices", None) or []
        message = getattr(choices[0], "message", None) if choices else None
        content = getattr(message, "content", None)
        self.finish_reason = getattr(choices[0], "finish_reason", None) if choices else None
        self.model = getattr(response, "model", None)
        self.usage = getattr(response, "usage", None)
        self._log(completion=content if isinstance(content, str) else None, ttft_ms=None)
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            response.cft_request_id = self.request_id
        return response

    def chunk(self, chunk: Any) -> None:
        """Take what a stream chunk adds to the answer."""
        self.model = getattr(chunk, "model", None) or self.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        for choice in getattr(chunk, "choices", None) or []:
            if getattr(choice, "index", 0) != 0:
                continue
            delta = getattr(choice, "delta", None)
            text = getattr(delta, "content", None)
            if isinstance(text, str) and text:
                if self.first_token_ms is None:
                    self.first_token_ms = self._elapsed_ms()
                self.pieces.append(text)
            if getattr(choice, "finish_reason", None):
                self.finish_reason = choice.finish_reason

    def stream_ended(self, exc: BaseException | None = None) -> None:
        """Log a stream once: when it is exhausted, closed, or fails."""
        status = "error" if exc is not None else None
        self._log(completion="".join(self.pieces), ttft_ms=self.first_token_ms, status=status)

    def failed(self, exc: BaseException) -> None:
        """Log a call the provider failed (status error, no completion)."""
        self._log(completion=None, ttft_ms=None, status="error")

    def _elapsed_ms(self) -> int:
        return max(0, round((time.perf_counter() - self.started) * 1000))

    def _log(
        self, *, completion: str | None, ttft_ms: int | None, status: str | None = None
    ) -> None:
        if self.logged:
            return
        self.logged = True
        if status is None:
            status = "partial" if self.finish_reason == "length" else "ok"
        try:
            self._enqueue(completion, ttft_ms, status)
        except Exception:  # a bad value must not fail a call the provider answered
            log.exception("cft: could not log chat completion %s", self.request_id)

    def _enqueue(self, completion: str | None, ttft_ms: int | None, status: str) -> None:
        usage = self.usage
        self.d.cft.log(
            request_id=self.request_id,
            route=self.route,
            messages=[_message(m) for m in self.kwargs.get("messages") or []],
            completion=completion,
            model=self.model or self.kwargs.get("model"),
            adapter_id=self.d.adapter_id,
            experiment=self.experiment,
            variant=self.d.variant,
            ttft_ms=ttft_ms if ttft_ms is not None else self._elapsed_ms(),
            tokens_in=getattr(usage, "prompt_tokens", None),
            tokens_out=getattr(usage, "completion_tokens", None),
            user=self.kwargs.get("user") if isinstance(self.kwargs.get("user"), str) else None,
            parent_request_id=self.parent,
            status=status,
        )


def _message(m: Any) -> dict[str, Any]:
    if isinstance(m, dict):
        return {k: _plain(v) for k, v in m.items()}
    dump = getattr(m, "model_dump", None)
    if callable(dump):
        out: dict[str, Any] = dump(exclude_none=True)
        return out
    return dict(m)


def _plain(v: Any) -> Any:
    dump = getattr(v, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


class _LoggedStream:
    """A sync stream that hands chunks through unchanged and logs when it ends."""

    def __init__(self, stream: Any, call: _Call) -> None:
        self._stream = stream
        self._iter: Iterator[Any] = iter(stream)
        self._call = call
        self.cft_request_id = call.request_id

    def __iter__(self) -> _LoggedStream:
        return self

    def __next__(self) -> Any:
        try:
            chunk = next(self._iter)
        except StopIteration:
            self._call.stream_ended()
            raise
        except Exception as exc:
            self._call.stream_ended(exc)
            raise
        self._call.chunk(chunk)
        return chunk

    def __enter__(self) -> _LoggedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying stream; what arrived so far is logged."""
        try:
            self._stream.close()
        finally:
            self._call.stream_ended()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _AsyncLoggedStream:
    """An async stream that hands chunks through unchanged and logs when it ends."""

    def __init__(self, stream: Any, call: _Call) -> None:
        self._stream = stream
        self._iter: AsyncIterator[Any] = stream.__aiter__()
        self._call = call
        self.cft_request_id = call.request_id

    def __aiter__(self) -> _AsyncLoggedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._iter.__anext__()
        except StopAsyncIteration:
            self._call.stream_ended()
            raise
        except Exception as exc:
            self._call.stream_ended(exc)
            raise
        self._call.chunk(chunk)
        return chunk

    async def __aenter__(self) -> _AsyncLoggedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the underlying stream; what arrived so far is logged."""
        try:
            await self._stream.close()
        finally:
            self._call.stream_ended()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
