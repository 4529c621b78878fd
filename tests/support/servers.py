"""Start real servers on free loopback ports for tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from app.core.http_server import server_options


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_app(
    app: Any, *, ready_path: str = "/healthz", timeout: float = 30, port: int | None = None
) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a thread (on port, or a free one); yield its base URL."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", **server_options())
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + ready_path, timeout=2).status_code < 500:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"server on {base} did not become ready")
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def metrics_text() -> str:
    """This process's Prometheus metrics, fetched over HTTP from a metrics listener of its own
    (the API serves them on CFT_METRICS_PORT, never on its public port)."""
    from app.core.metrics import serve_metrics

    port = free_port()
    stop = serve_metrics("127.0.0.1", port)
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        stop()
