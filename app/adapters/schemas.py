"""Request and response bodies of the adapters API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field


class EvalResultOut(BaseModel):
    """One score of an adapter on one metric of one suite."""

    suite_id: str
    metric: str
    score: float | None
    judge_model: str | None
    judged_at: datetime | None
    rubric_version: str | None = None
    author_kind: str = Field(description="evaluator, key (an API key) or sql (a SQL role).")
    author_role: str = Field(
        description="What the policy's trusted_authors names: evaluator, the key's role, or the"
        " SQL role (owner, release, app, ...)."
    )
    author_key_id: int | None = None
    author: str = Field(description="Who wrote the result, set by the database.")


class AdapterEventOut(BaseModel):
    """One audited change of an adapter (who, when, old, new, why)."""

    id: int
    op: str
    old_status: str | None
    new_status: str | None
    old_traffic_pct: float | None
    new_traffic_pct: float | None
    actor: str
    application_name: str | None
    reason: str | None
    override: bool
    detail: dict[str, Any] | None
    at: datetime


class AdapterOut(BaseModel):
    """An adapter in the serving registry."""

    id: str
    tenant_id: int
    route: str
    base_model: str
    base_revision: str | None
    method: str | None
    status: str
    traffic_pct: float
    sha256: str | None
    size_bytes: int | None
    promoted_at: datetime | None
    previous_prod_id: str | None
    tainted_at: datetime | None
    created_at: datetime
    updated_at: datetime
    weights_uri: str | None = None
    dataset_snapshot_id: UUID | None = None
    training_run_id: UUID | None = None
    eval_summary: dict[str, Any] | None = Field(
        None, description="Training metrics and the evaluator's summary (base and prod scores)."
    )
    source: Literal["trained", "imported"] = Field(
        "trained", description="trained: by cft's trainer; imported: trained elsewhere."
    )
    import_detail: dict[str, Any] | None = Field(
        None,
        description="An import's record: origin, imported_by, declared_base (what"
        " adapter_config.json named), peft_version and the caller's metadata.",
    )


class AdapterDetail(AdapterOut):
    """An adapter with its eval results and its audit trail."""

    eval_results: list[EvalResultOut]
    events: list[AdapterEventOut]


class AdapterList(BaseModel):
    """Adapters of the caller's tenant."""

    data: list[AdapterOut]


class Blocker(BaseModel):
    """One reason the gate refuses a promotion."""

    suite_id: str | None
    metric: str | None
    direction: str | None
    candidate_score: float | None
    current_score: float | None
    threshold: float | None
    reason: str
    candidate_author: str | None = None
    current_author: str | None = None


class PromotionCheck(BaseModel):
    """The gate's verdict on promoting an adapter over its route's prod now."""

    adapter_id: str
    current: str | None
    allowed: bool
    blockers: list[Blocker]


class CanaryIn(BaseModel):
    """Start or resize a canary."""

    traffic_pct: float = Field(gt=0, le=100, description="Share of the route's users, in %.")
    reason: str | None = Field(None, max_length=1000)


class PromoteIn(BaseModel):
    """Promote an adapter to prod (the database gate decides)."""

    reason: str | None = Field(None, max_length=1000)


class RollbackIn(BaseModel):
    """Retire a prod adapter and restore the one it replaced."""

    reason: str = Field("rollback via API", min_length=1, max_length=1000)


class EvalResultIn(BaseModel):
    """One score to record."""

    suite_id: str = Field(min_length=1, max_length=200)
    metric: str = Field(min_length=1, max_length=200)
    score: float | None = Field(description="NULL records a failed evaluation.")
    judge_model: str | None = Field(None, max_length=200)
    rubric_version: str | None = Field(
        None, max_length=200, description="A judge-scored result: the version of its rubric."
    )


class EvalResultsIn(BaseModel):
    """Scores of one adapter; a (suite, metric) already recorded is replaced."""

    results: list[EvalResultIn] = Field(min_length=1, max_length=1000)


class PolicyRule(BaseModel):
    """One metric the gate compares (or, with direction "ignore", leaves out)."""

    suite_id: str = Field(min_length=1, max_length=200)
    metric: str = Field(min_length=1, max_length=200)
    direction: Literal["higher", "lower", "ignore"] = Field(
        description="Which way is better; 'ignore': not compared (a suite/metric no rule names"
        " is compared by the default rule: higher is better, 2 % tolerance)."
    )
    tolerance: float = Field(0.02, ge=0, lt=1, description="Relative to |current score|.")
    required: bool = True
    trusted_authors: list[str] | None = Field(
        None,
        max_length=20,
        description="Authors whose results satisfy the rule (author_role: evaluator, release,"
        " owner, trainer, admin, ...); None: the database default (evaluator, owner).",
    )
    min_judge_kappa: float | None = Field(
        None,
        ge=-1,
        le=1,
        description="Least Cohen's kappa of a judge's calibration for a judge-scored result;"
        " None: the database default (0.6).",
    )


class PolicyRuleOut(PolicyRule):
    """A rule as stored; route None = global."""

    route: str | None


class PolicyOut(BaseModel):
    """The rules that apply to a route (its own and the global ones)."""

    data: list[PolicyRuleOut]


class PolicyIn(BaseModel):
    """Replace a route's own rules."""

    route: str = Field(min_length=1, max_length=128)
    rules: list[PolicyRule] = Field(max_length=200)
