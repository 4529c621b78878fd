"""Routes: the serving slots adapters compete for."""
