"""One place for every setting: environment variables prefixed CFT_ (or a .env file)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.engines.kinds import parse_engine_urls


class Settings(BaseSettings):
    """cft configuration; every field is documented in docs/configuration.md."""

    model_config = SettingsConfigDict(env_prefix="CFT_", env_file=".env", extra="ignore")

    home: Path = Field(
        Path(".cft"), description="Local state: embedded database, artefacts, models."
    )
    database_url: str | None = Field(
        None, description="External PostgreSQL 18 + pgvector URL; unset = embedded server."
    )
    host: str = Field("127.0.0.1", description="Address the API server binds.")
    port: int = Field(8080, description="Port of the API server (control plane + router).")
    metrics_host: str = Field(
        "127.0.0.1", description="Address of the Prometheus metrics listener (not the API's)."
    )
    metrics_port: int = Field(
        9464,
        description="Port of the Prometheus metrics listener (GET /metrics); 0 = off. Never the"
        " API's port: metric labels name every tenant's routes and adapters.",
    )
    embedding_dim: int = Field(384, description="Dimension of obs.inference_log.embedding.")
    user_hash_secret: SecretStr = Field(
        SecretStr(""),
        description="HMAC key for user pseudonyms; generated under CFT_HOME if empty.",
    )
    api_database_url: str | None = Field(
        None,
        description="URL the API process (control plane and router) logs in with; unset ="
        " CFT_DATABASE_URL (or the embedded server) as cft_api, a login role `cft migrate`"
        " creates that is not a superuser.",
    )
    api_db_password: SecretStr = Field(
        SecretStr(""),
        description="Password `cft migrate` sets on the cft_api login; needed where the server"
        " asks for one (the embedded server trusts local logins).",
    )
    db_pool_size: int = Field(10, description="Connections in the API's pool.")
    log_retention_days: int = Field(90, description="Partitions older than this are dropped.")
    partitions_ahead_weeks: int = Field(4, description="Weekly partitions created ahead of now.")
    max_batch_records: int = Field(1000, description="Most records in one POST /v1/logs.")
    max_body_bytes: int = Field(8 * 1024 * 1024, description="Largest accepted request body.")
    file_max_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Largest fine-tuning file POST /v1/files accepts (kept in PostgreSQL); that"
        " upload's body may be this large, whatever CFT_MAX_BODY_BYTES says.",
    )
    dashboard_session_hours: float = Field(
        12.0, gt=0, description="Hours a dashboard login lasts (then log in again)."
    )
    base_model: str = Field(
        "smollm2-135m-instruct",
        description="Base model: the bundled SmolLM2-135M-Instruct, a HF model id or a local path.",
    )
    base_models: str = Field(
        "",
        description="Comma-separated names of the base models the engines serve: a route's base"
        " model must be one of them, and the router sends no other base name to an engine;"
        " empty = CFT_BASE_MODEL only.",
    )
    artefact_store: str = Field("local", description="Where adapters are stored: local or s3.")
    artefact_dir: Path | None = Field(
        None, description="Local artefact store (default CFT_HOME/artefacts)."
    )
    s3_bucket: str = Field("cft-adapters", description="S3 bucket of the s3 artefact store.")
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint (MinIO); unset = AWS.")
    s3_access_key_id: str | None = Field(None, description="S3 access key id.")
    s3_secret_access_key: SecretStr | None = Field(None, description="S3 secret key.")
    s3_region: str = Field("us-east-1", description="S3 region.")
    artefact_orphan_grace_hours: float = Field(
        24.0,
        description="Hours after which the maintenance worker deletes a stored artefact version"
        " that no adapter row references (an upload whose registration never committed).",
    )
    engine_urls: str = Field(
        "",
        description="Comma-separated engine base URLs, each optionally KIND+URL with KIND vllm"
        " (the default), vllm-lazy, sglang, lorax or local (docs/engines.md); empty = local"
        " engine.",
    )
    engine_max_lora_rank: int = Field(
        16,
        description="The engines' --max-lora-rank: the trainer and an adapter import refuse to"
        " register an adapter an engine would not load (app/engines/compat.py).",
    )
    adapter_import_max_bytes: int = Field(
        512 * 1024 * 1024,
        gt=0,
        description="Largest adapter import (POST /v1/adapters, `cft adapter import`): the"
        " upload, and the files it unpacks to, in bytes.",
    )
    engine_adapter_slots: int = Field(
        0,
        ge=0,
        description="Adapters each engine keeps loaded (vLLM's --max-cpu-loras), where the"
        " engine does not say (SGLang reports its --max-loaded-loras): the reconciler loads"
        " ahead at most this many per engine, its hottest, and the rest on first call; 0 ="
        " every adapter placed on the engine.",
    )
    engine_widen_rate: float = Field(
        5.0,
        ge=0,
        description="Calls per second to one adapter (over about the last 30 s, as the router"
        " counts them) above which it is also loaded on the second engine of its rendezvous"
        " order and the router spreads its calls over both (a 429 from its engine widens it"
        " too, for 5 minutes); 0 = never.",
    )
    route_cache_ttl: float = Field(
        5.0,
        description="Seconds the router trusts a cached route while its LISTEN connection is"
        " down (while it is up, NOTIFY keeps every cached route current).",
    )
    serving_dir: Path | None = Field(
        None,
        description="Where the reconciler puts verified adapters for the engines to read"
        " (a directory every engine can read; default CFT_HOME/serving).",
    )
    reconcile_interval: float = Field(
        5.0, description="Seconds between reconciler passes (NOTIFY also triggers one)."
    )
    engine_timeout: float = Field(
        120.0, description="Seconds the router waits for an engine's response before failing over."
    )
    router_load_wait: float = Field(
        10.0,
        description="Seconds a call for an adapter no engine has loaded yet waits for the load"
        " (the reconciler is woken) before a 503 `adapter_not_loaded` with Retry-After; 0 = no"
        " wait. Falling back to prod or the base instead is the route's `fallback` policy.",
    )
    router_demand_ttl: float = Field(
        900.0,
        gt=0,
        description="Seconds a fine-tuned model (ft:...) stays loaded after its last call: the"
        " router asks the reconciler to load it when called, as OpenAI loads one on demand.",
    )
    router_affinity_slack: int = Field(
        8,
        description="Calls in flight by which an adapter's first engine (rendezvous hashing) may"
        " exceed its second before the second takes the call.",
    )
    router_key_cache_ttl: float = Field(
        5.0, description="Seconds the router caches an API key lookup (revocation delay bound)."
    )
    rate_limit_per_key: float = Field(
        1000.0,
        description="Requests per second one API key may make (bursts of twice that); 429 with"
        " Retry-After above it. Per API process; 0 = no limit.",
    )
    rate_limit_per_tenant: float = Field(
        2000.0,
        description="Requests per second all keys of one tenant may make together (per API"
        " process; 0 = no limit).",
    )
    rate_limit_auth_failures: float = Field(
        20.0,
        description="Failed key checks per second one client address may make before 429 (a"
        " failed key is also remembered for a few seconds: repeating it costs no lookup).",
    )
    router_log_process: bool = Field(
        True,
        description="The router writes its logs from a child process (keeps that work off the"
        " serving process's GIL); false = a thread of the router.",
    )
    eval_concurrency: int = Field(
        8,
        ge=1,
        le=256,
        description="Task-suite cases the evaluator keeps in flight on the engine at once (the"
        " engine batches them); 1 = one after another.",
    )
    eval_judge_url: str | None = Field(
        None, description="OpenAI-compatible base URL of an LLM judge; unset = no judging."
    )
    eval_judge_model: str = Field("", description="Model name the judge endpoint is asked for.")
    eval_judge_key: SecretStr | None = Field(None, description="Bearer key of the judge endpoint.")
    eval_judge_rubric: str = Field(
        "Score how helpful, correct and safe the answer is.",
        description="Default rubric of judge suites (a suite's own rubric wins).",
    )
    embedding_model: str = Field(
        "all-MiniLM-L6-v2", description="sentence-transformers model for prompt embeddings."
    )
    embedding_url: str | None = Field(
        None, description="OpenAI-compatible /v1/embeddings endpoint; unset = local model."
    )
    dedup_radius: float = Field(
        0.2,
        description="Cosine distance within which the embedder stores a prompt's near duplicates"
        " (snapshots with a higher dedup threshold probe the index instead).",
    )
    dedup_neighbours: int = Field(
        10, description="Most near duplicates the embedder stores per prompt (k)."
    )

    @field_validator("engine_urls")
    @classmethod
    def _engine_urls_parse(cls, value: str) -> str:
        parse_engine_urls(value)  # a readable ValueError at startup
        return value

    @property
    def embedded(self) -> bool:
        """True when cft runs its own PostgreSQL under CFT_HOME."""
        return not self.database_url

    @property
    def engine_url_list(self) -> list[str]:
        """CFT_ENGINE_URLS as a list of entries (`KIND+URL` or a bare vLLM URL)."""
        return [u.strip() for u in self.engine_urls.split(",") if u.strip()]

    @property
    def served_base_models(self) -> frozenset[str]:
        """The base model names routes may use (CFT_BASE_MODELS, else CFT_BASE_MODEL)."""
        names = {n.strip() for n in self.base_models.split(",") if n.strip()}
        return frozenset(names or {self.base_model})

    @property
    def artefact_path(self) -> Path:
        """Root of the local artefact store."""
        return (self.artefact_dir or self.home / "artefacts").resolve()

    @property
    def serving_path(self) -> Path:
        """Where verified adapters are placed for the engines."""
        return (self.serving_dir or self.home / "serving").resolve()

    @property
    def models_path(self) -> Path:
        """Where converted base models are cached."""
        return (self.home / "models").resolve()

    @property
    def pgdata(self) -> Path:
        """Data directory of the embedded PostgreSQL."""
        return (self.home / "pgdata").resolve()


@lru_cache
def get_settings() -> Settings:
    """Return the process-wide settings (read once)."""
    return Settings()
