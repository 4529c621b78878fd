"""Pydantic I/O of task suites and evaluation requests."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.evals.checks import CheckError, validate_case

CheckKind = Literal["exact", "contains", "regex", "json_schema", "max_length"]


class CaseIn(BaseModel):
    """One prompt and the check its answer must pass."""

    messages: list[dict[str, Any]] = Field(min_length=1, max_length=64)
    check: CheckKind
    expected: Any
    max_tokens: int = Field(32, ge=1, le=4096)

    @model_validator(mode="after")
    def _runnable(self) -> CaseIn:
        try:
            validate_case(self.check, self.expected)
        except CheckError as exc:
            raise ValueError(f"expected: {exc}") from None
        return self


class CalibrationCaseIn(BaseModel):
    """An answer people judged under the suite's rubric: the judge is calibrated on these."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    answer: str = Field(max_length=20000)
    label: bool = Field(description="People's verdict: the answer is acceptable.")


class SuiteIn(BaseModel):
    """A task suite of a route (route null = every route of the tenant)."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    name: str | None = None
    route: str | None = None
    kind: Literal["task", "judge"] = "task"
    rubric: str | None = None
    cases: list[CaseIn] = Field(min_length=1, max_length=1000)
    calibration: list[CalibrationCaseIn] = Field(
        [], max_length=1000, description="Kind judge: the human-labelled calibration set."
    )


class CaseOut(BaseModel):
    """A stored case."""

    id: int
    messages: list[dict[str, Any]]
    check_kind: str
    expected: Any
    max_tokens: int


class CalibrationCaseOut(BaseModel):
    """A stored calibration case."""

    id: int
    messages: list[dict[str, Any]]
    answer: str
    human_label: bool
    author: str


class JudgeCalibrationOut(BaseModel):
    """How well one judge (model + rubric version) agreed with people on the calibration set."""

    id: int
    judge_model: str
    rubric_version: str
    threshold: float
    n: int
    accuracy: float | None
    kappa: float | None = Field(description="Cohen's kappa; null when chance agreement is 1.")
    bias: float | None = Field(description="Judge positive rate minus human positive rate.")
    judge_positive_rate: float | None
    human_positive_rate: float | None
    author: str
    calibrated_at: datetime


class SuiteOut(BaseModel):
    """A stored suite with its cases, calibration set and judge calibrations (newest first)."""

    id: str
    name: str
    route: str | None
    kind: str
    rubric: str | None
    created_at: datetime
    cases: list[CaseOut] = []
    calibration: list[CalibrationCaseOut] = []
    calibrations: list[JudgeCalibrationOut] = []


class SuiteList(BaseModel):
    """Suites of the tenant."""

    data: list[SuiteOut]


class EvalRequestOut(BaseModel):
    """A queued (or running, or finished) evaluation."""

    id: int
    adapter_id: str
    status: str
    requested_by: str | None
    error: str | None
    created_at: datetime
    finished_at: datetime | None
