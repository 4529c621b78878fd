"""The LLM judge: a rubric prompt to an OpenAI-compatible endpoint and its 0-10 score, and the
judge's calibration against a suite's human-labelled cases (agreement computed in SQL)."""

from __future__ import annotations

import math
import re
from types import TracebackType
from typing import Any

import httpx
import psycopg

from app.core.config import Settings
from app.evals import service as evals
from app.evals.schemas import JudgeCalibrationOut
from workers.evaluator import scoring

_SCORE = re.compile(r"\d+(\.\d+)?")


def rubric_of(settings: Settings, suite: dict[str, Any]) -> str:
    """The rubric a suite is judged by: its own, or the configured default."""
    return str(suite.get("rubric") or settings.eval_judge_rubric)


def prompt(rubric: str, messages: list[dict[str, Any]], answer: str) -> list[dict[str, str]]:
    """The judge's chat request for one answer to one conversation."""
    conversation = "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages)
    return [
        {
            "role": "user",
            "content": f"Rubric: {rubric}\nConversation:\n{conversation}\nAnswer: {answer}\n"
            "Reply with a single integer score from 0 to 10.",
        }
    ]


def parse_score(reply: str) -> float | None:
    """The first number of the judge's reply, capped at 10; None if it holds none."""
    m = _SCORE.search(reply)
    return min(float(m.group()), 10.0) if m else None


class Judge:
    """A client of the configured judge endpoint (CFT_EVAL_JUDGE_URL / _MODEL / _KEY)."""

    def __init__(self, settings: Settings) -> None:
        if not settings.eval_judge_url:
            raise ValueError("no judge configured: set CFT_EVAL_JUDGE_URL and CFT_EVAL_JUDGE_MODEL")
        self.model = settings.eval_judge_model
        headers = {}
        if settings.eval_judge_key is not None:
            headers["Authorization"] = f"Bearer {settings.eval_judge_key.get_secret_value()}"
        self._client = httpx.Client(
            base_url=str(settings.eval_judge_url).rstrip("/"),
            timeout=settings.engine_timeout,
            headers=headers,
        )

    def __enter__(self) -> Judge:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client.close()

    def ask(self, rubric: str, messages: list[dict[str, Any]], answer: str) -> str:
        """The judge's reply on one answer (greedy, short)."""
        resp = self._client.post(
            "/v1/chat/completions",
            json={
                "model": self.model,
                "messages": prompt(rubric, messages, answer),
                "max_tokens": 8,
                "temperature": 0,
            },
        )
        resp.raise_for_status()
        return str(resp.json()["choices"][0]["message"]["content"] or "")


def judge_suite(
    settings: Settings,
    suite: dict[str, Any],
    cases: list[dict[str, Any]],
    answer: scoring.Answer,
) -> dict[str, Any]:
    """Mean judge score (0-10) of the answers; an unparsable verdict is NaN (fails closed)."""
    rubric = rubric_of(settings, suite)
    scores: list[float] = []
    answers = scoring.answer_cases(cases, answer)
    with Judge(settings) as judge:
        for case, text in zip(cases, answers, strict=True):
            score = parse_score(judge.ask(rubric, case["messages"], text))
            scores.append(math.nan if score is None else score)
    mean = sum(scores) / len(scores) if scores else math.nan
    return {
        "judge_score": mean,
        "n": len(scores),
        "_judge_model": settings.eval_judge_model,
        "_rubric_version": evals.rubric_version(rubric),
    }


def calibrate(
    conn: psycopg.Connection[Any], settings: Settings, suite: dict[str, Any]
) -> JudgeCalibrationOut:
    """Run the judge on the suite's calibration set and store its agreement with people."""
    cases = evals.calibration_cases(
        conn, tenant_id=int(suite["tenant_id"]), suite_id=str(suite["id"])
    )
    if not cases:
        raise ValueError(f"suite {suite['id']} has no calibration set")
    rubric = rubric_of(settings, suite)
    verdicts = []
    with Judge(settings) as judge:
        for case in cases:
            reply = judge.ask(rubric, case.messages, case.answer)
            verdicts.append({"case_id": case.id, "score": parse_score(reply), "reply": reply})
    return evals.record_calibration(
        conn,
        tenant_id=int(suite["tenant_id"]),
        suite_id=str(suite["id"]),
        judge_model=judge.model,
        rubric_version=evals.rubric_version(rubric),
        verdicts=verdicts,
    )


def ensure_calibrated(
    conn: psycopg.Connection[Any], settings: Settings, suite: dict[str, Any]
) -> JudgeCalibrationOut | None:
    """The judge's calibration on the suite for its rubric, run now if it has none (None: the
    suite has no calibration set)."""
    found = evals.get_calibration(
        conn,
        tenant_id=int(suite["tenant_id"]),
        suite_id=str(suite["id"]),
        judge_model=settings.eval_judge_model,
        rubric_version=evals.rubric_version(rubric_of(settings, suite)),
    )
    if found is not None:
        return found
    if not evals.calibration_cases(
        conn, tenant_id=int(suite["tenant_id"]), suite_id=str(suite["id"])
    ):
        return None
    return calibrate(conn, settings, suite)
