"""The simulated product that drives the demo loop through cft's public APIs only."""
