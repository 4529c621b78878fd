"""Experiments: A/B metrics with significance, the live-traffic promotion policy
(the pages are in app/dashboard)."""
