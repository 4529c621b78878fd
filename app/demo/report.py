"""The demo's report, read from SQL: what the loop did, how long each state took, and how the
promoted adapter does with users and questions its training data never saw.

Sources: loop.cycle and loop.cycle_event (states, trigger, method, decision and its numbers),
loop.provenance(adapter) (snapshot, examples, source rows, evals), serve.adapter.eval_summary
(the base's scores, measured by the evaluator beside the candidate's), obs.inference_log (live
thumbs, first feedback, first call served by the promoted adapter). One read-only session.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.db import Connection, connect


def _rate(row: dict[str, Any] | None) -> dict[str, Any]:
    n = int(row["n"]) if row and row["n"] else 0
    up = int(row["up"]) if row and row["up"] else 0
    return {"n": n, "thumbs_up": up, "rate": (up / n) if n else None}


def _durations(cycle: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Seconds spent in each state, from the transitions (the cycle starts in 'triggered')."""
    out: list[dict[str, Any]] = []
    entered: datetime = cycle["created_at"]
    for e in events:
        if e["from_state"] is None or e["from_state"] == e["to_state"]:
            continue
        out.append({"state": e["from_state"], "seconds": (e["at"] - entered).total_seconds(),
                    "note": e["note"]})  # fmt: skip
        entered = e["at"]
    return out


def _flatten(scores: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for suite, metrics in (scores or {}).items():
        if isinstance(metrics, dict):
            for metric, value in metrics.items():
                if isinstance(value, int | float) and metric not in ("n", "passed"):
                    out[f"{suite}/{metric}"] = float(value)
    return out


def _live(conn: Connection, cyc: dict[str, Any], held: list[str]) -> dict[str, Any]:
    """Thumbs-up rates of rated rows: the base while it served alone, each canary arm, and the
    promoted adapter on held-out questions (held: their whole chats, as JSON) asked after its
    promotion."""
    tenant, route, adapter = cyc["tenant_id"], cyc["route"], cyc["adapter_id"]
    rated = (
        "count(*) FILTER (WHERE fb_explicit <> 0) AS n,"
        " count(*) FILTER (WHERE fb_explicit > 0) AS up"
    )
    base = conn.execute(
        f"SELECT {rated} FROM obs.inference_log l"
        " JOIN serve.route r ON r.tenant_id = l.tenant_id AND r.name = l.route"
        " WHERE l.tenant_id = %s AND l.route = %s AND l.adapter_id = r.base_model"
        " AND l.variant IS NULL AND l.created_at < coalesce(%s, now())",
        (tenant, route, cyc["canary_started_at"]),
    ).fetchone()
    arms = conn.execute(
        f"SELECT variant, adapter_id, {rated} FROM obs.inference_log"
        " WHERE tenant_id = %s AND route = %s AND variant IS NOT NULL AND created_at >= %s"
        " AND created_at < coalesce(%s, now()) GROUP BY 1, 2 ORDER BY 1",
        (tenant, route, cyc["canary_started_at"], cyc["promoted_at"]),
    ).fetchall() if cyc["canary_started_at"] else []  # fmt: skip
    out: dict[str, Any] = {
        "base_observe": _rate(base),
        "canary_arms": [{"variant": a["variant"], "adapter_id": a["adapter_id"]} | _rate(a)
                        for a in arms],
    }  # fmt: skip
    if cyc["promoted_at"] is None:
        return out
    after = conn.execute(
        f"SELECT {rated}, count(DISTINCT user_hash) AS users,"
        " count(DISTINCT messages) AS questions FROM obs.inference_log"
        " WHERE tenant_id = %s AND route = %s AND adapter_id = %s AND created_at >= %s"
        " AND messages = ANY(%s::jsonb[])",
        (tenant, route, adapter, cyc["promoted_at"], held),
    ).fetchone()
    # Held out: neither the question nor the user is in any source row of the snapshot.
    seen = conn.execute(
        "WITH src AS (SELECT l.user_hash, l.messages AS q"
        "  FROM train.dataset_example e JOIN obs.inference_log l ON l.id = ANY(e.log_ids)"
        "  WHERE e.snapshot_id = %s),"
        " held AS (SELECT DISTINCT user_hash FROM obs.inference_log"
        "  WHERE tenant_id = %s AND route = %s AND adapter_id = %s AND created_at >= %s"
        "  AND messages = ANY(%s::jsonb[]))"
        " SELECT (SELECT count(*) FROM src WHERE q = ANY(%s::jsonb[])) AS questions_in_training,"
        "  (SELECT count(*) FROM held WHERE user_hash IN (SELECT user_hash FROM src))"
        "   AS users_in_training",
        (cyc["snapshot_id"], tenant, route, adapter, cyc["promoted_at"], held, held),
    ).fetchone()
    assert after is not None and seen is not None
    out["held_out_after_promotion"] = _rate(after) | {
        "users": int(after["users"]), "questions": int(after["questions"]),
        "questions_in_training": int(seen["questions_in_training"]),
        "users_in_training": int(seen["users_in_training"]),
    }  # fmt: skip
    return out


def collect(
    db_url: str, *, tenant_id: int, route: str, held_out_chats: list[str]
) -> dict[str, Any]:
    """Everything the report prints, as plain data (JSON-ready but for datetimes).

    held_out_chats: the held-out questions' whole chats (JSON), as the users send them."""
    with connect(db_url, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = on")
        cyc = conn.execute(
            "SELECT * FROM loop.cycle WHERE tenant_id = %s AND route = %s ORDER BY id DESC LIMIT 1",
            (tenant_id, route),
        ).fetchone()
        traffic = conn.execute(
            "SELECT count(*) AS calls, count(feedback_at) AS with_feedback,"
            " min(feedback_at) AS first_feedback_at FROM obs.inference_log"
            " WHERE tenant_id = %s AND route = %s",
            (tenant_id, route),
        ).fetchone()
        assert traffic is not None
        out: dict[str, Any] = {"route": route, "traffic": dict(traffic), "cycle": None}
        if cyc is None:
            return out
        events = conn.execute(
            "SELECT from_state, to_state, at, note FROM loop.cycle_event WHERE cycle_id = %s"
            " ORDER BY id",
            (cyc["id"],),
        ).fetchall()
        out["cycle"] = {k: cyc[k] for k in (
            "id", "state", "trigger", "trigger_values", "method", "method_reason",
            "hyperparameters", "snapshot_id", "snapshot_counts", "n_train", "n_eval",
            "training_run_id", "adapter_id", "eval_scores", "blockers", "canary_pct",
            "canary_started_at", "experiment", "decision", "decision_code", "decision_reason",
            "promoted_at", "watch", "error", "settings_tried", "created_at",
            "finished_at")}  # fmt: skip
        out["durations"] = _durations(cyc, events)
        out["first_feedback_to_cycle_s"] = (
            (cyc["created_at"] - traffic["first_feedback_at"]).total_seconds()
            if traffic["first_feedback_at"] else None
        )  # fmt: skip
        adapter = cyc["adapter_id"]
        if adapter:
            prov = conn.execute(
                "SELECT step, count(*) AS n FROM loop.provenance(%s) GROUP BY step", (adapter,)
            ).fetchall()
            out["provenance_rows"] = {r["step"]: int(r["n"]) for r in prov}
            evals = conn.execute(
                "SELECT ref, detail->>'score' AS score FROM loop.provenance(%s)"
                " WHERE step = 'eval' ORDER BY ref",
                (adapter,),
            ).fetchall()
            out["eval_adapter"] = {r["ref"]: float(r["score"]) for r in evals}
            summary = conn.execute(
                "SELECT eval_summary->'results'->'base' AS base FROM serve.adapter WHERE id = %s",
                (adapter,),
            ).fetchone()
            out["eval_base"] = _flatten(summary["base"] if summary else None)
        out["live"] = _live(conn, cyc, held_out_chats)
        prod = conn.execute(
            "SELECT serve.current_prod(%s, %s) AS id", (tenant_id, route)
        ).fetchone()
        out["prod_now"] = prod["id"] if prod else None
        if cyc["promoted_at"] is not None:
            # The first call the promoted adapter served as prod (not as the canary's arm B).
            live = conn.execute(
                "SELECT min(created_at) AS at FROM obs.inference_log"
                " WHERE tenant_id = %s AND route = %s AND adapter_id = %s AND created_at >= %s"
                " AND variant IS DISTINCT FROM 'B'",
                (tenant_id, route, adapter, cyc["promoted_at"]),
            ).fetchone()
            out["first_live_call_at"] = live["at"] if live else None
            if live and live["at"] and traffic["first_feedback_at"]:
                out["feedback_to_live_s"] = (
                    live["at"] - traffic["first_feedback_at"]
                ).total_seconds()
    return out


def _pct(r: dict[str, Any]) -> str:
    return f"{r['rate']:.0%} ({r['thumbs_up']}/{r['n']} rated)" if r["rate"] is not None else "n/a"


def _scores(scores: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3f}" for k, v in sorted(scores.items())) or "none"


def format_report(r: dict[str, Any], calls: dict[str, int]) -> str:
    """The report as text."""
    t = r["traffic"]
    lines = [
        "",
        "== report (from SQL: loop.cycle, loop.cycle_event, loop.provenance, obs.inference_log)",
    ]
    lines.append(f"  calls logged: {t['calls']}, with feedback: {t['with_feedback']}")
    c = r["cycle"]
    if c is None:
        lines.append("  no loop cycle started")
        return "\n".join(lines)
    line = (c["trigger_values"] or {}).get("line")
    lines.append(f"  cycle {c['id']}: {c['state']}, started by the {c['trigger']} trigger"
                 + (f" ({line})" if line else ""))  # fmt: skip
    if r.get("first_feedback_to_cycle_s") is not None:
        lines.append(f"  first feedback -> cycle started: {r['first_feedback_to_cycle_s']:.1f} s")
    for d in r["durations"]:
        lines.append(
            f"  {d['seconds']:7.1f} s  {d['state']}" + (f"  ({d['note']})" if d["note"] else "")
        )
    lines.append(f"  method: {c['method']}: {c['method_reason']}")
    lines.append(f"  hyperparameters: {c['hyperparameters']}")
    lines.append(
        f"  dataset: snapshot {c['snapshot_id']}: {c['n_train']} train / {c['n_eval']} eval;"
        f" filters {c['snapshot_counts']}"
    )
    if r.get("provenance_rows"):
        lines.append(f"  provenance rows: {r['provenance_rows']}")
    lines.append(f"  eval {c['adapter_id']}: {_scores(r.get('eval_adapter') or {})}")
    lines.append(f"  eval base: {_scores(r.get('eval_base') or {})}")
    live = r["live"]
    lines.append(f"  live thumbs-up, base while it served alone: {_pct(live['base_observe'])}")
    for a in live["canary_arms"]:
        lines.append(f"  live thumbs-up, canary arm {a['variant']} {a['adapter_id']}: {_pct(a)}")
    lines.append(f"  decision: {c['decision']} ({c['decision_code']}): {c['decision_reason']}")
    h = live.get("held_out_after_promotion")
    if h:
        lines.append(
            f"  held out, after the promotion: {_pct(h)} from {h['users']} new users on"
            f" {h['questions']} questions (in the training data: {h['questions_in_training']}"
            f" questions, {h['users_in_training']} users)"
        )
        base = live["base_observe"]["rate"]
        if h["rate"] is not None and base is not None:
            lines.append(f"  held-out positive feedback: base {base:.0%} -> adapter {h['rate']:.0%}"
                         f" ({(h['rate'] - base) * 100:+.0f} points)")  # fmt: skip
    if c["promoted_at"]:
        lines.append(f"  promoted {c['adapter_id']} at {c['promoted_at']:%H:%M:%S};"
                     f" prod of {r['route']} now: {r['prod_now']}")  # fmt: skip
    if r.get("feedback_to_live_s") is not None:
        lines.append(
            f"  feedback-to-live: {r['feedback_to_live_s']:.0f} s (first feedback"
            f" {t['first_feedback_at']:%H:%M:%S} -> first call served by the promoted adapter"
            f" {r['first_live_call_at']:%H:%M:%S})"
        )
    lines.append("  the demo called: " + ", ".join(f"{k} x{v}" for k, v in calls.items()))
    return "\n".join(lines)
