"""The right to be forgotten, end to end over real HTTP, the CLI and PostgreSQL: the user's rows
and request keys go, what was built from them is tainted (and the gate refuses it), nobody
else's data changes, and the raw id is stored nowhere."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from app.core import auth
from app.core.config import Settings
from app.core.embedded import psql_path
from app.core.pseudonym import user_hash
from app.main import create_app
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.training import make_run

RAW_USER = "forget-me-4c1e@customer.example"
OTHER_USER = "keep-me-9b2d@customer.example"
LABEL = {RAW_USER: "forgotten", OTHER_USER: "kept"}  # message texts never hold the raw ids


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def record(route: str, user: str, text: str) -> dict[str, Any]:
    return {
        "request_id": str(uuid.uuid4()),
        "route": route,
        "adapter_id": "base",
        "user": user,
        "messages": [{"role": "user", "content": text}],
        "completion": "an answer",
    }


def sealed_snapshot(conn: Any, *, tenant_id: int, route: str, log_ids: list[int]) -> dict[str, Any]:
    """A sealed SFT snapshot with one example per log id (its provenance)."""
    with conn.transaction():
        snap = conn.execute(
            "INSERT INTO train.dataset_snapshot (tenant_id, route, method, query_sql, n_train,"
            " set_hash) VALUES (%s, %s, 'sft', '-- test', %s, %s) RETURNING *",
            (tenant_id, route, len(log_ids), uuid.uuid4().hex * 2),
        ).fetchone()
        for log_id in log_ids:
            ex = {"messages": [{"role": "user", "content": f"example of {log_id}"}]}
            conn.execute(
                "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids,"
                " example) VALUES (%s, %s, 'train', %s, %s)",
                (snap["id"], hashlib.sha256(str(log_id).encode()).digest(), [log_id], Jsonb(ex)),
            )
    return snap  # type: ignore[no-any-return]


@pytest.fixture
def world(db_url: str, conn: Any, tmp_path: Path) -> Any:
    """Two tenants with the same raw user id, a second user, snapshots and adapters."""
    settings = Settings(home=tmp_path)
    a = make_tenant(conn)
    b = make_tenant(conn)
    ra = make_route(conn, tenant_id=a["id"])
    rb = make_route(conn, tenant_id=b["id"])
    keys = {
        "a_ingest": auth.create_key(conn, tenant_id=a["id"], role="ingest"),
        "a_admin": auth.create_key(conn, tenant_id=a["id"], role="admin"),
        "a_release": auth.create_key(conn, tenant_id=a["id"], role="release"),
        "a_reader": auth.create_key(conn, tenant_id=a["id"], role="reader"),
        "b_ingest": auth.create_key(conn, tenant_id=b["id"], role="ingest"),
    }
    with serve_app(create_app(settings, db_url=db_url)) as base:
        for key, route, user, n in [
            ("a_ingest", ra, RAW_USER, 3),
            ("a_ingest", ra, OTHER_USER, 2),
            ("b_ingest", rb, RAW_USER, 2),
        ]:
            label = LABEL[user] + key[0]
            body = {"records": [record(route["name"], user, f"{label} q{i}") for i in range(n)]}
            r = httpx.post(f"{base}/v1/logs", json=body, headers=h(keys[key]), timeout=30)
            assert r.status_code == 200, r.text
        yield {"base": base, "a": a, "b": b, "ra": ra, "rb": rb, **keys}


def rows(conn: Any, tenant_id: int) -> list[dict[str, Any]]:
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT id, request_id, user_hash, messages FROM obs.inference_log WHERE tenant_id = %s"
        " ORDER BY id",
        (tenant_id,),
    ).fetchall()


def test_forget_deletes_rows_taints_builds_and_spares_everyone_else(world, conn, db_url, tmp_path):
    a, b, ra, rb = world["a"], world["b"], world["ra"], world["rb"]
    secret = (tmp_path / "secret").read_bytes().strip()
    target = user_hash(RAW_USER, secret)
    before_a = rows(conn, a["id"])
    before_b = rows(conn, b["id"])
    mine = [r for r in before_a if r["user_hash"] == target]
    others = [r for r in before_a if r["user_hash"] != target]
    assert len(mine) == 3 and len(others) == 2 and len(before_b) == 2

    # Snapshot 1 holds one of the user's rows and one of the other user's; snapshot 2 only the
    # other user's; tenant B's snapshot holds B's rows of the same raw id.
    s1 = sealed_snapshot(
        conn, tenant_id=a["id"], route=ra["name"], log_ids=[mine[0]["id"], others[0]["id"]]
    )
    s2 = sealed_snapshot(conn, tenant_id=a["id"], route=ra["name"], log_ids=[others[1]["id"]])
    sb = sealed_snapshot(conn, tenant_id=b["id"], route=rb["name"], log_ids=[before_b[0]["id"]])
    direct = make_adapter(conn, route=ra, dataset_snapshot_id=s1["id"])
    run = make_run(conn, snapshot=s1, status="succeeded")
    via_run = make_adapter(conn, route=ra, training_run_id=run["id"])
    clean = make_adapter(conn, route=ra, dataset_snapshot_id=s2["id"])
    b_adapter = make_adapter(conn, route=rb, dataset_snapshot_id=sb["id"])

    r = httpx.post(
        f"{world['base']}/v1/users/forget", json={"user": RAW_USER}, headers=h(world["a_admin"])
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["user_hash"] == target.hex()
    assert (out["logs_deleted"], out["request_keys_deleted"]) == (3, 3)
    assert (out["snapshots_tainted"], out["adapters_tainted"]) == (1, 2)

    # The user's rows and request keys are gone; the other user's rows are untouched.
    after_a = rows(conn, a["id"])
    assert after_a == others
    keys = conn.execute(
        "SELECT request_id FROM obs.request_key WHERE tenant_id = %s", (a["id"],)
    ).fetchall()
    assert {k["request_id"] for k in keys} == {o["request_id"] for o in others}
    # Tenant B's user with the same raw id is another person: untouched.
    assert rows(conn, b["id"]) == before_b

    def taint(table: str, ident: Any) -> Any:
        return conn.execute(
            f"SELECT tainted_at, tainted_reason FROM {table} WHERE id = %s", (ident,)
        ).fetchone()

    assert taint("train.dataset_snapshot", s1["id"])["tainted_at"] is not None
    assert (
        f"forget request {out['id']}" in taint("train.dataset_snapshot", s1["id"])["tainted_reason"]
    )
    assert taint("train.dataset_snapshot", s2["id"])["tainted_at"] is None
    assert taint("train.dataset_snapshot", sb["id"])["tainted_at"] is None
    assert taint("serve.adapter", direct["id"])["tainted_at"] is not None
    assert taint("serve.adapter", via_run["id"])["tainted_at"] is not None
    assert taint("serve.adapter", clean["id"])["tainted_at"] is None
    assert taint("serve.adapter", b_adapter["id"])["tainted_at"] is None
    # The example built from the user's row is gone from the sealed snapshot (its text was the
    # user's); the other user's example stays, and no export holds the forgotten one.
    left = conn.execute(
        "SELECT log_ids FROM train.dataset_example WHERE snapshot_id = %s", (s1["id"],)
    ).fetchall()
    assert [r["log_ids"] for r in left] == [[others[0]["id"]]]
    export = httpx.get(
        f"{world['base']}/v1/datasets/snapshots/{s1['id']}/export",
        headers=h(world["a_reader"]),
    )
    assert export.status_code == 200, export.text
    assert f"example of {mine[0]['id']}" not in export.text
    assert f"example of {others[0]['id']}" in export.text
    # Only forgetting deletes sealed examples: the owner's plain DELETE is still refused.
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        conn.execute("DELETE FROM train.dataset_example WHERE snapshot_id = %s", (s1["id"],))

    # The gate refuses the tainted candidate, and the API shows the taint.
    check = httpx.get(
        f"{world['base']}/v1/adapters/{direct['id']}/promotion-check", headers=h(world["a_release"])
    )
    assert check.status_code == 200, check.text
    assert check.json()["allowed"] is False
    assert any("tainted" in (bl.get("reason") or "") for bl in check.json()["blockers"]), check.text
    seen = httpx.get(f"{world['base']}/v1/adapters/{direct['id']}", headers=h(world["a_reader"]))
    assert seen.json()["tainted_at"] is not None
    snap = httpx.get(
        f"{world['base']}/v1/datasets/snapshots/{s1['id']}", headers=h(world["a_reader"])
    )
    assert snap.json()["tainted_at"] is not None

    # The audit holds the pseudonym and counts only; the raw id is nowhere in the database.
    audit = conn.execute("SELECT * FROM auth.forget_request").fetchall()
    assert len(audit) == 1 and bytes(audit[0]["user_hash"]) == target
    dump = subprocess.run(
        [str(psql_path().with_name("pg_dump")), "--data-only", db_url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "forget_request" in dump and "kepta q0" in dump  # the dump holds the data
    assert RAW_USER not in dump and RAW_USER.encode().hex() not in dump
    # Forgetting again is harmless: nothing left to delete.
    again = httpx.post(
        f"{world['base']}/v1/users/forget", json={"user": RAW_USER}, headers=h(world["a_admin"])
    )
    assert again.status_code == 200 and again.json()["logs_deleted"] == 0


def test_forget_needs_admin_and_clears_candidate_views(world, conn):
    a, base = world["a"], world["base"]
    for key in ("a_ingest", "a_reader", "a_release"):
        r = httpx.post(f"{base}/v1/users/forget", json={"user": RAW_USER}, headers=h(world[key]))
        assert r.status_code == 403, r.text
    assert (
        httpx.post(
            f"{base}/v1/users/forget", json={"user": ""}, headers=h(world["a_admin"])
        ).status_code
        == 422
    )
    assert len(rows(conn, a["id"])) == 5  # nothing was forgotten by the refused calls

    # The user's edit feeds the SFT candidate view: forgetting removes that copy too.
    rid = conn.execute(
        "SELECT request_id FROM obs.inference_log WHERE messages::text LIKE %s LIMIT 1",
        ("%forgottena q0%",),
    ).fetchone()["request_id"]
    fb = httpx.post(
        f"{base}/v1/logs/{rid}/feedback",
        json={"edited_completion": "a better answer"},
        headers=h(world["a_ingest"]),
    )
    assert fb.status_code == 200, fb.text
    conn.execute("SELECT train.refresh_dataset_candidates()")
    in_view = "SELECT count(*) AS n FROM train.sft_candidate WHERE example::text LIKE %s"
    assert conn.execute(in_view, ("%forgottena q0%",)).fetchone()["n"] == 1
    r = httpx.post(f"{base}/v1/users/forget", json={"user": RAW_USER}, headers=h(world["a_admin"]))
    assert r.status_code == 200, r.text
    assert conn.execute(in_view, ("%forgottena q0%",)).fetchone()["n"] == 0


def test_cli_forgets_in_one_tenant_only(world, conn, db_url, tmp_path):
    a, b = world["a"], world["b"]
    env = os.environ | {"CFT_HOME": str(tmp_path), "CFT_DATABASE_URL": db_url}
    res = subprocess.run(
        [sys.executable, "-m", "cft.cli", "user", "forget", "--tenant", b["name"], RAW_USER],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "2 log rows" in res.stdout and RAW_USER not in res.stdout
    assert rows(conn, b["id"]) == []
    assert len(rows(conn, a["id"])) == 5
    unknown = subprocess.run(
        [sys.executable, "-m", "cft.cli", "user", "forget", "--tenant", "no-such", RAW_USER],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 2 and "no tenant" in unknown.stderr


def test_function_refuses_without_a_tenant_and_to_the_dashboard(conn):
    import psycopg

    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT auth.forget_user(%s)", (b"\x00" * 32,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_dashboard")
        conn.execute("SELECT auth.forget_user(%s)", (b"\x00" * 32,))
