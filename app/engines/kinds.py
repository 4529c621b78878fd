"""The engine kinds by name, and CFT_ENGINE_URLS entries parsed into (kind, URL).

An engine is written `KIND+URL` in CFT_ENGINE_URLS (`sglang+http://sglang:30000`); a bare URL is
a vLLM engine. docs/engines.md is the user's guide to the kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from app.engines import local, lorax, sglang, vllm
from app.engines.base import EngineKind, Kind

_BY_NAME: dict[str, Kind] = {
    k.name: k for k in (vllm.KIND, sglang.KIND, lorax.KIND, local.KIND, vllm.LAZY)
}
KINDS: tuple[str, ...] = get_args(EngineKind)  # each has its Kind (tests/unit/test_engine_kinds.py)
DEFAULT_KIND: EngineKind = "vllm"


def kind_of(name: str) -> Kind:
    """The Kind named `name` (one of KINDS; KeyError otherwise)."""
    return _BY_NAME[name]


@dataclass(frozen=True)
class EngineSpec:
    """One entry of CFT_ENGINE_URLS: the engine's kind and its base URL."""

    kind: EngineKind
    url: str


def parse_engine_url(raw: str) -> EngineSpec:
    """`KIND+http://host:port` (or a bare URL, a vLLM engine) as an EngineSpec.

    Raises ValueError with a message saying what to write instead.
    """
    text = raw.strip()
    kind: str = DEFAULT_KIND
    url = text
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if "+" in scheme:
        kind, _, rest = text.partition("+")
        kind = kind.strip().lower()
        url = rest.strip()
    if kind not in KINDS:
        raise ValueError(
            f"engine {raw!r}: unknown engine kind {kind!r}; write KIND+URL with KIND one of"
            f" {', '.join(KINDS)} (e.g. sglang+http://sglang:30000), or a bare URL for vLLM"
        )
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise ValueError(
            f"engine {raw!r}: {url!r} is not an http(s) URL; write e.g. http://vllm:8000"
            " or sglang+http://sglang:30000"
        )
    return EngineSpec(kind_of(kind).name, url.rstrip("/"))


def parse_engine_urls(raw: str | list[str]) -> list[EngineSpec]:
    """A comma-separated CFT_ENGINE_URLS value (or its entries) as EngineSpecs, in order."""
    entries = raw.split(",") if isinstance(raw, str) else raw
    return [parse_engine_url(e) for e in entries if e.strip()]
