"""Request ids that both sides derive the same way (no server import)."""

from __future__ import annotations

import uuid

# The namespace of request ids derived from OpenTelemetry spans (uuid5 of trace and span id).
OTEL_NAMESPACE = uuid.UUID("6f0d6c43-1c0e-5f55-9a8e-2e1f0c7d3b10")


def new_request_id() -> str:
    """A fresh random request id (UUID4)."""
    return str(uuid.uuid4())


def span_request_id(trace_id: int | bytes | str, span_id: int | bytes | str) -> str:
    """The request id cft gives the row of an OpenTelemetry span (send feedback to it).

    trace_id and span_id as the SDK's ints (`span.get_span_context()`), raw bytes, or hex.
    """
    return str(uuid.uuid5(OTEL_NAMESPACE, f"{_hex(trace_id, 16)}-{_hex(span_id, 8)}"))


def _hex(value: int | bytes | str, size: int) -> str:
    if isinstance(value, int):
        return value.to_bytes(size, "big").hex()
    if isinstance(value, bytes):
        return value.hex()
    return value.lower()
