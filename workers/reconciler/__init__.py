"""The reconciler: every engine's loaded adapters follow serve.adapter (canary and prod)."""
