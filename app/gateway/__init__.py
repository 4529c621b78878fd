"""The OpenAI-compatible gateway: route -> adapter (sticky canaries), engines, call logs."""
