"""SGLang's server: adapters loaded by name, called as `<base model>:<adapter name>`.

Read at sgl-project/sglang (the 0.5 line; python/sglang/srt/entrypoints/http_server.py,
managers/tokenizer_control_mixin.py `load_lora_adapter`, managers/tokenizer_manager.py
`_resolve_lora_path`, lora/lora_registry.py 0270cff, lora/lora_manager.py
`validate_new_adapter`):

- POST /load_lora_adapter {"lora_name", "lora_path", "pinned"} and POST /unload_lora_adapter
  {"lora_name"} answer {"success", "error_message", "loaded_adapters"} with 200 on success and
  400 otherwise: "LoRA with name <n> already exists", "LoRA with name <n> does not exist",
  "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
- Above --max-loaded-loras a load evicts the least recently used adapter that is not pinned
  (a call naming an adapter counts as a use). The evicted adapter leaves the registry, so
  /v1/models no longer lists it, but SGLang remembers it (`lora_ref_cache`): the next call that
  names it loads it again (evicting another), with its pinned flag. It is "not resident", not
  lost; a restarted server remembers nothing, and a call naming an adapter it never loaded is
  a 400 ("Got LoRA adapter that has never been loaded", older releases "The following requested
  LoRA adapters are not loaded").
- A pinned adapter is never evicted. SGLang refuses to pin the last free slot of its GPU pool
  ("Failed to load LoRA adapter <n> as a pinned adapter. It is not allowed to pin all slots",
  at max-loras-per-batch - 1 pinned), and a load that must evict while every adapter is pinned
  fails ("Didn't find any LoRA adapters when trying to evict LRU LoRA adapter").
- /v1/models lists the base model and every registered adapter (id = lora_name, parent = base);
  GET /get_server_info returns the server's arguments (max_loaded_loras, max_loras_per_batch,
  served_model_name, weight_version) and its version.
"""

from __future__ import annotations

from typing import Any, ClassVar

from app.engines.base import (
    NOT_PINNED,
    Answer,
    Described,
    EngineKind,
    Http,
    HttpReply,
    Kind,
    Outcome,
    base_ids,
    failed_or_refused,
    json_object,
)

# SGLang's answers to a call for an adapter it does not hold (restarted, never loaded).
_NOT_HELD = (b"not loaded", b"never been loaded")
# SGLang's refusal to pin one more adapter.
_PIN_REFUSED = "as a pinned adapter"


def _answer(resp: HttpReply, *, gone: str) -> Answer:
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


def pin_limit(max_loras_per_batch: int | None, max_loaded_loras: int | None) -> int:
    """How many adapters cft pins on one SGLang server: below what SGLang allows (one GPU slot
    left free), and at most half of --max-loaded-loras, so that unpinned adapters still have
    room to come and go without every load evicting the one loaded before it."""
    per_batch = max_loras_per_batch if max_loras_per_batch is not None else 8  # its default
    limit = per_batch - 1
    if max_loaded_loras is not None:
        limit = min(limit, max_loaded_loras // 2)
    return max(0, limit)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SGLang(Kind):
    """SGLang's server."""

    name: ClassVar[EngineKind] = "sglang"
    keeps_evicted: ClassVar[bool] = True
    pins: ClassVar[bool] = True

    def model_fields(
        self, model: str, *, base_model: str, adapter_path: str | None
    ) -> dict[str, str]:
        """`base:adapter` for an adapter, the base's own name for the base."""
        return {"model": model if model == base_model else f"{base_model}:{model}"}

    def adapter_refused(self, status: int, body: bytes) -> bool:
        """404, 5xx, or SGLang's 400 for an adapter it does not hold (restarted, never
        loaded); an evicted one it loads again itself."""
        if super().adapter_refused(status, body):
            return True
        return status == 400 and any(text in body for text in _NOT_HELD)

    def describe(self, client: Http, url: str) -> Described:
        """Its base (/v1/models), capacity and pin limit (/get_server_info's
        max_loaded_loras and max_loras_per_batch) and the base's weight_version."""
        resp = client.get(url + "/v1/models", timeout=5.0)
        resp.raise_for_status()
        bases = base_ids(resp.json()) or None
        info = client.get(url + "/get_server_info", timeout=5.0)
        args = json_object(info) if info.status_code == 200 else {}
        loaded = _int(args.get("max_loaded_loras"))
        version = args.get("weight_version")
        return Described(
            bases=bases,
            revision=str(version) if version not in (None, "") else None,
            capacity=loaded,
            pin_limit=pin_limit(_int(args.get("max_loras_per_batch")), loaded),
        )

    def load(self, client: Http, url: str, name: str, path: str, *, pinned: bool = False) -> Answer:
        """POST /load_lora_adapter and classify SGLang's answer; a pin SGLang refuses is
        loaded unpinned instead."""
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if pinned:
            body["pinned"] = True
        resp = client.post(url + "/load_lora_adapter", json=body)
        answer = _answer(resp, gone="already exists")
        if pinned and answer.outcome is Outcome.REFUSED and _PIN_REFUSED in answer.message:
            unpinned = self.load(client, url, name, path)
            if unpinned.outcome is Outcome.DONE:
                return Answer(Outcome.DONE, NOT_PINNED + answer.message)
            return unpinned
        return answer

    def unload(self, client: Http, url: str, name: str) -> Answer:
        """POST /unload_lora_adapter and classify SGLang's answer."""
        resp = client.post(url + "/unload_lora_adapter", json={"lora_name": name})
        return _answer(resp, gone="does not exist")


KIND = SGLang()
