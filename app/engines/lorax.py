"""LoRAX: nothing is loaded ahead; a call names the adapter's directory and LoRAX loads it.

Read at predibase/lorax a7394ba (router/src/server.rs, lib.rs, loader.rs): there is no load
call and no /v1/models, so the reconciler verifies and stages the files where LoRAX reads them
and only checks that it answers GET /health. A call sets `model` = the adapter's directory and
`adapter_source` = "local"; the base model is `model` = "". An adapter LoRAX cannot fetch or
load fails the call with 424 (its GenerationError).
"""

from __future__ import annotations

from typing import ClassVar

from app.engines.base import EngineKind, Kind

# What a LoRAX call says about where its adapter is: a directory on the engine's filesystem.
SOURCE = "local"


class LoRAX(Kind):
    """LoRAX."""

    name: ClassVar[EngineKind] = "lorax"
    loads_adapters: ClassVar[bool] = False
    lists_models: ClassVar[bool] = False

    def model_fields(
        self, model: str, *, base_model: str, adapter_path: str | None
    ) -> dict[str, str]:
        """The adapter's staged directory and its source; `""` for the base model."""
        if model == base_model:
            return {"model": ""}
        return {"model": adapter_path or model, "adapter_source": SOURCE}

    def adapter_refused(self, status: int, body: bytes) -> bool:
        """404, 5xx, or LoRAX's 424 for an adapter it could not fetch or load."""
        return super().adapter_refused(status, body) or status == 424


KIND = LoRAX()
