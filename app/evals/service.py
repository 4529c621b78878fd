"""Task suites, judge calibration and evaluation requests. A suite's id is unique within its
tenant, so every query names the tenant (RLS also scopes an API request to the caller's)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import psycopg
from psycopg import Connection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app.core.db import as_key, owning_tenant
from app.core.errors import BadRequest, Conflict, NotFound
from app.evals.schemas import CalibrationCaseOut, EvalRequestOut, JudgeCalibrationOut, SuiteOut

# A judge's verdict on a calibration case reads as "acceptable" at this score or above (0-10).
CALIBRATION_THRESHOLD = 5.0


def rubric_version(rubric: str) -> str:
    """The version of a rubric: its text's hash, so an edited rubric is a new, uncalibrated one."""
    return hashlib.sha256(rubric.encode()).hexdigest()[:12]


def create_suite(
    conn: Connection, *, tenant_id: int, suite: dict[str, Any], key_id: int | None = None
) -> SuiteOut:
    """Store a suite, its cases and its calibration set; a taken id is a Conflict."""
    if key_id is not None:
        as_key(conn, key_id)  # the calibration labels' author
    cur = conn.cursor(row_factory=dict_row)
    if suite.get("route") is not None:
        found = cur.execute(
            "SELECT 1 FROM serve.route WHERE tenant_id = %s AND name = %s",
            (tenant_id, suite["route"]),
        )
        if found.fetchone() is None:
            raise NotFound(f"route {suite['route']!r} not found", code="route_not_found")
    try:
        with conn.transaction():
            cur.execute(
                "INSERT INTO train.eval_suite (id, tenant_id, route, name, kind, rubric)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    suite["id"],
                    tenant_id,
                    suite.get("route"),
                    suite.get("name") or suite["id"],
                    suite["kind"],
                    suite.get("rubric"),
                ),
            )
            for case in suite["cases"]:
                cur.execute(
                    "INSERT INTO train.eval_case (tenant_id, suite_id, messages, check_kind,"
                    " expected, max_tokens) VALUES (%s, %s, %s, %s, %s, %s)",
                    (
                        tenant_id,
                        suite["id"],
                        Jsonb(case["messages"]),
                        case["check"],
                        Jsonb(case["expected"]),
                        case["max_tokens"],
                    ),
                )
            for case in suite.get("calibration") or []:
                cur.execute(
                    "INSERT INTO train.eval_calibration_case (tenant_id, suite_id, messages,"
                    " answer, human_label) VALUES (%s, %s, %s, %s, %s)",
                    (
                        tenant_id,
                        suite["id"],
                        Jsonb(case["messages"]),
                        case["answer"],
                        case["label"],
                    ),
                )
    except psycopg.errors.UniqueViolation as exc:
        raise Conflict(f"eval suite {suite['id']!r} exists", code="suite_exists") from exc
    except psycopg.errors.CheckViolation as exc:
        raise BadRequest(f"invalid suite: {exc.diag.message_primary}") from exc
    return get_suite_or_raise(conn, tenant_id=tenant_id, suite_id=suite["id"])


def get_suite_or_raise(conn: Connection, *, tenant_id: int, suite_id: str) -> SuiteOut:
    """One suite of the tenant with its cases, or NotFound."""
    cur = conn.cursor(row_factory=dict_row)
    key = (tenant_id, suite_id)
    row = cur.execute(
        "SELECT * FROM train.eval_suite WHERE tenant_id = %s AND id = %s", key
    ).fetchone()
    if row is None:
        raise NotFound(f"eval suite {suite_id!r} not found", code="suite_not_found")
    cases = cur.execute(
        "SELECT * FROM train.eval_case WHERE tenant_id = %s AND suite_id = %s ORDER BY id", key
    ).fetchall()
    calibrations = cur.execute(
        "SELECT * FROM train.judge_calibration WHERE tenant_id = %s AND suite_id = %s"
        " ORDER BY calibrated_at DESC, id DESC",
        key,
    ).fetchall()
    return SuiteOut.model_validate(
        row
        | {
            "cases": cases,
            "calibration": calibration_cases(conn, tenant_id=tenant_id, suite_id=suite_id),
            "calibrations": [_finite(c) for c in calibrations],
        }
    )


def suite_tenant(conn: Connection, *, suite_id: str, tenant: str | None = None) -> int:
    """The tenant of the suite suite_id (app.core.db.owning_tenant)."""
    return owning_tenant(
        conn,
        table="train.eval_suite",
        column="id",
        value=suite_id,
        tenant=tenant,
        missing=f"eval suite {suite_id!r} not found",
        shared=f"an eval suite {suite_id!r}",
        code="suite_not_found",
    )


_RATES = ("threshold", "accuracy", "kappa", "bias", "judge_positive_rate", "human_positive_rate")


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """Numeric columns as JSON-safe floats."""
    out = dict(row)
    for k in _RATES:
        v = out.get(k)
        out[k] = None if v is None or not math.isfinite(float(v)) else float(v)
    return out


def calibration_cases(
    conn: Connection, *, tenant_id: int, suite_id: str
) -> list[CalibrationCaseOut]:
    """A tenant's suite's human-labelled calibration set, oldest first."""
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute(
        "SELECT id, messages, answer, human_label, author FROM train.eval_calibration_case"
        " WHERE tenant_id = %s AND suite_id = %s ORDER BY id",
        (tenant_id, suite_id),
    ).fetchall()
    return [CalibrationCaseOut.model_validate(r) for r in rows]


def get_calibration(
    conn: Connection, *, tenant_id: int, suite_id: str, judge_model: str, rubric_version: str
) -> JudgeCalibrationOut | None:
    """The latest calibration of one judge and rubric on a tenant's suite, or None."""
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute(
        "SELECT * FROM train.judge_calibration WHERE tenant_id = %s AND suite_id = %s"
        " AND judge_model = %s AND rubric_version = %s"
        " ORDER BY calibrated_at DESC, id DESC LIMIT 1",
        (tenant_id, suite_id, judge_model, rubric_version),
    ).fetchone()
    return JudgeCalibrationOut.model_validate(_finite(row)) if row else None


def record_calibration(
    conn: Connection,
    *,
    tenant_id: int,
    suite_id: str,
    judge_model: str,
    rubric_version: str,
    verdicts: list[dict[str, Any]],
    threshold: float = CALIBRATION_THRESHOLD,
) -> JudgeCalibrationOut:
    """Store a judge's verdicts on a suite's whole calibration set; SQL computes the agreement.

    verdicts: {"case_id", "score" (None: unparsable), "reply"} per case. Only the schema owner
    (the evaluator) may record one.
    """
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute(
        "SELECT * FROM train.record_judge_calibration(%s, %s, %s, %s, %s, %s::numeric)",
        (tenant_id, suite_id, judge_model, rubric_version, Jsonb(verdicts), threshold),
    ).fetchone()
    assert row is not None
    return JudgeCalibrationOut.model_validate(_finite(row))


def list_suites(conn: Connection, *, tenant_id: int, route: str | None = None) -> list[SuiteOut]:
    """The tenant's suites (of one route: its own and the tenant-wide ones), with cases."""
    cur = conn.cursor(row_factory=dict_row)
    ids = cur.execute(
        "SELECT id FROM train.eval_suite WHERE tenant_id = %(t)s"
        " AND (%(r)s::text IS NULL OR route IS NULL OR route = %(r)s) ORDER BY id",
        {"t": tenant_id, "r": route},
    ).fetchall()
    return [get_suite_or_raise(conn, tenant_id=tenant_id, suite_id=r["id"]) for r in ids]


def request_evaluation(
    conn: Connection, *, tenant_id: int, adapter_id: str, actor: str
) -> EvalRequestOut:
    """Queue an evaluation of an adapter (an open one is returned as is); NOTIFY cft_eval."""
    cur = conn.cursor(row_factory=dict_row)
    found = cur.execute("SELECT 1 FROM serve.adapter WHERE id = %s", (adapter_id,)).fetchone()
    if found is None:
        raise NotFound(f"adapter {adapter_id!r} not found", code="adapter_not_found")
    row = cur.execute(
        "INSERT INTO train.eval_request (tenant_id, adapter_id, requested_by) VALUES (%s, %s, %s)"
        " ON CONFLICT (adapter_id) WHERE status IN ('queued', 'running') DO NOTHING RETURNING *",
        (tenant_id, adapter_id, actor),
    ).fetchone()
    if row is None:
        row = cur.execute(
            "SELECT * FROM train.eval_request WHERE adapter_id = %s"
            " AND status IN ('queued', 'running')",
            (adapter_id,),
        ).fetchone()
    assert row is not None
    return EvalRequestOut.model_validate(row)
