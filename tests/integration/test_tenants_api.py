"""The operator API over real HTTP: tenants, consent and keys; offboarding a tenant whose prod
adapter a real engine serves (the reconciler in the API unloads it first), with the local
artefact store, another tenant serving beside it untouched."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core import auth
from app.core.artefacts import LocalStore
from app.core.config import Settings
from app.main import create_app
from app.tenants import service
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from cft.serve import create_app as create_api_with_reconciler
from tests.support.factories import make_tenant
from tests.support.lora import make_adapter_dir
from tests.support.servers import free_port, serve_app
from tests.support.tenants import counts, populate
from workers import base_model

BASE = base_model.BUNDLED


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert err["message"] and err["type"], resp.text
    return err


def test_operator_api_tenants_consent_and_keys(conn: Any, db_url: str, tmp_path: Path) -> None:
    op_key = auth.create_operator_key(conn, name="ops")
    other = make_tenant(conn, consent_training=False)
    admin = auth.create_key(conn, tenant_id=other["id"], role="admin")
    other_reader = auth.create_key(conn, tenant_id=other["id"], role="reader")
    app = create_app(Settings(home=tmp_path), db_url=db_url, engine_urls=[])
    with serve_app(app) as base, httpx.Client(base_url=base, timeout=30) as http:
        # Who may: no key 401; a tenant's admin 403; an operator key acts for no tenant.
        _error(http.post("/v1/tenants", json={"name": "acme"}), 401)
        err = _error(http.post("/v1/tenants", json={"name": "acme"}, headers=_h(admin)), 403)
        assert "operator key" in err["message"] and "admin" in err["message"]
        _error(http.delete(f"/v1/tenants/{other['name']}", headers=_h(admin)), 403)
        _error(http.get("/v1/tenants", headers=_h(other_reader)), 403)
        err = _error(http.get("/v1/routes", headers=_h(op_key)), 403)
        assert "operator key" in err["message"]

        # Tenants: create, duplicate, malformed, list, read, unknown.
        resp = http.post("/v1/tenants", json={"name": "acme"}, headers=_h(op_key))
        assert resp.status_code == 201, resp.text
        assert resp.json()["consent_training"] is False and resp.json()["live_keys"] == 0
        err = _error(http.post("/v1/tenants", json={"name": "acme"}, headers=_h(op_key)), 409)
        assert "acme" in err["message"] and err["type"] == "conflict_error"
        err = _error(http.post("/v1/tenants", json={"name": "Bad Name"}, headers=_h(op_key)), 422)
        assert "lower-case" in err["message"]
        names = [t["name"] for t in http.get("/v1/tenants", headers=_h(op_key)).json()["data"]]
        assert names == [other["name"], "acme"]
        assert http.get("/v1/tenants/acme", headers=_h(op_key)).json()["name"] == "acme"
        assert _error(http.get("/v1/tenants/nope", headers=_h(op_key)), 404)["type"] == (
            "not_found_error"
        )

        # Consent, as the candidate views and snapshots read it (tenant.consent_training).
        resp = http.patch("/v1/tenants/acme", json={"consent_training": True}, headers=_h(op_key))
        assert resp.status_code == 200 and resp.json()["consent_training"] is True, resp.text
        row = conn.execute(
            "SELECT consent_training, updated_at > created_at AS moved FROM tenant"
            " WHERE name = 'acme'"
        ).fetchone()
        assert row == {"consent_training": True, "moved": True}
        _error(
            http.patch("/v1/tenants/nope", json={"consent_training": True}, headers=_h(op_key)), 404
        )

        # Keys: bad role (the allowed ones named), unknown tenant, create (shown once), use.
        err = _error(
            http.post("/v1/tenants/acme/keys", json={"role": "root"}, headers=_h(op_key)), 422
        )
        assert ", ".join(auth.ROLES) in err["message"]
        _error(
            http.post("/v1/tenants/acme/keys", json={"role": "operator"}, headers=_h(op_key)), 422
        )
        _error(http.post("/v1/tenants/nope/keys", json={"role": "reader"}, headers=_h(op_key)), 404)
        resp = http.post(
            "/v1/tenants/acme/keys", json={"role": "reader", "name": "dash"}, headers=_h(op_key)
        )
        assert resp.status_code == 201, resp.text
        made = resp.json()
        assert made["key"].startswith(auth.KEY_PREFIX) and made["key"].startswith(made["prefix"])
        assert made["tenant"] == "acme" and made["role"] == "reader"
        stored = conn.execute(
            "SELECT key_hash, tenant_id FROM auth.api_key WHERE prefix = %s", (made["prefix"],)
        ).fetchone()
        assert bytes(stored["key_hash"]) == hashlib.sha256(made["key"].encode()).digest()
        listed = http.get("/v1/tenants/acme/keys", headers=_h(op_key)).json()["data"]
        assert listed[0]["last_used_at"] is None  # never used yet
        assert http.get("/v1/routes", headers=_h(made["key"])).status_code == 200
        listed = http.get("/v1/tenants/acme/keys", headers=_h(op_key)).json()["data"]
        assert [k["prefix"] for k in listed] == [made["prefix"]] and "key" not in listed[0]
        used = listed[0]["last_used_at"]
        assert used is not None  # its use is recorded, to the minute: a second use moves nothing
        assert http.get("/v1/routes", headers=_h(made["key"])).status_code == 200
        again = http.get("/v1/tenants/acme/keys", headers=_h(op_key)).json()["data"]
        assert again[0]["last_used_at"] == used
        # A use a minute later moves it; the router's key check (auth.lookup) records it too.
        conn.execute(
            "UPDATE auth.api_key SET last_used_at = now() - interval '61 seconds'"
            " WHERE prefix = %s",
            (made["prefix"],),
        )
        assert auth.lookup(conn, made["key"]) is not None
        again = http.get("/v1/tenants/acme/keys", headers=_h(op_key)).json()["data"]
        assert again[0]["last_used_at"] > used
        assert http.get("/v1/tenants/acme", headers=_h(op_key)).json()["live_keys"] == 1

        # Revoke: only a key of that tenant; the key stops working.
        other_prefix = admin[:12]
        _error(http.delete(f"/v1/tenants/acme/keys/{other_prefix}", headers=_h(op_key)), 404)
        resp = http.delete(f"/v1/tenants/acme/keys/{made['prefix']}", headers=_h(op_key))
        assert resp.status_code == 200 and resp.json()["revoked_at"], resp.text
        _error(http.get("/v1/routes", headers=_h(made["key"])), 401)
        assert http.get(f"/v1/tenants/{other['name']}", headers=_h(op_key)).json()["live_keys"] == 2

        # A revoked operator key is refused like any other.
        service.revoke_key(conn, op_key[:12])
        _error(http.get("/v1/tenants", headers=_h(op_key)), 401)


@pytest.fixture(scope="module")
def adapter_dir(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("offboard-adapter")
    return make_adapter_dir(models_dir, root / "a", seed=21, target_modules=("q_proj", "v_proj"))


@pytest.fixture
def engine(models_dir: Path) -> Iterator[str]:
    eng = Engine(BASE, models_dir, max_loras=4)
    try:
        with serve_app(create_engine_app(eng), ready_path="/health", port=free_port()) as url:
            yield url
    finally:
        eng.close()


def _engine_models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url + "/v1/models", timeout=5).json()["data"]}


def _wait(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_offboarding_over_rest_unloads_first_and_leaves_the_other_tenant(
    conn: Any, db_url: str, tmp_path: Path, adapter_dir: Path, engine: str
) -> None:
    store = LocalStore(tmp_path / "store")
    gone = populate(conn, name="gone", store=store, adapter_dir=adapter_dir, base_model=BASE)
    kept = populate(conn, name="kept", store=store, adapter_dir=adapter_dir, base_model=BASE)
    op_key = auth.create_operator_key(conn, name="ops")
    settings = Settings(
        home=tmp_path / "home",
        artefact_dir=tmp_path / "store",
        serving_dir=tmp_path / "serving",
        reconcile_interval=0.3,
    )
    app = create_api_with_reconciler(settings, db_url=db_url, engine_urls=[engine])
    gone_prod, kept_prod = gone["adapters"][0], kept["adapters"][0]
    with serve_app(app) as base, httpx.Client(base_url=base, timeout=60) as http:
        _wait(lambda: {gone_prod, kept_prod} <= _engine_models(engine), "both prods loaded")
        _wait(lambda: counts(conn, kept)["serve.adapter_deployment"] == 1, "load recorded")
        kept_before = counts(conn, kept)

        _error(http.delete("/v1/tenants/gone", headers=_h(gone["keys"]["admin"])), 403)
        err = _error(http.delete("/v1/tenants/gone", headers=_h(op_key)), 422)
        assert "confirm=gone" in err["message"]
        _error(http.delete("/v1/tenants/gone?confirm=kept", headers=_h(op_key)), 422)
        assert counts(conn, gone)["tenant"] == 1

        resp = http.delete("/v1/tenants/gone?confirm=gone", headers=_h(op_key))
        assert resp.status_code == 200, resp.text
        out = resp.json()
        # The engine no longer serves it: the call waited for the reconciler's unload.
        assert gone_prod not in _engine_models(engine)
        assert kept_prod in _engine_models(engine)
        assert out["status"] == "done" and out["forced"] is False
        assert out["retired_adapters"] == [gone_prod]
        assert out["requested_by"] == f"operator key {op_key[:12]} (ops)"
        assert sorted(out["artefacts"]["deleted"]) == sorted(gone["uris"])
        assert out["artefacts"]["pending"] == [] and out["artefacts"]["errors"] == []
        assert out["counts"]["serve.adapter_deployment"] == 1
        assert out["counts"]["obs.inference_log"] == 3 and out["counts"]["train.eval_result"] == 2
        assert all(v == 0 for v in counts(conn, gone).values()), counts(conn, gone)
        for uri in gone["uris"]:
            assert not Path(uri[len("file://") :]).exists(), uri
        for uri in kept["uris"]:
            assert Path(uri[len("file://") :]).is_dir(), uri
        assert counts(conn, kept) == kept_before
        assert _error(http.get("/v1/routes", headers=_h(gone["keys"]["reader"])), 401)
        assert http.get("/v1/routes", headers=_h(kept["keys"]["reader"])).status_code == 200

        # Again: the same report (idempotent); the audit row outlives the tenant.
        again = http.delete("/v1/tenants/gone?confirm=gone", headers=_h(op_key))
        assert again.status_code == 200 and again.json()["id"] == out["id"], again.text
        assert again.json()["counts"] == out["counts"]
        audit = conn.execute(
            "SELECT tenant_id, status, counts FROM auth.tenant_offboarding WHERE id = %s",
            (out["id"],),
        ).fetchone()
        assert audit == {
            "tenant_id": gone["tenant"]["id"],
            "status": "done",
            "counts": out["counts"],
        }
        _error(http.delete("/v1/tenants/nobody?confirm=nobody", headers=_h(op_key)), 404)
        names = [t["name"] for t in http.get("/v1/tenants", headers=_h(op_key)).json()["data"]]
        assert names == ["kept"]


def test_fuzz_the_operator_api_with_an_operator_key(conn: Any, db_url: str, tmp_path: Path) -> None:
    import schemathesis
    from schemathesis import GenerationMode

    from tests.integration.test_fuzz_api import _fuzz

    op_key = auth.create_operator_key(conn, name="fuzz")
    kept = make_tenant(conn, name="fuzz-kept")
    auth.create_key(conn, tenant_id=kept["id"], role="reader")
    settings = Settings(home=tmp_path, artefact_dir=tmp_path / "artefacts")
    count = [0]
    with serve_app(create_app(settings, db_url=db_url, engine_urls=[])) as base:
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        ops = [r.ok() for r in schema.get_all_operations()]
        ops = [op for op in ops if op.path.startswith("/v1/tenants")]
        assert len(ops) == 8, [op.label for op in ops]
        for op in ops:
            _fuzz(op, base=base, key=op_key, mode=GenerationMode.POSITIVE, n=6, count=count)
    assert count[0] >= 30
    assert conn.execute("SELECT count(*) AS n FROM tenant WHERE name = 'fuzz-kept'").fetchone() == {
        "n": 1
    }
