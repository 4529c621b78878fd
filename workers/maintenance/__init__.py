"""Maintenance worker: partitions ahead, rows out of DEFAULT, retention."""
