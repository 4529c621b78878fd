"""The dashboard's one template engine: Jinja2 with autoescape on, templates in templates/.

Every page is a template extending base.html; values are escaped by the engine, so page code
passes data, never markup. The formatting helpers are the templates' filters and globals."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined

STATUS_COLORS = {
    "training": "#8c959f",
    "candidate": "#9a6700",
    "canary": "#1f6feb",
    "prod": "#1a7f37",
    "retired": "#57606a",
    "failed": "#d1242f",
    # training runs
    "queued": "#8c959f",
    "running": "#1f6feb",
    "succeeded": "#1a7f37",
    "cancelled": "#57606a",
    # loop cycle states
    "triggered": "#8c959f",
    "snapshot": "#8c959f",
    "evaluating": "#9a6700",
    "deciding": "#1f6feb",
    "watching": "#1f6feb",
    "promoted": "#1a7f37",
    "rejected": "#57606a",
    "rolled_back": "#d1242f",
}
OTHER_COLOR = "#57606a"

# (path, label): the nav of every page, in this order.
NAV = (
    ("/dashboard", "overview"),
    ("/dashboard/runs", "training runs"),
    ("/dashboard/evals", "evals"),
    ("/dashboard/snapshots", "snapshots"),
    ("/dashboard/calls", "logged calls"),
    ("/dashboard/lineage", "lineage"),
)


def num(v: Any, digits: int = 3) -> str:
    """A number for a table cell ("–" for none)."""
    if v is None:
        return "–"
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, float):
        if v != v:
            return "NaN"
        return f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
    return str(v)


def when(t: datetime | None) -> str:
    """A timestamp to the second ("–" for none)."""
    return f"{t:%Y-%m-%d %H:%M:%S}" if t else "–"


def seconds(a: datetime | None, b: datetime | None) -> str:
    """The duration between two timestamps, as 1 h 02 min / 3 min 05 s / 12.3 s."""
    if a is None or b is None:
        return "–"
    s = (b - a).total_seconds()
    if s >= 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    if s >= 60:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{s:.1f} s"


def url(path: str, *parts: Any, **query: Any) -> str:
    """path/part/... (each part URL-encoded) with a query string of the non-empty values."""
    href = path + "".join("/" + quote(str(p), safe="") for p in parts)
    q = {k: v for k, v in query.items() if v not in (None, "")}
    return href + ("?" + urlencode(q) if q else "")


def short(v: Any, n: int = 8) -> str:
    """The first n characters of a value's text (ids shown short)."""
    return str(v)[:n]


ENV = Environment(
    loader=PackageLoader("app.dashboard", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=False,
)
ENV.filters.update(num=num, when=when, short=short)
ENV.globals.update(
    url=url,
    seconds=seconds,
    NAV=NAV,
    STATUS_COLORS=STATUS_COLORS,
    OTHER_COLOR=OTHER_COLOR,
)


def render(template: str, **context: Any) -> str:
    """A template rendered with context (values escaped by the engine)."""
    return ENV.get_template(template).render(**context)
