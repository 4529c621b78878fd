"""The embedder: fills obs.inference_log.embedding (prompt embeddings for semantic dedup)."""
