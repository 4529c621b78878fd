"""The loop worker: starts due cycles and drives them one state at a time (`cft worker loop`)."""
