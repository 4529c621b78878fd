"""Logged calls: obs.inference_log newest first, filtered by route, adapter, variant and feedback,
keyset-paginated on (created_at, id) and always bounded by a time window (now - window to
now + SKEW), so a page reads only the partitions of that window, through the
(tenant_id, route, created_at) or (tenant_id, adapter_id, created_at) index when filtered.
Prompts and answers are shown as escaped text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.core.errors import BadRequest
from app.dashboard.layout import PoolDep, login_page, message_page, page, reader, tenant
from app.dashboard.templating import url
from app.experiments import service as experiments

router = APIRouter(include_in_schema=False)

ACTIVE = "/dashboard/calls"
PAGE_SIZE = 50
WINDOWS = ["1h", "24h", "7d", "30d", "90d"]
VARIANTS = ["A", "B", "C", "D"]
DEFAULT_WINDOW = "24h"
# The window ends this far ahead of now (a caller's clock may run ahead of ours): the weekly
# partitions made in advance stay out of the plan.
SKEW = timedelta(hours=1)
# feedback filter -> its SQL condition
FEEDBACK = {
    "up": "l.fb_explicit > 0",
    "down": "l.fb_explicit < 0",
    "regenerated": "l.fb_regen",
    "edited": "l.fb_edited",
    "any": "(l.fb_explicit <> 0 OR l.fb_regen OR l.fb_edited)",
    "none": "(coalesce(l.fb_explicit, 0) = 0 AND NOT l.fb_regen AND NOT l.fb_edited)",
}
COLUMNS = (
    "l.id, l.request_id, l.created_at, l.route, l.adapter_id, l.variant, l.experiment,"
    " l.messages, l.completion, l.edited_completion, l.fb_explicit, l.fb_regen, l.fb_edited,"
    " l.ttft_ms, l.tokens_in, l.tokens_out, l.status"
)


def page_query(
    *,
    tenant_id: int,
    since: datetime,
    until: datetime,
    route: str | None = None,
    adapter: str | None = None,
    variant: str | None = None,
    feedback: str | None = None,
    before: tuple[datetime, int] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The SQL of one page (PAGE_SIZE + 1 rows, newest first) and its parameters."""
    where = ["l.tenant_id = %(tenant)s", "l.created_at >= %(since)s", "l.created_at < %(until)s"]
    args: dict[str, Any] = {"tenant": tenant_id, "since": since, "until": until}
    for name, col, value in (
        ("route", "l.route", route),
        ("adapter", "l.adapter_id", adapter),
        ("variant", "l.variant", variant),
    ):
        if value:
            where.append(f"{col} = %({name})s")
            args[name] = value
    if feedback in FEEDBACK:
        where.append(FEEDBACK[feedback])
    if before is not None:
        # The time bound alone lets each partition's index scan start at the cursor.
        where.append("l.created_at <= %(b_at)s AND (l.created_at, l.id) < (%(b_at)s, %(b_id)s)")
        args["b_at"], args["b_id"] = before
    sql = (
        f"SELECT {COLUMNS} FROM obs.inference_log l WHERE {' AND '.join(where)}"
        f" ORDER BY l.created_at DESC, l.id DESC LIMIT {PAGE_SIZE + 1}"
    )
    return sql, args


def _cursor(row: dict[str, Any]) -> str:
    return f"{row['created_at'].isoformat()}~{row['id']}"


def _parse_cursor(value: str) -> tuple[datetime, int]:
    try:
        at, log_id = value.rsplit("~", 1)
        ts = datetime.fromisoformat(at)
        return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)), int(log_id)
    except ValueError:
        raise BadRequest(
            "before is not a cursor this page made: follow the 'older' link", param="before"
        ) from None


def _prompt(messages: Any) -> str:
    if not isinstance(messages, list):
        return str(messages)
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    last = users[-1] if users else (messages[-1] if messages else {})
    content = last.get("content", "") if isinstance(last, dict) else last
    return content if isinstance(content, str) else str(content)


def _row(r: dict[str, Any]) -> dict[str, Any]:
    """One logged call as shown (prompt: the last user message)."""
    return r | {"prompt": _prompt(r["messages"])}


@router.get("/dashboard/calls")
def calls_page(
    request: Request,
    pool: PoolDep,
    route: str | None = None,
    adapter: str | None = None,
    variant: str | None = None,
    feedback: str | None = None,
    window: str = DEFAULT_WINDOW,
    before: str | None = None,
) -> Response:
    """A page of the tenant's logged calls, newest first, with filters and an 'older' link."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    try:
        delta = experiments.parse_window(window)
        cursor = _parse_cursor(before) if before else None
    except BadRequest as exc:
        return message_page(request, "logged calls", exc.message, active=ACTIVE, status=400)
    feedback = feedback if feedback in FEEDBACK else None
    filters = {"route": route, "adapter": adapter, "variant": variant, "feedback": feedback}
    with tenant(key, pool) as conn:
        now = datetime.now(UTC)
        sql, args = page_query(
            tenant_id=key.tenant_id, since=now - delta, until=now + SKEW, before=cursor, **filters
        )
        rows = conn.execute(sql, args).fetchall()
        routes = [r["name"] for r in conn.execute("SELECT name FROM serve.route ORDER BY name")]
        adapters = [
            r["id"] for r in conn.execute("SELECT id FROM serve.adapter ORDER BY created_at DESC")
        ]
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    pager = []
    if before:
        pager.append((url(ACTIVE, window=window, **filters), "« newest"))
    if more and rows:
        pager.append((url(ACTIVE, window=window, before=_cursor(rows[-1]), **filters), "older ›"))
    return page(
        request,
        "calls.html",
        title="logged calls",
        active=ACTIVE,
        window=window,
        windows=WINDOWS,
        filters=filters,
        feedbacks=list(FEEDBACK),
        variants=VARIANTS,
        routes=routes,
        adapters=adapters,
        calls=[_row(r) for r in rows],
        pager=pager,
    )
