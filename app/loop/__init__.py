"""The loop: per-route policy, triggers, cycles from traffic to a promoted adapter.

The user's guide is docs/loop.md.
"""
