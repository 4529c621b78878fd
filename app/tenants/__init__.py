"""Tenants and their API keys (administration; runs as the database owner)."""
