"""The experiments worker: each enabled route's live-traffic promotion policy, applied."""
