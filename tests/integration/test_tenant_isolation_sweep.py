"""Tenant isolation sweep: for every endpoint of the OpenAPI schema that takes an id, tenant B's
admin key on tenant A's real ids gets 404 (never 403, which would confirm the id exists, and
never A's data); A's own key gets the thing (so the 404 is not vacuous)."""

from __future__ import annotations

import re
from typing import Any

import httpx

from app.core import auth
from app.core.config import Settings
from app.finetuning import files as ft_files
from app.finetuning import service as ft_jobs
from app.finetuning.schemas import JobCreate
from app.main import create_app
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.training import make_run, make_snapshot

SKIP = {"/v1/chat/completions", "/v1/completions"}  # the router's LLM endpoints, no ids
# The operator API (/v1/tenants): no tenant key may use it at all (403, swept by role in
# test_security.py; tenants apart in test_tenants_api.py).
SKIP |= {"/v1/tenants/{name}", "/v1/tenants/{name}/keys", "/v1/tenants/{name}/keys/{key_id}"}
BODIES: dict[str, Any] = {
    "/v1/logs/{request_id}/feedback": {"thumbs": 1},
    "/v1/routes/{name}": {"fallback": "prod"},
    "/v1/adapters/{adapter_id}/canary": {"traffic_pct": 5},
    "/v1/adapters/{adapter_id}/promote": {"reason": "sweep"},
    "/v1/adapters/{adapter_id}/rollback": {"reason": "sweep"},
    "/v1/adapters/{adapter_id}/eval-results": {
        "results": [{"suite_id": "s", "metric": "m", "score": 1.0}]
    },
}


def test_other_tenants_ids_are_404_on_every_endpoint(db_url: str, conn: Any, tmp_path: Any) -> None:
    a = make_tenant(conn)
    b = make_tenant(conn)
    route = make_route(conn, tenant_id=a["id"])
    adapter = make_adapter(conn, route=route)
    snap = make_snapshot(conn, tenant_id=a["id"], route=route["name"], method="sft")
    run = make_run(conn, snapshot=snap)
    log = make_log(conn, tenant_id=a["id"], route=route["name"], experiment="exp-a")
    cycle = conn.execute(
        "INSERT INTO loop.cycle (tenant_id, route, trigger) VALUES (%s, %s, 'volume') RETURNING id",
        (a["id"], route["name"]),
    ).fetchone()
    ft_file = ft_files.create(
        conn,
        tenant_id=a["id"],
        filename="a.jsonl",
        purpose="fine-tune",
        content=b'{"messages": [{"role": "user", "content": "hi"},'
        b' {"role": "assistant", "content": "hello"}]}\n',
        max_bytes=1 << 20,
    )
    ft_job = ft_jobs.create(
        conn,
        tenant_id=a["id"],
        body=JobCreate(model=route["name"], training_file=ft_file.id),
        actor="sweep",
    )
    ids = {
        "file_id": ft_file.id,
        "fine_tuning_job_id": ft_job.id,
        "adapter_id": adapter["id"],
        "snapshot_id": str(snap["id"]),
        "run_id": str(run["id"]),
        "request_id": str(log["request_id"]),
        "name": route["name"],
        "cycle_id": str(cycle["id"]),
    }
    key_a = auth.create_key(conn, tenant_id=a["id"], role="admin")
    key_b = auth.create_key(conn, tenant_id=b["id"], role="admin")

    with serve_app(create_app(Settings(home=tmp_path), db_url=db_url, engine_urls=[])) as base:
        schema = httpx.get(f"{base}/openapi.json").json()
        swept: list[str] = []
        for path, ops in schema["paths"].items():
            params = re.findall(r"{(\w+)}", path)
            if not params or path in SKIP:
                continue
            assert set(params) <= set(ids), f"the sweep does not know ids of {path}: add them"
            values = {p: ids[p] for p in params}
            experiments = path.startswith("/v1/experiments/")
            if experiments:
                values["name"] = "exp-a"  # an experiment is named by its traffic, not a route
            url = base + path.format(**values)
            for method in ops:
                if method not in ("get", "post", "put", "delete", "patch"):
                    continue
                body = BODIES.get(path, {}) if method != "get" else None
                r = httpx.request(
                    method, url, json=body, headers={"Authorization": f"Bearer {key_b}"}, timeout=30
                )
                label = f"{method.upper()} {path}"
                assert r.status_code == 404, f"{label}: {r.status_code} {r.text[:300]}"
                # An error body only (it may echo the id B sent, nothing of A's row).
                assert set(r.json()) == {"error"}, f"{label} leaks: {r.text[:300]}"
                assert r.json()["error"]["type"] == "not_found_error", r.text
                if (
                    method == "get" and not experiments
                ):  # the owner does see it: the 404 above is about tenancy
                    mine = httpx.get(url, headers={"Authorization": f"Bearer {key_a}"}, timeout=30)
                    assert mine.status_code == 200, (
                        f"{label} (owner): {mine.status_code} {mine.text[:300]}"
                    )
                swept.append(label)
    assert len(swept) >= 10, swept
    # The rows B tried to change are unchanged.
    assert (
        conn.execute("SELECT status FROM serve.adapter WHERE id = %s", (adapter["id"],)).fetchone()[
            "status"
        ]
        == "candidate"
    )
    assert (
        conn.execute(
            "SELECT fb_explicit FROM obs.inference_log WHERE id = %s", (log["id"],)
        ).fetchone()["fb_explicit"]
        is None
    )
    assert (
        conn.execute(
            "SELECT cancel_requested, status FROM train.training_run WHERE id = %s", (run["id"],)
        ).fetchone()["status"]
        == "queued"
    )
    assert ft_jobs.get_or_raise(conn, job_id=ft_job.id).status == "queued"
    assert ft_files.get(conn, file_id=ft_file.id) is not None
