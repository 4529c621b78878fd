"""cft's CPU engine (`cft engine`, cft/engine): it speaks vLLM's API, so vLLM's rules."""

from __future__ import annotations

from typing import ClassVar

from app.engines.base import EngineKind
from app.engines.vllm import VLLM


class Local(VLLM):
    """The local engine: loads, names and refuses adapters as vLLM does."""

    name: ClassVar[EngineKind] = "local"


KIND = Local()
