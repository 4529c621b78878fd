"""POST /v1/traces: a real app instrumented with opentelemetry-instrumentation-openai-v2 (the
official openai SDK calling a stub backend, exported by the OTLP/HTTP protobuf exporter with
gzip) lands in obs.inference_log; OTLP JSON with span events and partial success; bad
payloads are refused with what to fix."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from psycopg.rows import dict_row

import cft_sdk
from app.core import auth
from app.core.config import Settings
from app.main import create_app
from app.otel import service as otel
from tests.support import db as testdb
from tests.support.factories import make_tenant
from tests.support.openai_stub import ANSWER, COMPLETION_TOKENS, PROMPT_TOKENS, OpenAIStub
from tests.support.servers import serve_app

ROOT = Path(__file__).resolve().parents[2]
# A span start within the log's created_at window (an hour ago, whole seconds).
START_S = int(time.time()) - 3600

APP = """
import json, os
import openai
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

provider = TracerProvider()  # resource from OTEL_RESOURCE_ATTRIBUTES (cft.route)
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
memory = InMemorySpanExporter()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
OpenAIInstrumentor().instrument()

client = openai.OpenAI(base_url=os.environ["BACKEND"] + "/v1", api_key="sk-stub", max_retries=0)
question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
with trace.get_tracer("shop").start_as_current_span("POST /ask"):  # not a GenAI span
    client.chat.completions.create(model="stub-model", messages=question)
    stream = client.chat.completions.create(
        model="stub-model", messages=question, stream=True, stream_options={"include_usage": True}
    )
    for _ in stream:
        pass
provider.shutdown()  # flushes the batch exporter
spans = memory.get_finished_spans()
again = OTLPSpanExporter().export(spans)  # an exporter retry of the same spans
chat = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
print(json.dumps({"chat": [[s.context.trace_id, s.context.span_id] for s in chat],
                  "spans": len(spans), "again": again.name}))
"""


@pytest.fixture(scope="module")
def env(
    pg_server: str, template_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    url = testdb.clone(pg_server)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        tenant = make_tenant(c)
        key = auth.create_key(c, tenant_id=tenant["id"], role="ingest")
        reader = auth.create_key(c, tenant_id=tenant["id"], role="reader")
    home = tmp_path_factory.mktemp("otel-home")
    with serve_app(create_app(Settings(home=home), db_url=url)) as base:
        yield {"api": base, "key": key, "reader": reader, "db_url": url}
    testdb.drop(pg_server, url)


def rows(env: dict[str, Any], route: str) -> list[dict[str, Any]]:
    with psycopg.connect(env["db_url"], autocommit=True, row_factory=dict_row) as c:
        return c.execute(
            "SELECT * FROM obs.inference_log WHERE route = %s ORDER BY created_at", (route,)
        ).fetchall()


def post(env: dict[str, Any], body: bytes, **headers: str) -> httpx.Response:
    h = {"Authorization": f"Bearer {env['key']}", "Content-Type": otel.JSON} | headers
    return httpx.post(f"{env['api']}/v1/traces", content=body, headers=h, timeout=30)


def test_instrumented_openai_app_exports_rows(env: dict[str, Any]) -> None:
    route = f"otel-{uuid.uuid4().hex[:8]}"
    with serve_app(OpenAIStub()) as backend:
        proc = subprocess.run(
            [sys.executable, "-c", APP],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ
            | {
                "BACKEND": backend,
                "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "span_only",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{env['api']}/v1/traces",
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"Authorization=Bearer%20{env['key']}",
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
                "OTEL_RESOURCE_ATTRIBUTES": f"service.name=shop,cft.route={route}",
            },
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["spans"] == 3 and len(out["chat"]) == 2 and out["again"] == "SUCCESS"
    got = {str(r["request_id"]): r for r in rows(env, route)}
    expected = {cft_sdk.span_request_id(t, s) for t, s in out["chat"]}
    assert set(got) == expected  # exported twice, landed once; the SDK derives the same ids
    question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for row in got.values():
        assert row["messages"] == question and row["completion"] == ANSWER
        assert row["model"] == "stub-model" and row["status"] == "ok"
        assert (row["tokens_in"], row["tokens_out"]) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    # Feedback reaches a span's row through the id the app can compute.
    rid = next(iter(expected))
    fb = httpx.post(
        f"{env['api']}/v1/logs/{rid}/feedback",
        json={"thumbs": 1},
        headers={"Authorization": f"Bearer {env['key']}"},
    )
    assert fb.status_code == 200, fb.text


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, list):
        return {
            "key": key,
            "value": {"arrayValue": {"values": [{"stringValue": v} for v in value]}},
        }
    return {"key": key, "value": {"stringValue": value}}


def _span(span_id: str, name: str, attrs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": span_id,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": f"{START_S}000000000",
        "endTimeUnixNano": f"{START_S + 1}000000000",
        "attributes": [_kv(k, v) for k, v in attrs.items()],
        **extra,
    }


def test_json_export_span_events_partial_success_and_header_route(env: dict[str, Any]) -> None:
    route = f"otel-json-{uuid.uuid4().hex[:8]}"
    new_style = _span(
        "eee19b7ec3c1b174",
        "chat gpt-4o",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 5,
            "gen_ai.usage.output_tokens": 2,
            "gen_ai.response.finish_reasons": ["length"],
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be kind."}]),
            "gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "¿Hola?"}]}]
            ),
            "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "Hola"}]}]
            ),
            "enduser.id": "user-7",
            "cft.request_id": str(uuid.UUID(int=7)),
        },
    )
    events_style = _span(
        "00f067aa0ba902b7",
        "chat llama",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "vllm",
            "gen_ai.response.model": "llama",
        },
        events=[
            {"name": "gen_ai.user.message", "attributes": [_kv("content", "Ping?")]},
            {
                "name": "gen_ai.choice",
                "attributes": [
                    _kv("index", 0),
                    _kv("finish_reason", "stop"),
                    _kv("message", json.dumps({"role": "assistant", "content": "Pong"})),
                ],
            },
        ],
        status={"code": 2, "message": "upstream reset"},
    )
    oldest_style = _span(
        "4444444444444444",
        "chat old",
        {"gen_ai.system": "openai", "gen_ai.request.model": "old-model"},
        events=[
            {
                "name": "gen_ai.content.prompt",
                "attributes": [
                    _kv("gen_ai.prompt", json.dumps([{"role": "user", "content": "Old?"}]))
                ],
            },
            {
                "name": "gen_ai.content.completion",
                "attributes": [
                    _kv("gen_ai.completion", json.dumps([{"role": "assistant", "content": "Yes"}]))
                ],
            },
        ],
    )
    no_content = _span("1111111111111111", "chat m", {"gen_ai.operation.name": "chat"})
    http_span = _span("2222222222222222", "GET /", {"http.request.method": "GET"})
    embeddings = _span("3333333333333333", "embeddings m", {"gen_ai.operation.name": "embeddings"})
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": [_kv("service.name", "json-app")]},
                "scopeSpans": [
                    {
                        "spans": [
                            new_style,
                            events_style,
                            oldest_style,
                            no_content,
                            http_span,
                            embeddings,
                        ]
                    }
                ],
            }
        ]
    }
    r = post(env, json.dumps(body).encode(), **{"X-Cft-Route": route})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    partial = r.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1
    assert "OTEL_SEMCONV_STABILITY_OPT_IN" in partial["errorMessage"]
    assert (r.headers["x-cft-spans-inserted"], r.headers["x-cft-spans-skipped"]) == ("3", "2")
    got = {str(r["request_id"]): r for r in rows(env, route)}
    a = got[str(uuid.UUID(int=7))]
    assert a["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "¿Hola?"},
    ]
    assert a["completion"] == "Hola" and a["status"] == "partial" and a["user_hash"] is not None
    assert (a["tokens_in"], a["tokens_out"], a["model"]) == (5, 2, "gpt-4o")
    assert a["created_at"].timestamp() == START_S
    b = got[cft_sdk.span_request_id("5b8efff798038103d269b633813fc60c", "00f067aa0ba902b7")]
    assert b["messages"] == [{"role": "user", "content": "Ping?"}] and b["completion"] == "Pong"
    assert b["status"] == "error" and b["model"] == "llama"
    c = got[cft_sdk.span_request_id("5b8efff798038103d269b633813fc60c", "4444444444444444")]
    assert c["messages"] == [{"role": "user", "content": "Old?"}] and c["completion"] == "Yes"
    # The same export again: nothing doubles, the answer says so.
    again = post(
        env,
        gzip.compress(json.dumps(body).encode()),
        **{"X-Cft-Route": route, "Content-Encoding": "gzip"},
    )
    assert again.status_code == 200 and again.headers["x-cft-spans-existing"] == "3"
    assert len(rows(env, route)) == 3
    # No route anywhere: the chat spans are rejected, saying where a route comes from.
    r = post(env, json.dumps(body).encode())
    assert int(r.json()["partialSuccess"]["rejectedSpans"]) == 4
    assert "cft.route" in r.json()["partialSuccess"]["errorMessage"]


def test_protobuf_response_and_bad_payloads(env: dict[str, Any]) -> None:
    ok = post(env, b"", **{"Content-Type": otel.PROTOBUF})  # an empty export is valid
    assert ok.status_code == 200 and ok.headers["content-type"] == otel.PROTOBUF
    parsed = ExportTraceServiceResponse.FromString(ok.content)
    assert not parsed.HasField("partial_success")

    def refused(r: httpx.Response, status: int, fragment: str) -> None:
        assert r.status_code == status, r.text
        assert fragment in r.json()["error"]["message"], r.json()

    refused(post(env, b"\xff\xff\xff", **{"Content-Type": otel.PROTOBUF}), 400, "protobuf")
    refused(post(env, b"{not json"), 400, "not valid JSON")
    refused(post(env, b'{"resourceSpans": "x"}'), 400, "OTLP ExportTraceServiceRequest in JSON")
    bad_id = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "01"}]}]}]}
    refused(post(env, json.dumps(bad_id).encode()), 400, "hex")
    refused(post(env, b"{}", **{"Content-Type": "text/plain"}), 400, "application/x-protobuf")
    refused(post(env, b"not gzip", **{"Content-Encoding": "gzip"}), 400, "gzip")
    refused(post(env, b"{}", **{"Content-Encoding": "br"}), 400, "gzip")
    refused(post(env, b"{}", Authorization="Bearer nope"), 401, "invalid")
    refused(post(env, b"{}", Authorization=f"Bearer {env['reader']}"), 403, "role")


def test_a_span_bomb_is_refused_quickly_without_stalling_the_api(env: dict[str, Any]) -> None:
    """28,000 spans gzipped into ~34 kB once stalled /healthz 1.5 s per request while the JSON
    mapping ran on the event loop. Spans per export are capped like records (413), and the
    decoding runs in a worker thread."""
    spans = [_span(f"{i:016x}", "db", {"x": i}) for i in range(28_000)]
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    body = gzip.compress(json.dumps(doc).encode())
    healthz: list[float] = []

    def probe() -> None:
        for _ in range(5):
            started = time.perf_counter()
            httpx.get(f"{env['api']}/healthz", timeout=30)
            healthz.append(time.perf_counter() - started)

    prober = threading.Thread(target=probe)
    prober.start()
    started = time.perf_counter()
    r = post(env, body, **{"Content-Encoding": "gzip"})
    took = time.perf_counter() - started
    prober.join()
    assert r.status_code == 413, r.text
    assert "at most 1000 spans" in r.json()["error"]["message"]
    assert took < 3.0 and max(healthz) < 1.0, (took, healthz)
    # The same cap for protobuf.
    proto = ExportTraceServiceRequest()
    scope = proto.resource_spans.add().scope_spans.add()
    for i in range(1001):
        scope.spans.add(name="x", span_id=i.to_bytes(8, "big"), trace_id=b"\x01" * 16)
    r = post(env, proto.SerializeToString(), **{"Content-Type": otel.PROTOBUF})
    assert r.status_code == 413, r.text
