"""Routing: which adapter serves which user (sticky canaries), kept fresh by LISTEN/NOTIFY."""
