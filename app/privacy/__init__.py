"""Privacy: forgetting a user (their logs deleted, what was built from them tainted)."""
