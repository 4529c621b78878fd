"""The real embedding model, loaded once per test session."""

from __future__ import annotations

from functools import lru_cache

from app.core.config import Settings
from workers.embedder.model import Encoder, load_encoder


@lru_cache(maxsize=1)
def encoder() -> Encoder:
    """The bundled all-MiniLM-L6-v2 (offline), as the embedder worker uses it."""
    return load_encoder(Settings(embedding_url=None))
