"""The loop: per-route policy, triggers, cycles from traffic to a promoted adapter (issue 20)."""
