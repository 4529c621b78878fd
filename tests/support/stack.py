"""A tenant with a route, its client key, an artefact store and the router's settings: what a
test needs to register adapters and call the router in front of an engine."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from app.core.artefacts import WEIGHTS_FILE, LocalStore
from app.core.auth import create_key
from app.core.config import get_settings
from tests.support.engines import write_adapter
from tests.support.factories import make_adapter, make_route, make_tenant


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Poll predicate until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


class Stack:
    """A tenant with a route on `base`, its key, an artefact store and the router's settings."""

    def __init__(
        self, db_url: str, tmp_path: Path, base: str, *, serving_dir: Path | None = None
    ) -> None:
        self.db_url = db_url
        self.tmp = tmp_path
        self.base = base
        self.store = LocalStore(tmp_path / "store")
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
            self.tenant = make_tenant(c)
            self.key = create_key(c, tenant_id=self.tenant["id"], role="client")
        self.route = self.add_route()
        self.settings = get_settings().model_copy(
            update={
                "serving_dir": serving_dir or tmp_path / "serving",
                "reconcile_interval": 0.2,
                "router_load_wait": 0.5,
            }
        )

    def add_route(self) -> dict[str, Any]:
        """Another route of the tenant on the same base, with a promotion policy."""
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            route: dict[str, Any] = make_route(c, tenant_id=self.tenant["id"], base_model=self.base)
            c.execute(
                "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
                " VALUES (%s, %s, 'tasks', 'accuracy', 'higher')",
                (route["tenant_id"], route["name"]),
            )
        return route

    def adapter(
        self,
        *,
        status: str,
        pct: int = 0,
        rank: int = 8,
        tamper: bool = False,
        source: Path | None = None,
        route: dict[str, Any] | None = None,
    ) -> str:
        """Store an adapter directory (`source`, else a synthetic one of `rank`) and register
        it on the route (`route`, else the stack's first); its id."""
        route = route or self.route
        version = f"v-{uuid.uuid4().hex[:8]}"
        src = source or write_adapter(self.tmp / "src" / version, rank=rank)
        stored = self.store.put_dir(src, route["name"], version)
        if tamper:
            weights = Path(stored.uri.removeprefix("file://")) / WEIGHTS_FILE
            weights.chmod(0o644)
            weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            row = make_adapter(
                c,
                route=route,
                id=f"{route['name']}-{version}",
                status=status,
                traffic_pct=pct,
                rank=rank,
                weights_uri=stored.uri,
                sha256=stored.sha256,
            )
            c.execute(
                "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
                " VALUES (%s, 'tasks', 'accuracy', 0.5)",
                (row["id"],),
            )
        return str(row["id"])

    def retire(self, adapter_id: str) -> None:
        """Retire an adapter (the reconciler unloads it)."""
        with psycopg.connect(self.db_url, autocommit=True) as c:
            c.execute(
                "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s",
                (adapter_id,),
            )

    def deployment(self, adapter_id: str) -> dict[str, Any]:
        """The adapter's serve.adapter_deployment row ({} when none)."""
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            row = c.execute(
                "SELECT * FROM serve.adapter_deployment WHERE adapter_id = %s", (adapter_id,)
            ).fetchone()
        return row or {}

    def sql(self, query: str, *args: Any) -> None:
        """Run one statement as the owner (autocommit)."""
        with psycopg.connect(self.db_url, autocommit=True) as c:
            c.execute(query, args)

    def call(
        self, api: str, user: str = "u1", *, route: dict[str, Any] | None = None, **over: Any
    ) -> httpx.Response:
        """One completion through the router for the route (`route`, else the first)."""
        name = (route or self.route)["name"]
        body = {"model": name, "prompt": "Hi", "max_tokens": 2, "user": user}
        return httpx.post(
            f"{api}/v1/completions",
            json=body | over,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=120,
        )
