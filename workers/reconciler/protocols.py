"""The load/unload calls of each engine kind, and what each answer means (docs/engines.md).

vLLM (read at vllm-project/vllm: vllm/entrypoints/serve/lora/api_router.py 27873ca,
vllm/entrypoints/openai/models/serving.py 4fe4500, vllm/lora/worker_manager.py,
vllm/exceptions.py):

- POST /v1/load_lora_adapter {"lora_name", "lora_path"} -> 200 text "Success: LoRA adapter
  '<name>' added successfully." The routes exist only when the server runs with
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; otherwise FastAPI answers 404 {"detail": "Not Found"}.
- Errors are ErrorResponse {"error": {"message", "type", "param", "code"}} (older releases:
  the same fields at the top level with "object": "error"), with the HTTP status as code:
  400 InvalidUserInput "... has already been loaded ..." (the name is taken), 400
  BadRequestError (the engine refused the adapter: rank above --max-lora-rank, DoRA,
  modules_to_save, unexpected target modules), 404 NotFoundError "Loading lora <name> failed:
  No adapter found for <path>" (the engine cannot read the path).
- POST /v1/unload_lora_adapter {"lora_name"} -> 200; an unknown name is 404 NotFoundError
  "The lora adapter '<name>' cannot be found."

SGLang (sgl-project/sglang: python/sglang/srt/entrypoints/http_server.py,
managers/tokenizer_control_mixin.py 369fa46, lora/lora_registry.py 5bf90e9):

- POST /load_lora_adapter {"lora_name", "lora_path"} and POST /unload_lora_adapter
  {"lora_name"} answer {"success", "error_message", "loaded_adapters"} with 200 on success and
  400 otherwise: "LoRA with name <n> already exists", "LoRA with name <n> does not exist",
  "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
- /v1/models lists the base model and every loaded adapter (id = lora_name, parent = base).

LoRAX has no load call (predibase/lorax router/src/server.rs a7394ba): the reconciler only
checks that it answers GET /health.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import httpx


class Outcome(enum.Enum):
    """What an engine's answer to a load or unload means for the reconciler."""

    DONE = "done"  # loaded / unloaded now
    ALREADY = "already"  # loaded before under this name / already gone
    NO_PATH = "no_path"  # the engine cannot read the adapter's directory
    NO_API = "no_api"  # the engine has no load/unload routes (a setting is missing)
    REFUSED = "refused"  # the engine refused this adapter or request
    FAILED = "failed"  # the engine failed (5xx): try again later


@dataclass(frozen=True)
class Answer:
    """An Outcome and the readable reason (the engine's own message where it gave one)."""

    outcome: Outcome
    message: str = ""


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def vllm_error(resp: httpx.Response) -> tuple[str, str] | None:
    """(type, message) of a vLLM ErrorResponse (either layout), else None."""
    body = _json(resp)
    err = body.get("error") if isinstance(body.get("error"), dict) else body
    if isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err:
        return str(err["type"]), err["message"]
    return None


def _route_missing(resp: httpx.Response) -> bool:
    """A 404 for the route itself (FastAPI's {"detail": "Not Found"}), not for an adapter."""
    if resp.status_code != 404:
        return False
    body = _json(resp)
    if body.get("detail") == "Not Found":
        return True
    err = vllm_error(resp)
    return err is not None and err[1] == "Not Found"


_NO_RUNTIME_LORA = (
    "the engine has no /v1/load_lora_adapter route: start vLLM with"
    " VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"
)


def vllm_load(client: httpx.Client, url: str, name: str, path: str) -> Answer:
    """POST /v1/load_lora_adapter and classify vLLM's answer."""
    resp = client.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    if resp.status_code == 200:
        return Answer(Outcome.DONE, resp.text[:200])
    if _route_missing(resp):
        return Answer(Outcome.NO_API, _NO_RUNTIME_LORA)
    err = vllm_error(resp)
    message = err[1] if err else resp.text[:500]
    if resp.status_code == 400 and "already been loaded" in message:
        return Answer(Outcome.ALREADY, message)
    if resp.status_code == 404:
        return Answer(
            Outcome.NO_PATH,
            f"{message} (the engine must read CFT_SERVING_DIR at the same path as cft)",
        )
    if resp.status_code >= 500:
        return Answer(Outcome.FAILED, f"engine answered {resp.status_code}: {message}")
    return Answer(Outcome.REFUSED, f"engine answered {resp.status_code}: {message}")


def vllm_unload(client: httpx.Client, url: str, name: str) -> Answer:
    """POST /v1/unload_lora_adapter and classify vLLM's answer."""
    resp = client.post(url + "/v1/unload_lora_adapter", json={"lora_name": name})
    if resp.status_code == 200:
        return Answer(Outcome.DONE)
    if _route_missing(resp):
        return Answer(Outcome.NO_API, _NO_RUNTIME_LORA.replace("load_lora", "unload_lora"))
    err = vllm_error(resp)
    message = err[1] if err else resp.text[:500]
    if resp.status_code == 404:
        return Answer(Outcome.ALREADY, message)
    if resp.status_code >= 500:
        return Answer(Outcome.FAILED, f"engine answered {resp.status_code}: {message}")
    return Answer(Outcome.REFUSED, f"engine answered {resp.status_code}: {message}")


def _sglang_answer(resp: httpx.Response, *, gone: str) -> Answer:
    if resp.status_code == 404:
        return Answer(Outcome.NO_API, "the engine has no SGLang LoRA routes (is it SGLang?)")
    body = _json(resp)
    if resp.status_code == 200 and body.get("success", True):
        return Answer(Outcome.DONE)
    message = str(body.get("error_message") or resp.text[:500])
    if gone in message:
        return Answer(Outcome.ALREADY, message)
    if "--enable-lora" in message:
        return Answer(Outcome.NO_API, message)
    if resp.status_code >= 500:
        return Answer(Outcome.FAILED, f"engine answered {resp.status_code}: {message}")
    return Answer(Outcome.REFUSED, f"engine answered {resp.status_code}: {message}")


def sglang_load(client: httpx.Client, url: str, name: str, path: str) -> Answer:
    """POST /load_lora_adapter and classify SGLang's answer."""
    resp = client.post(url + "/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    return _sglang_answer(resp, gone="already exists")


def sglang_unload(client: httpx.Client, url: str, name: str) -> Answer:
    """POST /unload_lora_adapter and classify SGLang's answer."""
    resp = client.post(url + "/unload_lora_adapter", json={"lora_name": name})
    return _sglang_answer(resp, gone="does not exist")


def load(client: httpx.Client, kind: str, url: str, name: str, path: str) -> Answer:
    """Load an adapter into an engine of a loading kind (vllm, local, sglang)."""
    if kind == "sglang":
        return sglang_load(client, url, name, path)
    return vllm_load(client, url, name, path)


def unload(client: httpx.Client, kind: str, url: str, name: str) -> Answer:
    """Unload an adapter from an engine of a loading kind (vllm, local, sglang)."""
    if kind == "sglang":
        return sglang_unload(client, url, name)
    return vllm_unload(client, url, name)
