"""One place for every setting: environment variables prefixed CFT_ (or a .env file)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """cft configuration; every field is documented in README.md."""

    model_config = SettingsConfigDict(env_prefix="CFT_", env_file=".env", extra="ignore")

    home: Path = Field(
        Path(".cft"), description="Local state: embedded database, artefacts, models."
    )
    database_url: str | None = Field(
        None, description="External PostgreSQL 18 + pgvector URL; unset = embedded server."
    )
    host: str = Field("127.0.0.1", description="Address the API server binds.")
    port: int = Field(8080, description="Port of the API server (control plane + router).")
    embedding_dim: int = Field(384, description="Dimension of obs.inference_log.embedding.")
    user_hash_secret: SecretStr = Field(
        SecretStr(""),
        description="HMAC key for user pseudonyms; generated under CFT_HOME if empty.",
    )
    db_pool_size: int = Field(10, description="Connections in the API's pool.")
    log_retention_days: int = Field(90, description="Partitions older than this are dropped.")
    partitions_ahead_weeks: int = Field(4, description="Weekly partitions created ahead of now.")
    max_batch_records: int = Field(1000, description="Most records in one POST /v1/logs.")
    max_body_bytes: int = Field(8 * 1024 * 1024, description="Largest accepted request body.")

    @property
    def embedded(self) -> bool:
        """True when cft runs its own PostgreSQL under CFT_HOME."""
        return not self.database_url

    @property
    def pgdata(self) -> Path:
        """Data directory of the embedded PostgreSQL."""
        return (self.home / "pgdata").resolve()


@lru_cache
def get_settings() -> Settings:
    """Return the process-wide settings (read once)."""
    return Settings()
