"""Background tasks of the gateway (relays closed after a client went away, key re-checks)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

# Kept referenced until done: the event loop holds only weak references to tasks.
_tasks: set[asyncio.Task[None]] = set()


def background(coro: Coroutine[Any, Any, None]) -> None:
    """Run coro on the running loop without waiting for it."""
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
