"""`cft run`: the whole platform on one machine (a supervised group of processes)."""
