"""cft: continuous fine-tuning with PostgreSQL at the centre."""

__version__ = "0.1.0"
