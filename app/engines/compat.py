"""Will vLLM load this adapter? The contract, checked on the files alone (no torch).

Written from vLLM's own loading code (vllm-project/vllm; docs/engines.md cites each rule):

- vllm/lora/peft_helper.py (e745baf; the newest form read at a later commit): PEFTHelper
  needs `r`, `lora_alpha` and `target_modules` in adapter_config.json; ignores other fields;
  refuses `modules_to_save` ("vLLM only supports modules_to_save being None"), `use_dora`
  ("vLLM does not yet support DoRA"), `bias` other than "none", `r` above --max-lora-rank
  (also every value of `rank_pattern`), `r` <= 0, and `trainable_token_indices` beyond
  --max-lora-trainable-tokens. `use_rslora` only changes the scale (alpha / sqrt(r)). vLLM
  0.32 (checked running) also refuses `init_lora_weights` naming an init that changes the base
  weights (PiSSA, OLoRA, CorDA, LoftQ), `alora_invocation_tokens` and `layer_replication`.
- vllm/config/lora.py (a78dc92): --max-lora-rank is one of 1, 8, 16, 32, 64, 128, 256, 320,
  512 (default 16).
- vllm/lora/lora_model.py (532cc25): weights come from adapter_model.safetensors (before .bin
  and .pt); every tensor name must parse, and its module's last name part must be one the
  model supports, else "While loading ..., expected target modules in ... but received ...";
  an embedding LoRA must match the base vocabulary exactly (no extra vocabulary).
- vllm/lora/utils.py (0fd1570) parse_fine_tuned_lora_name: a name is
  `base_model.model.<module>.lora_A.weight` / `.lora_B.weight` (or `.lora_embedding_A` /
  `_B`); `...embed_tokens.base_layer.weight` and `...lm_head.base_layer.weight` are skipped;
  anything else is "<name> is unsupported LoRA weight".

cft's contract is a little stricter than the loader, so that every engine kind can serve the
artefact: linear-layer LoRA only (no embedding or lm_head adapters, no new tokens), both
halves of every module present with consistent shapes, floating-point weights.

Given the base model's config.json (`base_config`), the check also does what vLLM does when it
builds the LoRA layers on that model (vllm/lora/layers: each layer's lora_a / lora_b must fit its
input and output size): every tensor's shape fits its module of the base, every layer index
exists in the base, and every module the config targets has its weights in every layer.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# vllm/config/lora.py MaxLoRARanks and the default of --max-lora-rank.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_MAX_LORA_RANK = 16
# The linear layers vLLM can wrap with LoRA in a Llama-family model (what cft trains).
LLAMA_LORA_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
)
EMBEDDING_MODULES = frozenset({"embed_tokens", "lm_head"})
# init_lora_weights values that only set the starting weights (the saved adapter is a plain
# LoRA); any other string (PiSSA, OLoRA, CorDA, LoftQ) changed the base weights too.
WEIGHTS_ONLY_INITS = frozenset({"gaussian", "eva", "orthogonal", "mica", "lora_ga"})
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32"})
_PREFIX = "base_model.model."
_BASE_EMBEDDINGS = (".embed_tokens.base_layer.weight", ".lm_head.base_layer.weight")
# The largest safetensors header read (the format's own bound is 100 MB; adapters have KBs).
MAX_HEADER_BYTES = 100_000_000
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# Problems listed one by one up to this many, then counted (a wrong base misfits every tensor).
MAX_LISTED = 5


class NotLoadable(ValueError):
    """The adapter breaks the engines' contract; `problems` says each way it does."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__(f"vLLM would not load the adapter in {path}: " + "; ".join(problems))


@dataclass
class Report:
    """What the check found: the problems (empty when loadable) and what it read."""

    problems: list[str] = field(default_factory=list)
    rank: int | None = None
    modules: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        """True when an engine would load the adapter."""
        return not self.problems


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: tensor name -> {dtype, shape, data_offsets}."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path.name} is too short to be a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size <= 0 or size > MAX_HEADER_BYTES:
            raise ValueError(f"{path.name} has an invalid safetensors header size ({size})")
        raw = f.read(size)
    if len(raw) != size:
        raise ValueError(f"{path.name} ends inside its safetensors header")
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}'s safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def parse_lora_name(name: str) -> tuple[str, str]:
    """(module path, 'A' or 'B') of a PEFT LoRA tensor name, as vLLM parses it.

    Raises ValueError for a name vLLM calls "unsupported LoRA weight".
    """
    start = 2 if name.startswith(_PREFIX) else 0
    parts = name.split(".")
    if len(parts) >= 3 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
        return ".".join(parts[start:-2]), parts[-2][-1]
    if len(parts) >= 2 and parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
        return ".".join(parts[start:-1]), parts[-1][-1]
    raise ValueError(f"{name} is unsupported LoRA weight")


def _config_problems(cfg: dict[str, Any], max_lora_rank: int, report: Report) -> list[str]:
    out: list[str] = []
    missing = [k for k in ("r", "lora_alpha", "target_modules") if k not in cfg]
    if missing:
        out.append(f"{CONFIG_FILE} lacks required field(s) {', '.join(missing)}")
    peft_type = cfg.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        out.append(f"peft_type is {peft_type!r}: only LoRA adapters are served")
    r = cfg.get("r")
    if "r" in cfg:
        if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
            out.append(f"LoRA rank `r` must be a positive integer, got {r!r}")
        else:
            report.rank = r
            pattern = cfg.get("rank_pattern")
            per_module = pattern.values() if isinstance(pattern, dict) else ()
            ranks = [r, *(v for v in per_module if isinstance(v, int))]
            if max(ranks) > max_lora_rank:
                out.append(
                    f"LoRA rank {max(ranks)} is greater than max_lora_rank {max_lora_rank}"
                    " (raise the engine's --max-lora-rank or train a smaller rank)"
                )
    alpha = cfg.get("lora_alpha")
    if "lora_alpha" in cfg and (not isinstance(alpha, int | float) or isinstance(alpha, bool)):
        out.append(f"lora_alpha must be a number, got {alpha!r}")
    if cfg.get("use_dora"):
        out.append("vLLM does not yet support DoRA (use_dora is true)")
    if cfg.get("modules_to_save"):
        out.append(
            f"vLLM only supports modules_to_save being None (got {cfg['modules_to_save']!r})"
        )
    if cfg.get("bias", "none") != "none":
        out.append(f"Adapter bias is not supported (bias is {cfg['bias']!r})")
    for flag in ("use_qalora", "use_bdlora", "lora_bias", "alora_invocation_tokens"):
        if cfg.get(flag):
            out.append(f"{flag} is set: a LoRA variant vLLM does not implement")
    if cfg.get("layer_replication"):
        out.append("vLLM does not support layer_replication")
    init = cfg.get("init_lora_weights")
    if isinstance(init, str) and init.lower() not in WEIGHTS_ONLY_INITS:
        out.append(
            f"vLLM does not support init_lora_weights={init!r}: it changes the base model's"
            " weights (convert the adapter to a plain LoRA first)"
        )
    if cfg.get("target_parameters"):
        out.append("target_parameters (LoRA on raw parameters) is not part of the contract")
    for pattern in ("rank_pattern", "alpha_pattern"):
        if cfg.get(pattern):
            out.append(
                f"{pattern} is set: per-module ranks or scales are ignored by some vLLM releases"
                " (one r and lora_alpha for every module)"
            )
    if cfg.get("trainable_token_indices") is not None:
        out.append("trainable_token_indices (new token embeddings) are not part of the contract")
    target = cfg.get("target_modules")
    if "target_modules" in cfg and not isinstance(target, str | list):
        out.append(f"target_modules must be a list of names or a regex, got {target!r}")
    return out


def _tensor_problems(
    header: dict[str, Any], supported: frozenset[str], report: Report
) -> list[str]:
    out: list[str] = []
    halves: dict[str, dict[str, list[int]]] = {}
    unexpected: set[str] = set()
    for name, meta in header.items():
        if name.endswith(_BASE_EMBEDDINGS):
            out.append(f"{name}: a base embedding in the adapter (new tokens) is not served")
            continue
        try:
            module, half = parse_lora_name(name)
        except ValueError as exc:
            out.append(str(exc))
            continue
        if not name.startswith(_PREFIX):
            out.append(f"{name}: tensor names start with {_PREFIX!r} in a PEFT adapter")
            continue
        leaf = module.rsplit(".", 1)[-1]
        if leaf in EMBEDDING_MODULES or "lora_embedding" in name:
            out.append(f"{name}: embedding / lm_head adapters are not served")
            continue
        if leaf not in supported:
            unexpected.add(module)
            continue
        dtype = meta.get("dtype") if isinstance(meta, dict) else None
        if dtype not in FLOAT_DTYPES:
            out.append(
                f"{name}: dtype {dtype!r} (expected one of {', '.join(sorted(FLOAT_DTYPES))})"
            )
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if not isinstance(shape, list) or len(shape) != 2:
            out.append(f"{name}: shape {shape!r} (a LoRA weight is a matrix)")
            continue
        halves.setdefault(module, {})[half] = shape
        report.modules.add(leaf)
    if unexpected:
        out.append(
            f"expected target modules in {sorted(supported)} but received {sorted(unexpected)}"
        )
    if not halves and not out:
        out.append(f"{WEIGHTS_FILE} holds no LoRA weights")
    for module, pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            out.append(f"{module}: lora_{'B' if 'A' in pair else 'A'}.weight is missing")
            continue
        a, b = pair["A"], pair["B"]
        if a[0] != b[1]:
            out.append(f"{module}: lora_A is {a} and lora_B is {b}: their ranks differ")
    return out


def check(
    adapter_dir: Path,
    *,
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK,
    supported_modules: Iterable[str] = LLAMA_LORA_MODULES,
    base_config: dict[str, Any] | None = None,
) -> Report:
    """Check an adapter directory against the engines' contract (see the module doc); with
    base_config (the base model's config.json), also against the base's shapes."""
    report = Report()
    if max_lora_rank not in MAX_LORA_RANKS:
        report.problems.append(
            f"max_lora_rank {max_lora_rank} is not a vLLM --max-lora-rank value"
            f" ({', '.join(map(str, MAX_LORA_RANKS))})"
        )
    cfg_path = adapter_dir / CONFIG_FILE
    try:
        cfg = json.loads(cfg_path.read_text())
        if not isinstance(cfg, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        report.problems.append(f"{CONFIG_FILE} is missing")
        cfg = None
    except (OSError, ValueError, RecursionError) as exc:
        report.problems.append(f"{CONFIG_FILE} is not valid JSON: {exc}")
        cfg = None
    if cfg is not None:
        report.problems += _config_problems(cfg, max_lora_rank, report)
    weights = adapter_dir / WEIGHTS_FILE
    if not weights.is_file():
        report.problems.append(f"{WEIGHTS_FILE} is missing")
        return report
    try:
        header = read_safetensors_header(weights)
    except (OSError, ValueError, RecursionError) as exc:
        report.problems.append(f"{WEIGHTS_FILE}: {exc}")
        return report
    report.problems += _tensor_problems(header, frozenset(supported_modules), report)
    if report.rank is not None and cfg is not None and not cfg.get("rank_pattern"):
        for name, meta in header.items():
            shape = meta.get("shape") if isinstance(meta, dict) else None
            if not name.endswith(".lora_A.weight") or not isinstance(shape, list) or not shape:
                continue
            if shape[0] != report.rank:
                report.problems.append(
                    f"{name}: rank {shape[0]} differs from r={report.rank} in {CONFIG_FILE}"
                )
    if base_config is not None and cfg is not None:
        report.problems += base_problems(header, cfg, base_config)
    return report


def _module_sizes(base: dict[str, Any]) -> dict[str, tuple[int, int]] | None:
    """(input, output) size of each LoRA-able linear layer of a Llama-family base, or None when
    the config does not describe one."""
    hidden, heads = base.get("hidden_size"), base.get("num_attention_heads")
    inter = base.get("intermediate_size")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, heads, inter)):
        return None
    assert isinstance(hidden, int) and isinstance(heads, int) and isinstance(inter, int)
    kv = base.get("num_key_value_heads") or heads
    head_dim = base.get("head_dim") or hidden // heads
    if not isinstance(kv, int) or not isinstance(head_dim, int):
        return None
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv * head_dim),
        "v_proj": (hidden, kv * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def _listed(problems: list[str], what: str) -> list[str]:
    if len(problems) <= MAX_LISTED:
        return problems
    return [*problems[:MAX_LISTED], f"... and {len(problems) - MAX_LISTED} more {what}"]


def base_problems(header: dict[str, Any], cfg: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """Where an adapter's tensors do not fit the base model its config.json describes: shapes,
    layer indexes, and target modules without weights in some layer."""
    sizes = _module_sizes(base)
    n_layers = base.get("num_hidden_layers")
    if sizes is None or not isinstance(n_layers, int):
        return []
    misfit: list[str] = []
    found: set[tuple[int, str]] = set()
    for name, meta in sorted(header.items()):
        try:
            module, half = parse_lora_name(name)
        except ValueError:
            continue  # reported by the contract check
        leaf = module.rsplit(".", 1)[-1]
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if leaf not in sizes or not isinstance(shape, list) or len(shape) != 2:
            continue
        layer = _LAYER.search(module)
        if layer is not None:
            index = int(layer.group(1))
            if index >= n_layers:
                misfit.append(f"{name}: layer {index}, but the base has {n_layers} layers")
                continue
            found.add((index, leaf))
        size_in, size_out = sizes[leaf]
        want = [shape[0], size_in] if half == "A" else [size_out, shape[1]]
        if shape != want:
            misfit.append(f"{name} is {shape}, the base needs {want}")
    out = _listed(misfit, "tensors that do not fit")
    if misfit:
        out.insert(
            0,
            f"the weights do not fit the base model (hidden size {base.get('hidden_size')},"
            f" {n_layers} layers): was the adapter trained on another base?",
        )
    targets = cfg.get("target_modules")
    if misfit or not isinstance(targets, list) or cfg.get("exclude_modules"):
        return out
    chosen = cfg.get("layers_to_transform")
    layers = [chosen] if isinstance(chosen, int) else chosen or range(n_layers)
    missing = [
        f"layer {i} {leaf}"
        for i in layers
        if isinstance(i, int)
        for leaf in sorted(set(targets) & sizes.keys())
        if (i, leaf) not in found
    ]
    if missing:
        out.append(
            f"{WEIGHTS_FILE} lacks the weights of target modules {CONFIG_FILE} names: "
            + ", ".join(_listed(missing, "modules"))
        )
    return out


def check_or_raise(adapter_dir: Path, **kwargs: Any) -> Report:
    """check(), raising NotLoadable with every problem when there is one."""
    report = check(adapter_dir, **kwargs)
    if not report.ok:
        raise NotLoadable(adapter_dir, report.problems)
    return report
