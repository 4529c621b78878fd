"""What the engine's HTTP layer and its schedulers pass between them: requests and errors."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch


class EngineError(Exception):
    """An error with vLLM's status code and error type (and headers, such as Retry-After)."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        error_type: str = "BadRequestError",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.headers = headers or {}


@dataclass
class Sampling:
    """Per-request sampling parameters."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@dataclass
class GenRequest:
    """One generation in flight; events go to `queue` on `loop`."""

    prompt_ids: list[int]
    adapter: str | None
    sampling: Sampling
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, Any]]
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    # Filled by the scheduler thread.
    admitted: float | None = None  # when its prefill started (time.monotonic())
    first_token: float | None = None  # when its first token was sampled
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    finish_reason: str | None = None
    generator: Any = None

    @property
    def active(self) -> bool:
        """Still generating: neither finished nor given up by its client."""
        return self.finish_reason is None and not self.cancelled

    def emit(self, kind: str, payload: Any) -> None:
        """Hand an event to the request's event loop (thread-safe)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))
