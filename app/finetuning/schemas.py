"""Request and response bodies of the OpenAI fine-tuning API, in OpenAI's shapes.

Every response model has exactly the fields of the `openai` SDK's type of the same name
(`openai.types.FileObject`, `openai.types.fine_tuning.FineTuningJob`, ...), so the SDKs parse
them as they parse OpenAI's; tests validate them against those types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Auto = Literal["auto"]
BatchSize = Auto | Annotated[int, Field(ge=1, le=256)]
Multiplier = Auto | Annotated[float, Field(gt=0, le=10)]
Epochs = Auto | Annotated[int, Field(ge=1, le=50)]
Beta = Auto | Annotated[float, Field(gt=0, le=2)]
JobStatus = Literal["validating_files", "queued", "running", "succeeded", "failed", "cancelled"]


class SupervisedHyperparameters(BaseModel):
    """A supervised job's settings; "auto" is what the autonomous loop would pick."""

    model_config = ConfigDict(extra="forbid")

    batch_size: BatchSize = Field("auto", description="Examples per optimizer step.")
    learning_rate_multiplier: Multiplier = Field(
        "auto", description="Scales the learning rate the loop's rule picks for the set's size."
    )
    n_epochs: Epochs = Field(
        "auto", description="Passes over the training file; auto: the loop's training length."
    )


class DpoHyperparameters(SupervisedHyperparameters):
    """A dpo job's settings."""

    beta: Beta = Field("auto", description="DPO's preference strength; auto: 0.1.")


class SupervisedMethod(BaseModel):
    """method.supervised."""

    model_config = ConfigDict(extra="forbid")

    hyperparameters: SupervisedHyperparameters | None = None


class DpoMethod(BaseModel):
    """method.dpo."""

    model_config = ConfigDict(extra="forbid")

    hyperparameters: DpoHyperparameters | None = None


class MethodIn(BaseModel):
    """The fine-tuning method: supervised (cft's sft) or dpo."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["supervised", "dpo", "reinforcement"]
    supervised: SupervisedMethod | None = None
    dpo: DpoMethod | None = None
    reinforcement: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_block(self) -> MethodIn:
        if self.type == "reinforcement":
            raise ValueError("reinforcement fine-tuning is not supported: use supervised or dpo")
        other = "dpo" if self.type == "supervised" else "supervised"
        if getattr(self, other) is not None or self.reinforcement is not None:
            raise ValueError(f"method.type is {self.type}: give method.{self.type} only")
        return self


class JobCreate(BaseModel):
    """POST /v1/fine_tuning/jobs."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        ...,
        min_length=1,
        max_length=256,
        description="A route of the tenant (GET /v1/models), or the base model of exactly one.",
    )
    training_file: str = Field(..., min_length=1, max_length=64)
    validation_file: str | None = Field(None, min_length=1, max_length=64)
    suffix: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="Up to 64 letters, digits, '_', '.' or '-', in the fine-tuned model's name.",
    )
    seed: int | None = Field(None, ge=0, le=2_147_483_647)
    hyperparameters: SupervisedHyperparameters | None = Field(
        None, description="Deprecated by OpenAI for method; supervised jobs only."
    )
    method: MethodIn | None = None
    integrations: list[Any] | None = Field(None, description="Not supported: leave it empty.")
    metadata: dict[str, str] | None = Field(None, description="Up to 16 string pairs.")

    @field_validator("integrations")
    @classmethod
    def _no_integrations(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("integrations (Weights and Biases) are not supported: leave it empty")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > 16:
            raise ValueError("at most 16 metadata pairs")
        for k, v in value.items():
            if not 1 <= len(k) <= 64 or len(v) > 512:
                raise ValueError("metadata keys are 1-64 characters, values at most 512")
        return value

    @model_validator(mode="after")
    def _hyperparameters_once(self) -> JobCreate:
        if self.hyperparameters is not None and self.method is not None:
            if self.method.type != "supervised":
                raise ValueError(
                    "hyperparameters (top level) are for supervised jobs: give"
                    " method.dpo.hyperparameters"
                )
            block = self.method.supervised
            if block is not None and block.hyperparameters is not None:
                raise ValueError(
                    "give hyperparameters once: in method.supervised.hyperparameters (the top"
                    " level is deprecated)"
                )
        return self

    @property
    def method_type(self) -> Literal["supervised", "dpo"]:
        """supervised unless method says dpo."""
        return "dpo" if self.method is not None and self.method.type == "dpo" else "supervised"

    def given_hyperparameters(self) -> SupervisedHyperparameters:
        """The hyperparameters the request set, wherever it set them ("auto" when none)."""
        if self.method is not None and self.method.type == "dpo":
            block = self.method.dpo
            return (block.hyperparameters if block else None) or DpoHyperparameters()
        sup = self.method.supervised if self.method is not None else None
        return (
            (sup.hyperparameters if sup else None)
            or self.hyperparameters
            or SupervisedHyperparameters()
        )


# -- responses ------------------------------------------------------------------------------


class FileObject(BaseModel):
    """An uploaded file (openai.types.FileObject)."""

    id: str
    bytes: int
    created_at: int
    filename: str
    object: Literal["file"] = "file"
    purpose: Literal["fine-tune"] = "fine-tune"
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of files."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


class FileDeleted(BaseModel):
    """DELETE /v1/files/{id} (openai.types.FileDeleted)."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool


class JobError(BaseModel):
    """Why a job failed."""

    code: str
    message: str
    param: str | None = None


class JobHyperparameters(BaseModel):
    """The resolved settings, as numbers."""

    batch_size: int | Auto | None = None
    learning_rate_multiplier: float | Auto | None = None
    n_epochs: int | Auto | None = None


class DpoJobHyperparameters(JobHyperparameters):
    """A dpo job's resolved settings."""

    beta: float | Auto | None = None


class SupervisedMethodOut(BaseModel):
    """method.supervised of a job."""

    hyperparameters: JobHyperparameters | None = None


class DpoMethodOut(BaseModel):
    """method.dpo of a job."""

    hyperparameters: DpoJobHyperparameters | None = None


class MethodOut(BaseModel):
    """A job's method."""

    type: Literal["supervised", "dpo"]
    dpo: DpoMethodOut | None = None
    reinforcement: None = None
    supervised: SupervisedMethodOut | None = None


class FineTuningJob(BaseModel):
    """A fine-tuning job (openai.types.fine_tuning.FineTuningJob)."""

    id: str
    created_at: int
    error: JobError | None
    fine_tuned_model: str | None
    finished_at: int | None
    hyperparameters: JobHyperparameters
    model: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    organization_id: str
    result_files: list[str]
    seed: int
    status: JobStatus
    trained_tokens: int | None
    training_file: str
    validation_file: str | None
    estimated_finish: int | None = None
    integrations: list[Any] | None = None
    metadata: dict[str, str] | None = None
    method: MethodOut | None = None


class JobList(BaseModel):
    """A page of jobs, newest first."""

    object: Literal["list"] = "list"
    data: list[FineTuningJob]
    has_more: bool


class JobEvent(BaseModel):
    """One event of a job (openai.types.fine_tuning.FineTuningJobEvent)."""

    id: str
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    data: dict[str, Any] | None = None
    type: Literal["message", "metrics"] | None = None


class JobEventList(BaseModel):
    """A page of events, newest first."""

    object: Literal["list"] = "list"
    data: list[JobEvent]
    has_more: bool


class CheckpointMetrics(BaseModel):
    """A checkpoint's numbers."""

    full_valid_loss: float | None = None
    full_valid_mean_token_accuracy: float | None = None
    step: float | None = None
    train_loss: float | None = None
    train_mean_token_accuracy: float | None = None
    valid_loss: float | None = None
    valid_mean_token_accuracy: float | None = None


class JobCheckpoint(BaseModel):
    """A job's checkpoint (openai.types.fine_tuning.jobs.FineTuningJobCheckpoint)."""

    id: str
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    step_number: int


class JobCheckpointList(BaseModel):
    """A job's checkpoints."""

    object: Literal["list"] = "list"
    data: list[JobCheckpoint]
    has_more: bool
    first_id: str | None
    last_id: str | None
