"""The OpenAI-compatible gateway end to end: real engine, real API server, real PostgreSQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core.auth import create_key
from app.core.config import get_settings
from app.core.metrics import REGISTRY
from app.core.pseudonym import user_hash, user_secret
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from cft.serve import create_app
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.lora import make_adapter_dir
from tests.support.servers import metrics_text, serve_app
from workers import base_model

pytestmark = pytest.mark.slow
BASE = base_model.BUNDLED
QV = ("q_proj", "v_proj")


@pytest.fixture(scope="module")
def engine_url(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    eng = Engine(BASE, models_dir, max_loras=4)
    with serve_app(create_engine_app(eng), ready_path="/health") as url:
        yield url
    eng.close()


@pytest.fixture
def setup(db_url: str, engine_url: str, models_dir: Path, tmp_path: Path):
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        t = make_tenant(c)
        r = make_route(c, tenant_id=t["id"], base_model=BASE, experiment="gw-exp")
        prod = make_adapter(
            c, route=r, id=f"prod-{uuid.uuid4().hex[:6]}", status="prod", traffic_pct=100
        )
        key = create_key(c, tenant_id=t["id"], role="client")
    path = make_adapter_dir(models_dir, tmp_path / "prod", seed=3, target_modules=QV)
    resp = httpx.post(
        engine_url + "/v1/load_lora_adapter",
        json={"lora_name": prod["id"], "lora_path": str(path)},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    with serve_app(create_app(db_url=db_url, engine_urls=[engine_url])) as api:
        yield {"api": api, "key": key, "route": r, "prod": prod, "db_url": db_url, "tenant": t}


def wait_for_log(db_url: str, request_id: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        while True:
            row = c.execute(
                "SELECT * FROM obs.inference_log WHERE request_id = %s", (request_id,)
            ).fetchone()
            if row:
                return row
            assert time.monotonic() < deadline, f"log row {request_id} never written"
            time.sleep(0.05)


def test_chat_through_openai_client_is_routed_and_logged(setup):
    client = openai.OpenAI(base_url=setup["api"] + "/v1", api_key=setup["key"], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=setup["route"]["name"],
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=6,
        temperature=0,
        user="alice@example.com",
    )
    resp = raw.parse()
    rid = raw.headers["x-request-id"]
    assert raw.headers["x-cft-adapter"] == setup["prod"]["id"]
    assert resp.choices[0].message.content
    assert resp.model == setup["route"]["name"]
    row = wait_for_log(setup["db_url"], rid)
    assert row["adapter_id"] == setup["prod"]["id"]
    assert row["route"] == setup["route"]["name"]
    assert row["completion"] == resp.choices[0].message.content
    assert row["tokens_out"] == resp.usage.completion_tokens
    assert row["status"] == "ok"
    assert bytes(row["user_hash"]) == user_hash("alice@example.com", user_secret())
    # Feedback goes to the same request id.
    fb = httpx.post(
        f"{setup['api']}/v1/logs/{rid}/feedback",
        json={"thumbs": 1},
        headers={"Authorization": f"Bearer {setup['key']}"},
    )
    assert fb.status_code == 200, fb.text


def test_streaming_relays_tokens_and_logs_ttft(setup):
    client = openai.OpenAI(base_url=setup["api"] + "/v1", api_key=setup["key"], max_retries=0)
    with client.chat.completions.with_streaming_response.create(
        model=setup["route"]["name"],
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=6,
        temperature=0,
        stream=True,
        user="bob",
    ) as raw:
        rid = raw.headers["x-request-id"]
        pieces = [c.choices[0].delta.content or "" for c in raw.parse() if c.choices]
    row = wait_for_log(setup["db_url"], rid)
    assert row["completion"] == "".join(pieces) and row["completion"]
    assert row["ttft_ms"] is not None and row["ttft_ms"] >= 0
    assert row["status"] == "ok"
    assert row["tokens_out"] and row["tokens_out"] > 0


def test_canary_split_matches_sql_assignment(setup, models_dir, engine_url, tmp_path):
    db_url, r = setup["db_url"], setup["route"]
    canary_id = f"canary-{uuid.uuid4().hex[:6]}"
    path = make_adapter_dir(models_dir, tmp_path / "canary", seed=4, target_modules=QV)
    httpx.post(
        engine_url + "/v1/load_lora_adapter",
        json={"lora_name": canary_id, "lora_path": str(path)},
        timeout=60,
    ).raise_for_status()
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        make_adapter(c, route=r, id=canary_id, status="canary", traffic_pct=50)
    # The router routes only to adapters it has seen on the engine (the reconciler's pass on
    # the NOTIFY of this insert): wait until a canary user is served by the canary.
    headers = {"Authorization": f"Bearer {setup['key']}"}
    secret = user_secret()
    with psycopg.connect(db_url, autocommit=True) as c:
        users = [f"user-{i}" for i in range(50)]
        canary_user = next(
            u
            for u in users
            if c.execute(
                "SELECT serve.assign_adapter(%s, %s, %s)",
                (r["tenant_id"], r["name"], user_hash(u, secret).hex()),
            ).fetchone()[0]
            == canary_id
        )
    deadline = time.monotonic() + 10
    while True:
        resp = httpx.post(
            f"{setup['api']}/v1/completions",
            json={"model": r["name"], "prompt": "Hi", "max_tokens": 1, "user": canary_user},
            headers=headers,
            timeout=60,
        )
        if resp.headers.get("x-cft-adapter") == canary_id:
            break
        assert time.monotonic() < deadline, "the router never saw the canary loaded"
        time.sleep(0.1)
    seen = set()
    with psycopg.connect(db_url, autocommit=True) as c:
        for i in range(8):
            user = f"user-{i}"
            resp = httpx.post(
                f"{setup['api']}/v1/completions",
                json={"model": r["name"], "prompt": "Hi", "max_tokens": 2, "user": user},
                headers=headers,
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
            expected = c.execute(
                "SELECT serve.assign_adapter(%s, %s, %s)",
                (r["tenant_id"], r["name"], user_hash(user, secret).hex()),
            ).fetchone()[0]
            assert resp.headers["x-cft-adapter"] == expected
            seen.add(resp.headers["x-cft-variant"])
            row = wait_for_log(db_url, resp.headers["x-request-id"])
            assert row["experiment"] == "gw-exp" and row["variant"] == resp.headers["x-cft-variant"]
    assert seen <= {"A", "B"}


def test_unknown_route_and_other_tenants_route_are_404(setup):
    with psycopg.connect(setup["db_url"], autocommit=True, row_factory=dict_row) as c:
        other = make_tenant(c)
        foreign = make_route(c, tenant_id=other["id"], base_model=BASE)
    headers = {"Authorization": f"Bearer {setup['key']}"}
    for name in ("no-such-route", foreign["name"]):
        resp = httpx.post(
            f"{setup['api']}/v1/chat/completions",
            json={"model": name, "messages": [{"role": "user", "content": "x"}]},
            headers=headers,
        )
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "not_found"


def test_a_route_never_gets_another_tenants_adapter_through_its_base_model(setup):
    """A route's base_model naming another tenant's loaded adapter: the database refuses it,
    and a route that holds such a name anyway (written past the guard) is never sent it."""
    victim = setup["prod"]["id"]  # loaded on the engine, owned by setup's tenant
    with psycopg.connect(setup["db_url"], autocommit=True, row_factory=dict_row) as c:
        alpha = make_tenant(c)
        with pytest.raises(psycopg.errors.CheckViolation, match="name of an adapter"):
            make_route(c, tenant_id=alpha["id"], base_model=victim)
        legit = make_route(c, tenant_id=alpha["id"], base_model=BASE)
        with pytest.raises(psycopg.errors.CheckViolation, match="name of an adapter"):
            c.execute(
                "UPDATE serve.route SET base_model = %s WHERE name = %s", (victim, legit["name"])
            )
        # An adapter may not take a name some route uses as its base either.
        with pytest.raises(psycopg.errors.CheckViolation, match="a route names a base model"):
            make_adapter(c, route=legit, id=BASE)
        c.execute("ALTER TABLE serve.route DISABLE TRIGGER route_base_guard")
        try:
            evil = make_route(c, tenant_id=alpha["id"], base_model=victim)
        finally:
            c.execute("ALTER TABLE serve.route ENABLE TRIGGER route_base_guard")
        alpha_key = create_key(c, tenant_id=alpha["id"], role="client")
    resp = httpx.post(
        f"{setup['api']}/v1/chat/completions",
        json={"model": evil["name"], "messages": [{"role": "user", "content": "Say hello."}]},
        headers={"Authorization": f"Bearer {alpha_key}"},
        timeout=30,
    )
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "base_model_not_served"
    assert "x-cft-adapter" not in resp.headers


def test_a_call_whose_log_record_could_not_be_stored_is_a_400_naming_the_field(setup):
    """Checked before the call is served: the writer never holds a record it cannot store."""
    client = openai.OpenAI(base_url=setup["api"] + "/v1", api_key=setup["key"], max_retries=0)
    cases = [
        ([{"role": "bot", "content": "hi"}], None, "messages[0].role"),
        ([{"role": "user", "content": "a NUL \x00 here"}], None, "NUL"),
        ([{"role": "user", "content": "hi"}], "u" * 300, "user: must be at most 256"),
    ]
    for messages, user, needle in cases:
        extra = {"user": user} if user else {}
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=setup["route"]["name"], messages=messages, max_tokens=2, **extra
            )
        assert needle in str(err.value), err.value
    with psycopg.connect(setup["db_url"], autocommit=True) as c:
        n = c.execute(
            "SELECT count(*) FROM obs.inference_log WHERE tenant_id = %s", (setup["tenant"]["id"],)
        ).fetchone()
    assert n is not None and n[0] == 0


def test_fields_outside_the_allow_list_never_reach_the_engine(setup):
    headers = {"Authorization": f"Bearer {setup['key']}"}
    base = {"model": setup["route"]["name"], "messages": [{"role": "user", "content": "x"}]}
    for extra, param in (({"n": 3}, "n"), ({"guided_json": {}}, "guided_json"),
                         ({"lora_request": {"lora_name": "x"}}, "lora_request")):  # fmt: skip
        resp = httpx.post(f"{setup['api']}/v1/chat/completions", json=base | extra, headers=headers)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == param
    ok = httpx.post(
        f"{setup['api']}/v1/chat/completions",
        json=base | {"max_tokens": 2, "temperature": 0, "seed": 1, "n": 1},
        headers=headers,
        timeout=60,
    )
    assert ok.status_code == 200, ok.text


def test_gateway_needs_a_key(setup):
    resp = httpx.post(
        f"{setup['api']}/v1/chat/completions",
        json={"model": setup["route"]["name"], "messages": [{"role": "user", "content": "x"}]},
    )
    assert resp.status_code == 401


def test_revoked_key_stops_working_within_the_key_cache_ttl(
    db_url: str, engine_url: str, tmp_path: Path
):
    """Cached keys are re-checked in the background after CFT_ROUTER_KEY_CACHE_TTL: a key in
    use keeps working meanwhile, and a revoked one is refused within the TTL + one lookup."""
    ttl = 0.5
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        t = make_tenant(c)
        r = make_route(c, tenant_id=t["id"], base_model=BASE)
        key = create_key(c, tenant_id=t["id"], role="client")
    settings = get_settings().model_copy(
        update={"router_key_cache_ttl": ttl, "serving_dir": tmp_path / "serving"}
    )
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": r["name"], "prompt": "Hi", "max_tokens": 1}
    with (
        serve_app(create_app(settings, db_url=db_url, engine_urls=[engine_url])) as api,
        httpx.Client(base_url=api, headers=headers, timeout=60) as client,
    ):
        # Past several TTLs, the key in use keeps working (served while re-checked).
        until = time.monotonic() + 4 * ttl
        while time.monotonic() < until:
            resp = client.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("UPDATE auth.api_key SET revoked_at = now() WHERE tenant_id = %s", (t["id"],))
        revoked = time.monotonic()
        while (resp := client.post("/v1/completions", json=body)).status_code == 200:
            assert time.monotonic() - revoked < ttl + 5.0, "the revoked key still works"
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"]["message"] == "invalid or revoked API key"
        for _ in range(3):
            assert client.post("/v1/completions", json=body).status_code == 401


def test_feedback_right_after_the_call_waits_for_the_queued_log(setup):
    headers = {"Authorization": f"Bearer {setup['key']}"}
    for i in range(3):
        resp = httpx.post(
            f"{setup['api']}/v1/completions",
            json={
                "model": setup["route"]["name"],
                "prompt": "Hi",
                "max_tokens": 2,
                "user": f"u{i}",
            },
            headers=headers,
            timeout=60,
        )
        assert resp.status_code == 200
        fb = httpx.post(
            f"{setup['api']}/v1/logs/{resp.headers['x-request-id']}/feedback",
            json={"thumbs": -1},
            headers=headers,
        )
        assert fb.status_code == 200, fb.text
        assert fb.json()["fb_explicit"] == -1


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_calls_and_time_lora_and_base_apart(setup):
    """The API runs in this process: read its registry before and after real calls."""
    with psycopg.connect(setup["db_url"], autocommit=True, row_factory=dict_row) as c:
        bare = make_route(c, tenant_id=setup["tenant"]["id"], base_model=BASE)  # no adapter
    chat = {"method": "POST", "route": "/v1/chat/completions"}
    before = {
        "ok": _sample("cft_http_requests_total", **chat, status="200"),
        "401": _sample("cft_http_requests_total", **chat, status="401"),
        "timed": _sample("cft_http_request_duration_seconds_count", **chat),
        "lora": _sample("cft_router_upstream_seconds_count", kind="lora"),
        "base": _sample("cft_router_upstream_seconds_count", kind="base"),
        "prod": _sample("cft_router_requests_total", kind="lora", status="ok"),
        "bare": _sample("cft_router_requests_total", kind="base", status="ok"),
        "hit": _sample("cft_router_adapter_lookups_total", result="hit"),
    }
    headers = {"Authorization": f"Bearer {setup['key']}"}
    for route, adapter in ((setup["route"]["name"], setup["prod"]["id"]), (bare["name"], BASE)):
        resp = httpx.post(
            f"{setup['api']}/v1/chat/completions",
            json={"model": route, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            headers=headers,
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-cft-adapter"] == adapter
    assert httpx.post(f"{setup['api']}/v1/chat/completions", json={}).status_code == 401
    assert _sample("cft_http_requests_total", **chat, status="200") - before["ok"] == 2
    assert _sample("cft_http_requests_total", **chat, status="401") - before["401"] == 1
    assert _sample("cft_http_request_duration_seconds_count", **chat) - before["timed"] == 3
    assert _sample("cft_router_upstream_seconds_count", kind="lora") - before["lora"] == 1
    assert _sample("cft_router_upstream_seconds_count", kind="base") - before["base"] == 1
    # Few series at any number of routes: by what answered, not by route or adapter.
    assert _sample("cft_router_requests_total", kind="lora", status="ok") - before["prod"] == 1
    assert _sample("cft_router_requests_total", kind="base", status="ok") - before["bare"] == 1
    assert _sample("cft_router_adapter_lookups_total", result="hit") - before["hit"] == 1
    # And the same numbers are what /metrics serves.
    text = metrics_text()
    assert 'cft_router_upstream_seconds_count{kind="lora"}' in text
    assert (
        'cft_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}' in text
    )


def test_hot_routes_keep_auth_errors_and_openapi_of_the_declared_routes(setup):
    """The two POST routes are served by GatewayFastPath: same auth, errors and schema."""
    with psycopg.connect(setup["db_url"], autocommit=True, row_factory=dict_row) as c:
        reader = create_key(c, tenant_id=setup["tenant"]["id"], role="reader")
    api, route = setup["api"], setup["route"]["name"]
    ok = {"Authorization": f"Bearer {setup['key']}", "Content-Type": "application/json"}
    for path in ("/v1/chat/completions", "/v1/completions"):
        bad_json = httpx.post(api + path, content=b"{nope", headers=ok)
        assert bad_json.status_code == 400
        assert bad_json.json()["error"]["type"] == "invalid_request_error"
        wrong_role = httpx.post(
            api + path,
            json={"model": route, "prompt": "x", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {reader}"},
        )
        assert wrong_role.status_code == 403
        assert wrong_role.json()["error"]["type"] == "permission_error"
        # Other methods still go through FastAPI's routing.
        assert httpx.get(api + path, headers=ok).status_code == 405
    no_prompt = httpx.post(api + "/v1/completions", json={"model": route}, headers=ok)
    assert no_prompt.status_code == 400
    assert "prompt" in no_prompt.json()["error"]["message"]
    paths = httpx.get(api + "/openapi.json").json()["paths"]
    assert "post" in paths["/v1/chat/completions"] and "post" in paths["/v1/completions"]
