"""SGLang's server: adapters loaded by name, called as `<base model>:<adapter name>`.

Read at sgl-project/sglang (python/sglang/srt/entrypoints/http_server.py,
managers/tokenizer_control_mixin.py 369fa46, lora/lora_registry.py 5bf90e9):

- POST /load_lora_adapter {"lora_name", "lora_path"} and POST /unload_lora_adapter
  {"lora_name"} answer {"success", "error_message", "loaded_adapters"} with 200 on success and
  400 otherwise: "LoRA with name <n> already exists", "LoRA with name <n> does not exist",
  "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
- /v1/models lists the base model and every loaded adapter (id = lora_name, parent = base).
- A call names `<base model>:<adapter name>` (split at the first colon); an adapter that is not
  loaded is a 400 ("The following requested LoRA adapters are not loaded").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from app.engines.base import Answer, EngineKind, Kind, Outcome, failed_or_refused, json_object

if TYPE_CHECKING:
    import httpx


def _answer(resp: httpx.Response, *, gone: str) -> Answer:
    if resp.status_code == 404:
        return Answer(Outcome.NO_API, "the engine has no SGLang LoRA routes (is it SGLang?)")
    body = json_object(resp)
    if resp.status_code == 200 and body.get("success", True):
        return Answer(Outcome.DONE)
    message = str(body.get("error_message") or resp.text[:500])
    if gone in message:
        return Answer(Outcome.ALREADY, message)
    if "--enable-lora" in message:
        return Answer(Outcome.NO_API, message)
    return failed_or_refused(resp.status_code, message)


class SGLang(Kind):
    """SGLang's server."""

    name: ClassVar[EngineKind] = "sglang"

    def model_fields(
        self, model: str, *, base_model: str, adapter_path: str | None
    ) -> dict[str, str]:
        """`base:adapter` for an adapter, the base's own name for the base."""
        return {"model": model if model == base_model else f"{base_model}:{model}"}

    def adapter_refused(self, status: int, body: bytes) -> bool:
        """404, 5xx, or SGLang's 400 for an adapter it does not hold (evicted, restarted)."""
        if super().adapter_refused(status, body):
            return True
        return status == 400 and b"not loaded" in body

    def load(self, client: httpx.Client, url: str, name: str, path: str) -> Answer:
        """POST /load_lora_adapter and classify SGLang's answer."""
        resp = client.post(url + "/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        return _answer(resp, gone="already exists")

    def unload(self, client: httpx.Client, url: str, name: str) -> Answer:
        """POST /unload_lora_adapter and classify SGLang's answer."""
        resp = client.post(url + "/unload_lora_adapter", json={"lora_name": name})
        return _answer(resp, gone="does not exist")


KIND = SGLang()
