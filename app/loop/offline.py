"""Offline evidence for a candidate: does it beat what the route serves now, before any user?

The loop opens a canary only for a candidate that beats the route's current server (its prod
adapter, or the bare base model of a route with none) on held-out behaviour by the policy's
`min_offline_gain`: the pass rate of each of the route's task suites (a judge's 0-10 score
counts as a tenth), and `answer_similarity` on the held-out split of the candidate's snapshot
(its greedy answers against what users accepted or wrote). Likelihood (held-out loss) is shown
but decides nothing: it falls whenever the adapter imitates the held-out answers' wording, also
when its own answers do not change. Evaluations that could not compute are the platform's own
failure (`unscored`), never a judgement of the candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.adapters.schemas import Blocker
from app.core.db import Connection

# Behavioural metrics and how to bring each to [0, 1].
BEHAVIOUR: dict[str, float] = {"pass_rate": 1.0, "answer_similarity": 1.0, "judge_score": 0.1}
# The settings sweep goes on to the next setting while a suite's pass rate, the one held-out
# number with an absolute meaning, is below this for the best candidate so far.
SWEEP_UNTIL_PASS_RATE = 0.9


@dataclass(frozen=True)
class OfflineGain:
    """The verdict and the numbers behind it."""

    ok: bool
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


def _finite(x: Any) -> float | None:
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


# Gate blockers that say the evaluation did not compute, not that the candidate is worse.
UNSCORED_BLOCKERS = (
    "candidate score is not a finite number",
    "candidate has no result for this required metric",
    "current score is not a finite number",
    "current adapter has no result for this required metric",
)


def _results(conn: Connection, adapter_id: str) -> dict[tuple[str, str], float | None]:
    """An adapter's results by trusted authors, per (suite, metric); None: not finite."""
    rows = conn.execute(
        # The counted result is a trusted author's whenever one has written any.
        "SELECT suite_id, metric, score FROM train.eval_result_counted"
        " WHERE adapter_id = %s AND author_role = ANY (train.default_trusted_authors())",
        (adapter_id,),
    ).fetchall()
    return {(r["suite_id"], r["metric"]): _finite(r["score"]) for r in rows}


def unscored(conn: Connection, adapter_id: str, blockers: list[Blocker]) -> list[str]:
    """What the evaluator could not compute for the candidate (a NaN where there were no
    examples, a crash mid-way), as suite/metric names, from its results and the gate's
    blockers; empty when the evaluation is whole."""
    scored = (*BEHAVIOUR, "loss", "preference_accuracy")
    bad = [
        f"{suite}/{metric}"
        for (suite, metric), score in _results(conn, adapter_id).items()
        if metric in scored and score is None
    ]
    for b in blockers:
        if b.reason.startswith(UNSCORED_BLOCKERS):
            bad.append(f"{b.suite_id}/{b.metric}: {b.reason}")
    return sorted(set(bad))


def _reference_scores(
    conn: Connection, summary: dict[str, Any], current: str | None
) -> tuple[str, dict[tuple[str, str], float]]:
    """What the route serves now and its scores per (suite, metric)."""
    if current is None:
        base = (summary.get("results") or {}).get("base") or {}
        scores = {
            (suite, metric): v
            for suite, metrics in base.items()
            for metric, score in (metrics or {}).items()
            # Numbers only: "_judge_model" and the like describe the run, and n is a count.
            if not metric.startswith("_")
            and isinstance(score, int | float)
            and (v := _finite(score)) is not None
        }
        return "the base model", scores
    found = _results(conn, current)
    return f"prod {current}", {k: v for k, v in found.items() if v is not None}


def offline_gain(
    conn: Connection, *, adapter_id: str, current: str | None, margin: float
) -> OfflineGain:
    """Whether adapter_id beats current (None: the base model) by margin on held-out
    behaviour, with no behavioural metric worse by more than margin."""
    row = conn.execute(
        "SELECT eval_summary FROM serve.adapter WHERE id = %s", (adapter_id,)
    ).fetchone()
    summary: dict[str, Any] = (row or {}).get("eval_summary") or {}
    against, ref = _reference_scores(conn, summary, current)
    compared: list[dict[str, Any]] = []
    for (suite, metric), c in sorted(_results(conn, adapter_id).items()):
        scale = BEHAVIOUR.get(metric)
        r = ref.get((suite, metric))
        if scale is None or c is None or r is None:
            continue
        compared.append(
            {
                "suite": suite,
                "metric": metric,
                "candidate": c * scale,
                "reference": r * scale,
                "gain": (c - r) * scale,
            }
        )
    numbers = {"against": against, "margin": margin, "compared": compared}
    if not compared:
        return OfflineGain(
            False, f"nothing to compare with {against} on held-out behaviour", numbers
        )
    best = max(compared, key=lambda x: x["gain"])
    worst = min(compared, key=lambda x: x["gain"])
    numbers |= {"best": best, "worst": worst}
    shown = f"{best['suite']}/{best['metric']} {best['reference']:.3f} -> {best['candidate']:.3f}"
    if worst["gain"] < -margin:
        return OfflineGain(
            False,
            f"worse than {against} on {worst['suite']}/{worst['metric']}"
            f" ({worst['reference']:.3f} -> {worst['candidate']:.3f})",
            numbers,
        )
    if best["gain"] < margin:
        return OfflineGain(
            False,
            f"no held-out gain over {against} of at least {margin:g} (best: {shown})",
            numbers,
        )
    return OfflineGain(True, f"beats {against} on held-out behaviour: {shown}", numbers)


def mean_gain(numbers: dict[str, Any]) -> float:
    """The mean held-out gain over the behaviours an offline comparison compared (the
    settings sweep keeps the setting with the highest)."""
    gains = [float(x["gain"]) for x in numbers.get("compared") or []]
    return sum(gains) / len(gains) if gains else float("-inf")


def unfinished(numbers: dict[str, Any]) -> bool:
    """Whether a candidate with a held-out gain still passes a suite under
    SWEEP_UNTIL_PASS_RATE: worth training the next setting too. Without a suite there is no
    absolute yardstick (a similarity to users' answers never reaches 1), and the first setting
    with a gain is kept."""
    return any(
        x["metric"] == "pass_rate" and float(x["candidate"]) < SWEEP_UNTIL_PASS_RATE
        for x in numbers.get("compared") or []
    )
