"""Response bodies of the experiments API (columns documented in sql/functions/experiment_*.sql)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class ExperimentOut(BaseModel):
    """An experiment seen in traffic."""

    name: str
    tenant_id: int
    route: str | None
    n: int
    variants: list[str]
    adapters: list[str]
    first_at: datetime
    last_at: datetime
    running: bool


class ExperimentList(BaseModel):
    """Experiments of the caller's tenant, most recently active first."""

    data: list[ExperimentOut]


class ArmOut(BaseModel):
    """One arm (variant × adapter) over the window: obs.experiment_arms."""

    variant: str
    adapter_id: str
    route: str | None
    n: int
    n_error: int
    n_feedback: int
    feedback_mean: float | None
    feedback_se: float | None
    feedback_ci_low: float | None
    feedback_ci_high: float | None
    n_thumbs_up: int
    n_thumbs_down: int
    thumbs_up_rate: float | None
    thumbs_up_ci_low: float | None
    thumbs_up_ci_high: float | None
    n_regen: int
    regen_rate: float | None
    n_edited: int
    edit_rate: float | None
    ttft_avg: float | None
    ttft_p50: float | None
    ttft_p95: float | None
    tokens_out_avg: float | None
    tokens_out_sum: int | None
    first_at: datetime
    last_at: datetime


class ComparisonOut(BaseModel):
    """A canary arm against prod on one metric: obs.experiment_compare."""

    metric: str
    test: str
    higher_is_better: bool
    control_variant: str
    control_adapter: str
    canary_variant: str
    canary_adapter: str
    n_control: int | None
    n_canary: int | None
    control_value: float | None
    canary_value: float | None
    diff: float | None
    diff_ci_low: float | None
    diff_ci_high: float | None
    statistic: float | None
    df: float | None
    p_value: float | None
    alpha: float
    significant: bool
    canary_better: bool | None
    mde: float | None
    power: float
    n_required_per_arm: int | None
    n_more_needed: int | None


class VerdictOut(BaseModel):
    """The significance verdict of one canary on mean explicit feedback."""

    canary_variant: str
    canary_adapter: str
    control_adapter: str
    metric: str
    verdict: str
    summary: str
    diff: float | None
    diff_ci_low: float | None
    diff_ci_high: float | None
    p_value: float | None


class MetricsOut(BaseModel):
    """Arms, comparisons and verdicts of an experiment over [since, until)."""

    experiment: str
    since: datetime
    until: datetime
    alpha: float
    arms: list[ArmOut]
    comparisons: list[ComparisonOut]
    verdicts: list[VerdictOut]
