"""The loop as users touch it: REST (policy, status, cycles, kill switch), the CLI, the worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core import auth
from app.core.config import Settings
from app.main import create_app
from tests.support.factories import make_log, make_route, make_tenant
from tests.support.loop import refresh
from tests.support.servers import serve_app
from workers.loop.worker import LoopWorker


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def api(db_url: str, conn: Any, tmp_path: Path) -> Any:
    t = make_tenant(conn)
    other = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    keys = {role: auth.create_key(conn, tenant_id=t["id"], role=role)
            for role in ("trainer", "reader", "admin", "client", "release")}  # fmt: skip
    keys["other"] = auth.create_key(conn, tenant_id=other["id"], role="admin")
    keys["operator"] = auth.create_operator_key(conn, name="ops")
    with serve_app(create_app(Settings(home=tmp_path), db_url=db_url)) as base:
        yield base, keys, r, t


def test_put_and_get_the_loop_policy(api, conn):
    base, keys, r, _ = api
    url = f"{base}/v1/routes/{r['name']}/loop"
    got = httpx.put(url, json={"enabled": True}, headers=h(keys["trainer"]))
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["policy"]["enabled"] is True and body["policy"]["min_new_examples"] == 40
    assert body["policy"]["canary_pct"] == 10 and body["policy"]["min_interval"] == 3600
    assert [t["trigger"] for t in body["triggers"]] == ["forget", "decline", "drift", "volume",
                                                        "schedule"]  # fmt: skip
    assert any(t["line"].startswith("waiting: 0 of 40") for t in body["triggers"])
    assert {x["limit_name"] for x in body["limits"]} >= {
        "kill_switch",
        "one_cycle",
        "cooldown_after_reject",
    }
    # PUT replaces: a field left out takes its default again.
    got = httpx.put(
        url, json={"min_new_examples": 5, "max_interval": "PT2H"}, headers=h(keys["trainer"])
    )
    assert got.json()["policy"]["enabled"] is False and got.json()["policy"]["max_interval"] == 7200
    got = httpx.get(url, headers=h(keys["reader"]))
    assert got.status_code == 200 and got.json()["policy"]["min_new_examples"] == 5


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"enabled": True, "bogus": 1}, 422),
        ({"canary_pct": 60}, 422),  # above the route's ceiling (50)
        ({"hyperparameters": {"no_such_key": 1}}, 422),
        ({"min_new_examples": 0}, 422),
        ({"method": "rlhf"}, 422),
    ],
)
def test_bad_policies_are_refused_in_the_openai_shape(api, body, status):
    base, keys, r, _ = api
    got = httpx.put(f"{base}/v1/routes/{r['name']}/loop", json=body, headers=h(keys["trainer"]))
    assert got.status_code == status, got.text
    assert set(got.json()["error"]) >= {"message", "type", "code"}


def test_roles_and_tenants(api):
    base, keys, r, _ = api
    url = f"{base}/v1/routes/{r['name']}/loop"
    assert httpx.put(url, json={}, headers=h(keys["reader"])).status_code == 403
    assert httpx.get(url, headers=h(keys["client"])).status_code == 403
    assert httpx.get(url, headers=h(keys["other"])).status_code == 404
    ctl = f"{base}/v1/loop/control"
    # The kill switch stops every tenant's loop: the platform operator's, not a tenant's admin.
    for role in ("trainer", "admin", "other"):
        got = httpx.put(ctl, json={"paused": True, "reason": "x"}, headers=h(keys[role]))
        assert got.status_code == 403, (role, got.text)
    assert httpx.get(ctl, headers=h(keys["reader"])).json()["paused"] is False
    assert httpx.put(ctl, json={"paused": True}, headers=h(keys["operator"])).status_code == 400
    got = httpx.put(ctl, json={"paused": True, "reason": "incident"}, headers=h(keys["operator"]))
    assert got.status_code == 200 and got.json()["paused"] is True
    assert got.json()["changed_by"] == "operator key " + keys["operator"][:12] + " (ops)"
    assert httpx.get(ctl, headers=h(keys["reader"])).json()["reason"] == "incident"
    got = httpx.put(ctl, json={"paused": False}, headers=h(keys["operator"]))
    assert got.json()["paused"] is False


def test_a_trainer_key_cannot_lower_the_bar_the_loop_decides_by(api):
    """A trainer key once set decision_alpha 0.49, decision_min_n 2 and no watch, and the loop
    promoted with no release key. Loosening those needs a release key; tightening does not."""
    base, keys, r, _ = api
    url = f"{base}/v1/routes/{r['name']}/loop"
    for loose in ({"decision_alpha": 0.49}, {"decision_min_n": 2}, {"watch_window": 0},
                  {"decision_metric": "edit_rate"}, {"cooldown_after_reject": 0}):  # fmt: skip
        got = httpx.put(url, json={"enabled": True, **loose}, headers=h(keys["trainer"]))
        assert got.status_code == 403, (loose, got.text)
        assert got.json()["error"]["code"] == "decision_field_needs_release"
        assert "release key" in got.json()["error"]["message"]
    tight = {"enabled": True, "decision_alpha": 0.01, "decision_min_n": 500}
    got = httpx.put(url, json=tight, headers=h(keys["trainer"]))
    assert got.status_code == 200, got.text
    # A trainer's PUT keeps the decision fields it leaves out: never back to a looser default.
    got = httpx.put(url, json={"enabled": True}, headers=h(keys["trainer"]))
    policy = got.json()["policy"]
    assert (policy["decision_alpha"], policy["decision_min_n"]) == (0.01, 500)
    # The release key decides promotions: it may loosen them, and its PUT replaces them all.
    got = httpx.put(url, json={"enabled": True, "decision_min_n": 5}, headers=h(keys["release"]))
    assert got.status_code == 200, got.text
    policy = got.json()["policy"]
    assert (policy["decision_alpha"], policy["decision_min_n"]) == (0.05, 5)


def test_the_worker_starts_and_drives_a_cycle_that_rest_shows(api, conn, db_url):
    base, keys, r, t = api
    httpx.put(f"{base}/v1/routes/{r['name']}/loop", json={"enabled": True, "min_new_examples": 2},
              headers=h(keys["trainer"])).raise_for_status()  # fmt: skip
    for i in range(2):
        make_log(conn, tenant_id=t["id"], route=r["name"], fb_edited=True,
                 messages=[{"role": "user", "content": f"q{i}"}], edited_completion=f"a{i}")  # fmt: skip
    refresh(conn)
    worker = LoopWorker(db_url, worker_id="test-worker", refresh_s=0)
    assert worker.run_once() >= 2
    status = httpx.get(f"{base}/v1/routes/{r['name']}/loop", headers=h(keys["reader"])).json()
    cur = status["current_cycle"]
    assert cur["state"] == "training" and cur["method"] == "sft" and cur["trigger"] == "volume"
    got = httpx.get(f"{base}/v1/loop/cycles/{cur['id']}", headers=h(keys["reader"]))
    assert got.status_code == 200
    assert [e["to_state"] for e in got.json()["events"]] == ["triggered", "snapshot", "training"]
    assert (
        httpx.get(f"{base}/v1/loop/cycles/{cur['id']}", headers=h(keys["other"])).status_code == 404
    )


def cft(db_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"CFT_DATABASE_URL": db_url, "CFT_HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from cft.cli import main; sys.exit(main(sys.argv[1:]))",
         *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_cli(conn, db_url, tmp_path):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    out = cft(db_url, tmp_path, "loop", "enable", r["name"], "--set", "min_new_examples=7")
    assert out.returncode == 0, out.stderr
    p = conn.execute("SELECT enabled, min_new_examples FROM loop.policy").fetchone()
    assert p == {"enabled": True, "min_new_examples": 7}
    assert cft(db_url, tmp_path, "loop", "pause", r["name"], "--reason", "holiday").returncode == 0
    out = cft(db_url, tmp_path, "loop", "status", r["name"])
    assert (
        out.returncode == 0 and "paused (holiday)" in out.stdout and "waiting: 0 of 7" in out.stdout
    )
    assert cft(db_url, tmp_path, "loop", "stop-all", "--reason", "audit").returncode == 0
    assert conn.execute("SELECT paused FROM loop.control").fetchone()["paused"] is True
    assert cft(db_url, tmp_path, "loop", "resume-all").returncode == 0
    assert conn.execute("SELECT paused FROM loop.control").fetchone()["paused"] is False
    out = cft(db_url, tmp_path, "loop", "enable", r["name"], "--set", "canary_pct=90")
    assert out.returncode == 1 and "ceiling" in out.stderr
    out = cft(db_url, tmp_path, "worker", "loop", "--once")
    assert out.returncode == 0, out.stderr
