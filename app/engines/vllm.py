"""vLLM's OpenAI server: adapters loaded by name ahead of the calls that use them.

Read at vllm-project/vllm (vllm/entrypoints/serve/lora/api_router.py 27873ca,
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
- A call names the adapter in `model` (its lora_name); an unknown name is a 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from app.engines.base import Answer, EngineKind, Kind, Outcome, failed_or_refused, json_object

if TYPE_CHECKING:
    import httpx

_NO_RUNTIME_LORA = (
    "the engine has no /v1/load_lora_adapter route: start vLLM with"
    " VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"
)


def error(resp: httpx.Response) -> tuple[str, str] | None:
    """(type, message) of a vLLM ErrorResponse (either layout), else None."""
    body = json_object(resp)
    err = body.get("error") if isinstance(body.get("error"), dict) else body
    if isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err:
        return str(err["type"]), err["message"]
    return None


def _route_missing(resp: httpx.Response) -> bool:
    """A 404 for the route itself (FastAPI's {"detail": "Not Found"}), not for an adapter."""
    if resp.status_code != 404:
        return False
    if json_object(resp).get("detail") == "Not Found":
        return True
    err = error(resp)
    return err is not None and err[1] == "Not Found"


def _message(resp: httpx.Response) -> str:
    err = error(resp)
    return err[1] if err else resp.text[:500]


class VLLM(Kind):
    """vLLM's OpenAI server (the default kind of a bare URL in CFT_ENGINE_URLS)."""

    name: ClassVar[EngineKind] = "vllm"
    vllm_api: ClassVar[bool] = True

    def load(self, client: httpx.Client, url: str, name: str, path: str) -> Answer:
        """POST /v1/load_lora_adapter and classify vLLM's answer."""
        resp = client.post(
            url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}
        )
        if resp.status_code == 200:
            return Answer(Outcome.DONE, resp.text[:200])
        if _route_missing(resp):
            return Answer(Outcome.NO_API, _NO_RUNTIME_LORA)
        message = _message(resp)
        if resp.status_code == 400 and "already been loaded" in message:
            return Answer(Outcome.ALREADY, message)
        if resp.status_code == 404:
            return Answer(
                Outcome.NO_PATH,
                f"{message} (the engine must read CFT_SERVING_DIR at the same path as cft)",
            )
        return failed_or_refused(resp.status_code, message)

    def unload(self, client: httpx.Client, url: str, name: str) -> Answer:
        """POST /v1/unload_lora_adapter and classify vLLM's answer."""
        resp = client.post(url + "/v1/unload_lora_adapter", json={"lora_name": name})
        if resp.status_code == 200:
            return Answer(Outcome.DONE)
        if _route_missing(resp):
            return Answer(Outcome.NO_API, _NO_RUNTIME_LORA.replace("load_lora", "unload_lora"))
        message = _message(resp)
        if resp.status_code == 404:
            return Answer(Outcome.ALREADY, message)
        return failed_or_refused(resp.status_code, message)


KIND = VLLM()
