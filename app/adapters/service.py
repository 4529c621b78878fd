"""Adapter registry rules. The gate itself lives in the database (sql/serve/adapter_gate.sql);
this module only asks it and turns its refusals into domain errors."""

from __future__ import annotations

import math
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb

from app.adapters.schemas import (
    AdapterDetail,
    AdapterEventOut,
    AdapterOut,
    Blocker,
    EvalResultOut,
    PolicyRuleOut,
    PromotionCheck,
)
from app.core.db import Connection, as_key
from app.core.errors import BadRequest, Conflict, Forbidden, NotFound

ADAPTER_COLUMNS = (
    "id, tenant_id, route, base_model, base_revision, method, status, traffic_pct, sha256,"
    " size_bytes, promoted_at, previous_prod_id, tainted_at, created_at, updated_at,"
    " weights_uri, dataset_snapshot_id, training_run_id, eval_summary, source, import_detail"
)


def _finite(value: Any) -> float | None:
    """A JSON-safe number: NULL, NaN and infinities become None."""
    if value is None:
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _clean(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return row | {k: _finite(row[k]) for k in keys}


def _raise_gate(exc: psycopg.Error) -> None:
    """Map the database's refusal to a domain error (the message carries the reasons)."""
    message = exc.diag.message_primary or str(exc)
    if exc.diag.message_hint:
        message += f" ({exc.diag.message_hint})"
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        raise Forbidden(message) from exc
    if isinstance(exc, pg_errors.CheckViolation | pg_errors.UniqueViolation):
        code = exc.diag.constraint_name or "conflict"
        raise Conflict(message, code=code) from exc
    if isinstance(exc, pg_errors.InvalidParameterValue):
        raise BadRequest(message) from exc
    raise exc


def list_adapters(conn: Connection, *, route: str | None = None) -> list[AdapterOut]:
    """Adapters visible to the connection, newest first, optionally of one route."""
    rows = conn.execute(
        f"SELECT {ADAPTER_COLUMNS} FROM serve.adapter"
        " WHERE %(route)s::text IS NULL OR route = %(route)s ORDER BY created_at DESC, id",
        {"route": route},
    ).fetchall()
    return [_adapter(r) for r in rows]


def _adapter(row: dict[str, Any]) -> AdapterOut:
    return AdapterOut.model_validate(_clean(row, "traffic_pct"))


def get_adapter(conn: Connection, *, adapter_id: str) -> AdapterOut | None:
    """One adapter, or None."""
    row = conn.execute(
        f"SELECT {ADAPTER_COLUMNS} FROM serve.adapter WHERE id = %s", (adapter_id,)
    ).fetchone()
    return _adapter(row) if row else None


def get_adapter_or_raise(conn: Connection, *, adapter_id: str) -> AdapterOut:
    """One adapter, or NotFound."""
    row = get_adapter(conn, adapter_id=adapter_id)
    if row is None:
        raise NotFound(f"adapter {adapter_id!r} not found", code="adapter_not_found")
    return row


def get_detail_or_raise(conn: Connection, *, adapter_id: str) -> AdapterDetail:
    """One adapter with its eval results and its audit events."""
    row = get_adapter_or_raise(conn, adapter_id=adapter_id)
    results = conn.execute(
        "SELECT suite_id, metric, score, judge_model, judged_at, rubric_version, author_kind,"
        " author_role, author_key_id, author FROM train.eval_result_latest"
        " WHERE adapter_id = %s ORDER BY suite_id, metric, judged_at, id",
        (adapter_id,),
    ).fetchall()
    events = conn.execute(
        "SELECT id, op, old_status, new_status, old_traffic_pct, new_traffic_pct, actor,"
        " application_name, reason, override, detail, at FROM serve.adapter_event"
        " WHERE adapter_id = %s ORDER BY id",
        (adapter_id,),
    ).fetchall()
    return AdapterDetail(
        **dict(row),
        eval_results=[EvalResultOut.model_validate(_clean(r, "score")) for r in results],
        events=[
            AdapterEventOut.model_validate(_clean(e, "old_traffic_pct", "new_traffic_pct"))
            for e in events
        ],
    )


def current_prod(conn: Connection, *, tenant_id: int, route: str) -> str | None:
    """The id of the tenant's route's prod adapter, or None."""
    row = conn.execute(
        "SELECT id FROM serve.adapter WHERE tenant_id = %s AND route = %s AND status = 'prod'",
        (tenant_id, route),
    ).fetchone()
    return str(row["id"]) if row else None


def blockers(conn: Connection, *, candidate: str, current: str | None) -> list[Blocker]:
    """Why the gate would refuse candidate over current (empty = allowed)."""
    rows = conn.execute(
        "SELECT * FROM serve.promotion_blockers(%s, %s)", (candidate, current)
    ).fetchall()
    return [
        Blocker.model_validate(_clean(r, "candidate_score", "current_score", "threshold"))
        for r in rows
    ]


def check_promotion(conn: Connection, *, adapter_id: str) -> PromotionCheck:
    """The gate's verdict on promoting adapter_id over its route's prod now."""
    row = get_adapter_or_raise(conn, adapter_id=adapter_id)
    current = current_prod(conn, tenant_id=row.tenant_id, route=row.route)
    # For the prod itself the database answers "candidate and current are the same adapter".
    found = blockers(conn, candidate=adapter_id, current=current)
    return PromotionCheck(adapter_id=adapter_id, current=current, allowed=not found, blockers=found)


def annotate(conn: Connection, *, reason: str | None, actor: str | None) -> None:
    """Let the audit trigger record why, and which API key asked, for this transaction."""
    if reason:
        conn.execute("SELECT set_config('cft.reason', %s, true)", (reason,))
    if actor:
        conn.execute("SELECT set_config('application_name', %s, true)", (f"cft-api {actor}"[:63],))


def _set_status(
    conn: Connection, *, adapter_id: str, status: str, traffic_pct: float
) -> AdapterOut:
    try:
        with conn.transaction():  # a savepoint: a refusal leaves the request's transaction usable
            conn.execute(
                "UPDATE serve.adapter SET status = %s, traffic_pct = %s WHERE id = %s",
                (status, traffic_pct, adapter_id),
            )
    except psycopg.Error as exc:
        _raise_gate(exc)
    return get_adapter_or_raise(conn, adapter_id=adapter_id)


def start_canary(
    conn: Connection,
    *,
    adapter_id: str,
    traffic_pct: float,
    reason: str | None = None,
    actor: str | None = None,
) -> AdapterOut:
    """Serve adapter_id to traffic_pct % of its route's users (eval results required)."""
    row = get_adapter_or_raise(conn, adapter_id=adapter_id)
    if row.status not in ("candidate", "canary", "retired"):
        raise Conflict(
            f"adapter {adapter_id} is {row.status}: only a candidate, canary or retired"
            " adapter can become a canary",
            code="invalid_status",
        )
    annotate(conn, reason=reason, actor=actor)
    return _set_status(conn, adapter_id=adapter_id, status="canary", traffic_pct=traffic_pct)


def promote(
    conn: Connection, *, adapter_id: str, reason: str | None = None, actor: str | None = None
) -> AdapterOut:
    """Make adapter_id its route's prod; the database gate decides and retires the old prod."""
    row = get_adapter_or_raise(conn, adapter_id=adapter_id)
    if row.status == "prod":
        raise Conflict(f"adapter {adapter_id} is already prod", code="invalid_status")
    annotate(conn, reason=reason, actor=actor)
    return _set_status(conn, adapter_id=adapter_id, status="prod", traffic_pct=100)


def rollback(
    conn: Connection, *, adapter_id: str, reason: str, actor: str | None = None
) -> AdapterOut:
    """Retire prod adapter_id and restore the prod it replaced; returns the restored adapter."""
    row = get_adapter_or_raise(conn, adapter_id=adapter_id)
    if row.status != "prod":
        raise Conflict(
            f"adapter {adapter_id} is {row.status}, not prod: only a prod can be rolled back",
            code="invalid_status",
        )
    annotate(conn, reason=None, actor=actor)
    try:
        with conn.transaction():
            got = conn.execute(
                "SELECT serve.rollback(%s, %s, %s) AS id",
                (row.tenant_id, row.route, reason),
            ).fetchone()
    except psycopg.Error as exc:
        _raise_gate(exc)
    assert got is not None
    return get_adapter_or_raise(conn, adapter_id=got["id"])


def register_candidate(
    conn: Connection,
    *,
    adapter_id: str,
    tenant_id: int,
    route: str,
    base_model: str,
    base_revision: str | None,
    rank: int,
    alpha: int | None,
    target_modules: list[str],
    method: str,
    training_run_id: Any,
    dataset_snapshot_id: Any,
    weights_uri: str,
    sha256: str,
    size_bytes: int,
    eval_summary: dict[str, Any],
    source: str = "trained",
    import_detail: dict[str, Any] | None = None,
) -> None:
    """Register an adapter as a candidate of its route (NotFound: no such route): one cft
    trained (source 'trained') or one trained elsewhere (source 'imported', app/adapters/
    imports.py)."""
    try:
        conn.execute(
            "INSERT INTO serve.adapter (id, tenant_id, route, base_model, base_revision,"
            " rank, alpha, target_modules, method, training_run_id, dataset_snapshot_id,"
            " weights_uri, sha256, size_bytes, eval_summary, source, import_detail, status)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " 'candidate')",
            (
                adapter_id,
                tenant_id,
                route,
                base_model,
                base_revision,
                rank,
                alpha,
                Jsonb(target_modules),
                method,
                training_run_id,
                dataset_snapshot_id,
                weights_uri,
                sha256,
                size_bytes,
                Jsonb(eval_summary),
                source,
                Jsonb(import_detail) if import_detail is not None else None,
            ),
        )
    except pg_errors.ForeignKeyViolation as exc:
        raise NotFound(f"route {route!r} does not exist for tenant {tenant_id}") from exc


def counted_scores(conn: Connection, *, adapter_id: str) -> dict[str, float | None]:
    """The score that counts per "suite/metric" (train.eval_result_counted); None: not finite."""
    rows = conn.execute(
        "SELECT suite_id, metric, score FROM train.eval_result_counted WHERE adapter_id = %s",
        (adapter_id,),
    ).fetchall()
    return {f"{r['suite_id']}/{r['metric']}": _finite(r["score"]) for r in rows}


def record_eval_results(
    conn: Connection, *, adapter_id: str, results: list[dict[str, Any]], key_id: int
) -> list[EvalResultOut]:
    """Record scores of an adapter as key_id's; returns the newest result of each author.

    Results are facts: a score sent again for a suite/metric is a new result, and the newest of
    each author counts. The database makes the key the results' author (train.eval_result_author):
    whether they satisfy a required rule depends on the key's role and the rule's trusted_authors.
    """
    get_adapter_or_raise(conn, adapter_id=adapter_id)
    as_key(conn, key_id)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO train.eval_result"
            " (adapter_id, suite_id, metric, score, judge_model, rubric_version)"
            " VALUES (%(adapter_id)s, %(suite_id)s, %(metric)s, %(score)s, %(judge_model)s,"
            " %(rubric_version)s)",
            [{"rubric_version": None} | r | {"adapter_id": adapter_id} for r in results],
        )
    return get_detail_or_raise(conn, adapter_id=adapter_id).eval_results


def get_policy(
    conn: Connection, *, tenant_id: int, route: str | None = None
) -> list[PolicyRuleOut]:
    """The global rules and the tenant's rules of route (or of every route of the tenant)."""
    rows = conn.execute(
        "SELECT route, suite_id, metric, direction, tolerance, required, trusted_authors,"
        " min_judge_kappa FROM train.promotion_policy"
        " WHERE route IS NULL"
        "    OR (tenant_id = %(tenant)s AND (%(route)s::text IS NULL OR route = %(route)s))"
        " ORDER BY route NULLS FIRST, suite_id, metric",
        {"tenant": tenant_id, "route": route},
    ).fetchall()
    return [PolicyRuleOut.model_validate(_clean(r, "tolerance", "min_judge_kappa")) for r in rows]


def replace_policy(
    conn: Connection, *, tenant_id: int, route: str, rules: list[dict[str, Any]]
) -> None:
    """Replace a tenant's route's own rules (the global rules are managed in SQL by the
    operator)."""
    found = conn.execute(
        "SELECT 1 FROM serve.route WHERE tenant_id = %s AND name = %s", (tenant_id, route)
    ).fetchone()
    if found is None:
        raise NotFound(f"route {route!r} not found", code="route_not_found")
    conn.execute(
        "DELETE FROM train.promotion_policy WHERE tenant_id = %s AND route = %s",
        (tenant_id, route),
    )
    for rule in rules:
        # A field left out (None) takes the database's default (trusted authors, least kappa).
        given = rule | {"route": route, "tenant_id": tenant_id}
        row = {k: v for k, v in given.items() if v is not None}
        cols = ", ".join(row)
        vals = ", ".join(f"%({k})s" for k in row)
        conn.execute(f"INSERT INTO train.promotion_policy ({cols}) VALUES ({vals})", row)
