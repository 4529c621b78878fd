"""Engine kinds: vLLM (loading ahead, or on first use), SGLang, LoRAX and cft's local engine,
and what cft knows of each.

- `kinds.py`: the kinds by name, and CFT_ENGINE_URLS entries (`KIND+URL`) parsed.
- `base.py`: what a kind answers (how it names a model, loads and unloads an adapter, says an
  adapter is not loaded); `vllm.py` (vllm, vllm-lazy), `local.py`, `sglang.py`, `lorax.py`:
  each kind's answers.
- `state.py`: one engine as the router and the reconciler see it (its kind, what it serves).
- `compat.py`: the adapter contract every kind serves, checked on the files before registering.

Pure Python, no HTTP client at import: the settings validate CFT_ENGINE_URLS with it, and the
gateway (app/gateway/pool.py), the reconciler (workers/reconciler) and the trainer use it.
docs/engines.md is the user's guide.
"""
