"""Adapters: the registry, eval results and the promotion gate's HTTP face."""
