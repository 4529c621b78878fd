"""Request and response bodies of the loop's REST API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.datasets.methods import Method
from app.training.methods import Hyperparameters

# Durations: seconds, or ISO 8601 (e.g. "PT1H", "P3D").


class LoopPolicyIn(BaseModel):
    """A route's loop policy. Every field is optional: a field left out takes its default
    (docs/loop.md), so `{"enabled": true}` turns the loop on with the defaults."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = Field(None, description="Default false.")
    paused: bool | None = Field(None, description="Hold new cycles. Default false.")
    paused_reason: str | None = None
    method: Method | None = Field(None, description="Pin a method; null: chosen by the signal.")
    min_new_examples: int | None = Field(None, description="Volume trigger. Default 40.")
    min_interval: timedelta | None = Field(None, description="At most one cycle per. Default 1 h.")
    max_interval: timedelta | None = Field(
        None, description="Schedule: at least every. Default off."
    )
    decline_enabled: bool | None = None
    decline_alpha: float | None = None
    decline_window: timedelta | None = None
    decline_min_n: int | None = None
    drift_enabled: bool | None = None
    drift_distance: float | None = None
    drift_share: float | None = None
    drift_sample: int | None = None
    drift_min_n: int | None = None
    max_cycles_per_day: int | None = None
    max_concurrent_training: int | None = None
    cooldown_after_reject: timedelta | None = None
    canary_pct: float | None = Field(None, description="Default 10; at most max_canary_pct.")
    canary_max_users: int | None = None
    canary_max_duration: timedelta | None = None
    decision_metric: str | None = None
    decision_alpha: float | None = None
    decision_min_n: int | None = None
    watch_window: timedelta | None = None
    watch_alpha: float | None = None
    watch_min_n: int | None = None
    eval_timeout: timedelta | None = None
    memory_tight: bool | None = None
    min_offline_gain: float | None = Field(
        None,
        description="Held-out gain over what the route serves now a candidate needs before its"
        " canary (pass rate or answer similarity, 0-1). Default 0.05.",
    )
    hyperparameters: dict[str, Any] | None = Field(
        None, description="Overrides of the chosen hyperparameters (training-run keys)."
    )

    @field_validator("hyperparameters")
    @classmethod
    def _known_keys(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            Hyperparameters(**value)  # unknown keys and bad values are refused here
        return value


class ControlIn(BaseModel):
    """The global kill switch."""

    model_config = ConfigDict(extra="forbid")

    paused: bool
    reason: str | None = Field(None, max_length=1000, description="Required to stop.")


class TriggerOut(BaseModel):
    """One trigger's live value."""

    trigger: str
    fired: bool
    value: float | None
    threshold: float | None
    detail: dict[str, Any]
    line: str


class LimitOut(BaseModel):
    """One limit: blocking = it holds a new cycle back now."""

    limit_name: str
    blocking: bool
    value: float | None
    threshold: float | None
    forget_bypasses: bool
    line: str


class CycleOut(BaseModel):
    """A loop cycle (with its transitions when read alone)."""

    model_config = ConfigDict(extra="allow")

    id: int
    route: str
    state: str
    trigger: str
    method: str | None
    decision: str | None
    decision_reason: str | None
    waiting_for: str | None
    error: str | None
    events: list[dict[str, Any]] | None = None


class LoopStatusOut(BaseModel):
    """A route's loop: the policy, every trigger and limit now, the cycle in flight, history."""

    route: str
    policy: dict[str, Any]
    control: dict[str, Any]
    triggers: list[TriggerOut]
    limits: list[LimitOut]
    current_cycle: CycleOut | None
    cycles: list[CycleOut]
