"""Datasets: candidate views over traffic, frozen snapshots, TRL-format exports."""
