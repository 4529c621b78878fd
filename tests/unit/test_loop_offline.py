"""The offline comparison's reference: the bare base's numbers from a candidate's summary."""

from __future__ import annotations

from typing import Any

from app.loop import offline


def test_the_base_reference_reads_numbers_only() -> None:
    """A judge suite's base entry carries the judge's name and rubric beside its score: they
    describe the run and are not scores (a string there made the comparison raise)."""
    summary: dict[str, Any] = {
        "results": {
            "base": {
                "judged": {"judge_score": 4.5, "n": 3, "_judge_model": "judge-1"},
                "checks": {"pass_rate": float("nan"), "n": 0},
                "heldout:s1": {"loss": 2.0, "answer_similarity": 0.25},
            }
        }
    }
    against, scores = offline._reference_scores(None, summary, None)  # type: ignore[arg-type]
    assert against == "the base model"
    assert scores == {
        ("judged", "judge_score"): 4.5,
        ("judged", "n"): 3.0,
        ("checks", "n"): 0.0,
        ("heldout:s1", "loss"): 2.0,
        ("heldout:s1", "answer_similarity"): 0.25,
    }
