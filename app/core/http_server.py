"""How cft's HTTP servers (the API + router, the local engine) run under uvicorn.

Idle keep-alive connections are kept for KEEP_ALIVE_S. uvicorn's default (5 s) equals the idle
expiry of httpx's pool (the OpenAI Python SDK's): a client reusing a connection idle for just
under 5 s races the server closing it, and the request fails with a connection reset (the demo
hit it between two canary rounds). Servers should outlive their clients' pools, and load
balancers' (60 s is common), so a client always closes first. cft's own engine client drops
idle connections after 4 s (app/gateway/client.py).
"""

from __future__ import annotations

from typing import Any

KEEP_ALIVE_S = 75


def server_options() -> dict[str, Any]:
    """uvicorn options every cft server uses (besides app, host and port)."""
    return {"log_level": "warning", "timeout_keep_alive": KEEP_ALIVE_S}
