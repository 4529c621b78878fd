"""The local inference engine: vLLM's OpenAI-compatible and LoRA-loading API on a CPU."""
