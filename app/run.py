"""`cft run`: the main job on one machine (embedded database, migrations, API)."""

from __future__ import annotations

import argparse

from app.core.config import get_settings
from app.core.db import database_url, migrate


def main(args: argparse.Namespace) -> int:
    """Start the embedded database, migrate it and serve the API until Ctrl-C."""
    import uvicorn

    from app.main import create_app

    settings = get_settings()
    where = f"embedded under {settings.pgdata}" if settings.embedded else "external"
    print(f"[cft] database: {where}", flush=True)
    url = database_url(settings)
    migrate(url)
    print("[cft] schema migrated", flush=True)
    host = args.host or settings.host
    port = args.port or settings.port
    print(f"[cft] API: http://{host}:{port}  (try: curl http://{host}:{port}/healthz)", flush=True)
    uvicorn.run(create_app(settings, db_url=url), host=host, port=port, log_level="warning")
    return 0
