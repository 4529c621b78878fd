"""Observe: inference-log and feedback ingestion."""
