"""OpenTelemetry GenAI spans to log records: decode OTLP/HTTP trace exports, map, ingest.

A span is a GenAI chat span when its `gen_ai.operation.name` is `chat` (or, from
instrumentations older than that attribute, `text_completion` / a `gen_ai.system` or
`gen_ai.provider.name` with a prompt). Other spans (HTTP, database, embeddings, tools) are
skipped and counted. A chat span becomes one obs.inference_log record (the fields of
POST /v1/logs, validated by the same code):

- request_id: `cft.request_id` if the app set it, else derived from the trace and span ids
  (`cft_sdk.ids.span_request_id`, one rule for both sides), so a re-exported span lands once;
- route: span attribute `cft.route`, else resource attribute `cft.route`, else the exporter's
  `X-Cft-Route` header; a span with none is rejected;
- model: `gen_ai.response.model`, else `gen_ai.request.model`; adapter_id: `cft.adapter_id`;
  tokens: `gen_ai.usage.input_tokens` / `output_tokens` (or the older `prompt_tokens` /
  `completion_tokens`); user: `cft.user`, `enduser.id` or `user.id`; experiment / variant:
  `cft.experiment` / `cft.variant`; created_at: the span's start; status: `error` when the
  span's status is ERROR, `partial` when the finish reason is `length`, else `ok`;
- prompt and completion, first found of: the attributes `gen_ai.input.messages` /
  `gen_ai.output.messages` (+ `gen_ai.system_instructions`; GenAI conventions >= 1.36, what
  opentelemetry-instrumentation-openai-v2 writes with
  OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental and content capture `span_only` or
  `span_and_event`); span events `gen_ai.{system,user,assistant,tool}.message` and
  `gen_ai.choice` (conventions 1.28-1.35 when recorded on the span); the indexed attributes
  `gen_ai.prompt.N.role/content` and `gen_ai.completion.N.content` (OpenLLMetry). A chat span
  without a prompt is rejected, with the settings that make the instrumentation record one.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client import Counter

from app.core.config import Settings
from app.core.db import Connection
from app.core.errors import BadRequest, PayloadTooLarge
from app.core.metrics import REGISTRY
from app.logs import service as logs
from cft_sdk.ids import span_request_id  # the one rule: the SDK derives the same ids

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CHAT_OPERATIONS = frozenset({"chat", "text_completion"})
MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
NO_PROMPT = (
    "the chat span carries no prompt: record content on the span (for"
    " opentelemetry-instrumentation-openai-v2: OTEL_SEMCONV_STABILITY_OPT_IN="
    "gen_ai_latest_experimental and OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="
    "span_only; without the opt-in it writes content to OTLP log records, which cft does"
    " not read)"
)
NO_ROUTE = (
    "no route: set the span or resource attribute cft.route, or send the header X-Cft-Route"
    " (OTEL_EXPORTER_OTLP_HEADERS=X-Cft-Route=<route>)"
)

OTEL_SPANS = Counter(
    "cft_otel_spans_total",
    "Spans received on POST /v1/traces, by outcome (inserted, existing, skipped, rejected)",
    ["outcome"],
    registry=REGISTRY,
)


@dataclass
class Outcome:
    """What one export did with its spans."""

    inserted: int = 0
    existing: int = 0
    skipped: int = 0  # not GenAI chat spans
    rejected: list[str] = field(default_factory=list)  # one reason per rejected span

    def response(self) -> ExportTraceServiceResponse:
        """The OTLP response: partial_success only when a span was rejected."""
        out = ExportTraceServiceResponse()
        if self.rejected:
            out.partial_success.rejected_spans = len(self.rejected)
            shown = "; ".join(dict.fromkeys(self.rejected))  # distinct reasons, in order
            out.partial_success.error_message = shown[:2000]
        return out


# Decoding --------------------------------------------------------------------------------


def decompress(body: bytes, encoding: str | None, *, max_bytes: int) -> bytes:
    """The body without its Content-Encoding (gzip, deflate or none), at most max_bytes."""
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadRequest(
            f"Content-Encoding {encoding!r} is not supported: send gzip or none",
            code="unsupported_encoding",
        )
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise BadRequest(
            f"the body is not valid {encoding} data: {exc}", code="invalid_encoding"
        ) from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise PayloadTooLarge(
            f"the decompressed body is larger than {max_bytes} bytes: export smaller batches"
            " (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)"
        )
    return out


def _too_many(n: int, max_spans: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"an export holds at most {max_spans} spans, got {n}: export smaller batches"
        " (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)",
        param="resourceSpans",
    )


def _json_span_count(doc: dict[str, Any]) -> int:
    n = 0
    for rs in doc.get("resourceSpans") or ():
        for ss in (rs.get("scopeSpans") if isinstance(rs, dict) else None) or ():
            spans = ss.get("spans") if isinstance(ss, dict) else None
            n += len(spans) if isinstance(spans, list) else 0
    return n


def parse(
    body: bytes, content_type: str | None, *, max_spans: int = 1000
) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest from an OTLP/HTTP protobuf or JSON body (400 if bad, 413
    over max_spans spans: counted before the JSON mapping's per-field Python work)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    request = ExportTraceServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise BadRequest(
                f"the body is not an OTLP ExportTraceServiceRequest in protobuf: {exc}",
                code="invalid_otlp",
            ) from None
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        if n > max_spans:
            raise _too_many(n, max_spans)
        return request
    if kind == JSON:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(doc, dict):
            raise BadRequest(
                'an OTLP JSON body is an object like {"resourceSpans": [...]}',
                code="invalid_otlp",
            )
        n = _json_span_count(doc) if isinstance(doc.get("resourceSpans", []), list) else 0
        if n > max_spans:
            raise _too_many(n, max_spans)
        try:
            json_format.ParseDict(_ids_to_base64(doc), request, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError) as exc:
            raise BadRequest(
                f"the body is not an OTLP ExportTraceServiceRequest in JSON: {exc}",
                code="invalid_otlp",
            ) from None
        return request
    raise BadRequest(
        f"Content-Type {content_type!r} is not OTLP: send {PROTOBUF} or {JSON}",
        code="unsupported_media_type",
    )


def _ids_to_base64(doc: Any) -> Any:
    """OTLP JSON writes trace and span ids as hex; protobuf's JSON mapping wants base64."""
    if isinstance(doc, list):
        return [_ids_to_base64(x) for x in doc]
    if not isinstance(doc, dict):
        return doc
    out = {}
    for key, value in doc.items():
        if key in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
            if isinstance(value, str) and value:
                try:
                    value = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise BadRequest(
                        f"{key} {value[:40]!r} is not hex: OTLP JSON ids are hex strings",
                        code="invalid_otlp",
                    ) from None
        elif key != "attributes":  # attribute values are never ids
            value = _ids_to_base64(value)
        out[key] = value
    return out


def response_body(outcome: Outcome, content_type: str) -> bytes:
    """The ExportTraceServiceResponse in the request's encoding."""
    message = outcome.response()
    if content_type == PROTOBUF:
        data: bytes = message.SerializeToString()
        return data
    text: str = json_format.MessageToJson(message, indent=None)
    return text.encode()


# Mapping ---------------------------------------------------------------------------------


def value_of(v: AnyValue) -> Any:
    """An OTLP AnyValue as plain Python."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes_of(kvs: Any) -> dict[str, Any]:
    """OTLP KeyValues as a dict."""
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        out[kv.key] = value_of(kv.value)
    return out


def spans_of(request: ExportTraceServiceRequest) -> Iterator[tuple[dict[str, Any], Span]]:
    """Every span of an export with its resource's attributes."""
    for rs in request.resource_spans:
        resource = attributes_of(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield resource, span


def is_chat_span(attrs: Mapping[str, Any]) -> bool:
    """Whether a span is a GenAI chat (or text completion) call."""
    op = attrs.get("gen_ai.operation.name")
    if op is not None:
        return op in CHAT_OPERATIONS
    has_system = "gen_ai.system" in attrs or "gen_ai.provider.name" in attrs
    return has_system and ("gen_ai.prompt.0.content" in attrs or "gen_ai.request.model" in attrs)


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _parts_text(parts: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """The text of semconv message parts and the tool calls among them."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("content"), str):
            texts.append(part["content"])
        elif kind == "tool_call":
            args = part.get("arguments")
            calls.append(
                {
                    "id": str(part.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(part.get("name") or ""),
                        "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                    },
                }
            )
        elif kind == "tool_call_response":
            resp = part.get("response")
            texts.append(resp if isinstance(resp, str) else orjson.dumps(resp).decode())
    return ("\n".join(texts) if texts else None), calls


def _semconv_messages(raw: Any) -> list[dict[str, Any]]:
    """gen_ai.input.messages / output.messages (role + parts) as OpenAI chat messages."""
    out: list[dict[str, Any]] = []
    for msg in _loads(raw) if isinstance(_loads(raw), list) else []:
        if not isinstance(msg, dict):
            continue
        text, calls = _parts_text(msg.get("parts"))
        m: dict[str, Any] = {"role": msg.get("role") or "user", "content": text or ""}
        if calls:
            m["tool_calls"] = calls
        out.append(m)
    return out


def _system_instructions(raw: Any) -> list[dict[str, Any]]:
    text, _ = _parts_text(_loads(raw))
    return [{"role": "system", "content": text}] if text else []


def _event_content(attrs: Mapping[str, Any]) -> Any:
    """The body of a GenAI event recorded on a span (flattened into attributes)."""
    for key in ("gen_ai.event.content", "event.body", "body"):
        if key in attrs:
            return _loads(attrs[key])
    return {k: _loads(v) for k, v in attrs.items() if not k.startswith("gen_ai.system")}


def _event_messages(span: Span) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """Prompt messages, completion and finish reason from GenAI span events."""
    messages: list[dict[str, Any]] = []
    completion: str | None = None
    finish: str | None = None
    for event in span.events:
        attrs = attributes_of(event.attributes)
        body = _event_content(attrs)
        if event.name in MESSAGE_EVENTS:
            content = body.get("content") if isinstance(body, dict) else body
            m: dict[str, Any] = {"role": MESSAGE_EVENTS[event.name], "content": content or ""}
            if isinstance(body, dict) and body.get("tool_calls"):
                m["tool_calls"] = body["tool_calls"]
            if isinstance(body, dict) and body.get("id") and m["role"] == "tool":
                m["tool_call_id"] = body["id"]
            messages.append(m)
        elif event.name == "gen_ai.content.prompt":  # conventions before 1.28
            messages += _plain_messages(_loads(attrs.get("gen_ai.prompt")))
        elif event.name == "gen_ai.content.completion" and completion is None:
            done = _loads(attrs.get("gen_ai.completion"))
            outputs = _plain_messages(done)
            completion = (
                outputs[0]["content"] if outputs else (done if isinstance(done, str) else None)
            )
        elif event.name == "gen_ai.choice" and completion is None and isinstance(body, dict):
            message = _loads(body.get("message"))
            if isinstance(message, dict):
                completion = message.get("content")
            completion = completion if isinstance(completion, str) else None
            finish = body.get("finish_reason")
    return messages, completion, finish if isinstance(finish, str) else None


def _plain_messages(value: Any) -> list[dict[str, Any]]:
    """A JSON list of {role, content} messages (text content only)."""
    out = []
    for m in value if isinstance(value, list) else []:
        if isinstance(m, dict) and isinstance(m.get("content"), str | None):
            out.append({"role": m.get("role") or "user", "content": m.get("content") or ""})
    return out


def _indexed(attrs: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    out = []
    i = 0
    while f"{prefix}.{i}.content" in attrs or f"{prefix}.{i}.role" in attrs:
        out.append(
            {
                "role": attrs.get(f"{prefix}.{i}.role") or "user",
                "content": attrs.get(f"{prefix}.{i}.content") or "",
            }
        )
        i += 1
    return out


def _content(
    span: Span, attrs: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """(prompt messages, completion, finish reason) of a chat span, from wherever it is."""
    reasons = attrs.get("gen_ai.response.finish_reasons")
    finish = reasons[0] if isinstance(reasons, list) and reasons else None
    if "gen_ai.input.messages" in attrs:
        messages = _system_instructions(attrs.get("gen_ai.system_instructions"))
        messages += _semconv_messages(attrs["gen_ai.input.messages"])
        outputs = _semconv_messages(attrs.get("gen_ai.output.messages"))
        completion = outputs[0]["content"] if outputs else None
        return messages, completion, finish
    messages, completion, event_finish = _event_messages(span)
    if messages:
        return messages, completion, finish or event_finish
    messages = _indexed(attrs, "gen_ai.prompt")
    completions = _indexed(attrs, "gen_ai.completion")
    return messages, (completions[0]["content"] if completions else None), finish


def _first(attrs: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


def record_of(
    resource: Mapping[str, Any], span: Span, *, default_route: str | None
) -> dict[str, Any]:
    """The POST /v1/logs record of a chat span; ValueError (the reason) if it has none."""
    attrs = attributes_of(span.attributes)
    route = _first(attrs, "cft.route") or _first(resource, "cft.route") or default_route
    if not route:
        raise ValueError(NO_ROUTE)
    messages, completion, finish = _content(span, attrs)
    if not messages:
        raise ValueError(NO_PROMPT)
    status = "ok"
    if span.status.code == Status.STATUS_CODE_ERROR:
        status = "error"
    elif finish == "length":
        status = "partial"
    record: dict[str, Any] = {
        "request_id": _first(attrs, "cft.request_id")
        or span_request_id(span.trace_id, span.span_id),
        "route": str(route),
        "messages": messages,
        "completion": completion,
        "model": _first(attrs, "gen_ai.response.model", "gen_ai.request.model"),
        "adapter_id": _first(attrs, "cft.adapter_id"),
        "experiment": _first(attrs, "cft.experiment"),
        "variant": _first(attrs, "cft.variant"),
        "tokens_in": _first(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        "tokens_out": _first(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        "user": _first(attrs, "cft.user", "enduser.id", "user.id"),
        "parent_request_id": _first(attrs, "cft.parent_request_id"),
        "status": status,
    }
    if span.start_time_unix_nano:
        stamp = datetime.fromtimestamp(span.start_time_unix_nano / 1e9, tz=UTC)
        record["created_at"] = stamp.isoformat()
    return {k: v for k, v in record.items() if v is not None}


def ingest(
    conn: Connection,
    *,
    tenant_id: int,
    request: ExportTraceServiceRequest,
    default_route: str | None,
    settings: Settings,
) -> Outcome:
    """Log the chat spans of an export; the others are skipped, invalid ones rejected."""
    outcome = Outcome()
    prepared = logs.Prepared()
    for resource, span in spans_of(request):
        if not is_chat_span(attributes_of(span.attributes)):
            outcome.skipped += 1
            continue
        where = f"span {span.span_id.hex() or '?'} ({span.name or 'unnamed'})"
        try:
            record = record_of(resource, span, default_route=default_route)
            one = logs.prepare([record], settings=settings, batch=False)
        except ValueError as exc:
            outcome.rejected.append(f"{where}: {exc}")
            continue
        except logs.InvalidRecord as exc:
            outcome.rejected.append(f"{where}: {exc.message}")
            continue
        prepared.add(one.request_ids[0], one.rows[0])
    if prepared.request_ids:
        statuses = logs.insert_prepared(conn, tenant_id=tenant_id, prepared=prepared)
        outcome.inserted = statuses.count("inserted")
        outcome.existing = len(statuses) - outcome.inserted
    OTEL_SPANS.labels("inserted").inc(outcome.inserted)
    OTEL_SPANS.labels("existing").inc(outcome.existing)
    OTEL_SPANS.labels("skipped").inc(outcome.skipped)
    OTEL_SPANS.labels("rejected").inc(len(outcome.rejected))
    return outcome


__all__ = [
    "JSON",
    "PROTOBUF",
    "ExportTraceServiceRequest",
    "Outcome",
    "decompress",
    "ingest",
    "parse",
    "response_body",
]
