"""Server-side SVG line charts (no JavaScript, nothing fetched at run time).

The x axis is time (datetime points, ticks as dates) or a number (a training step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from html import escape

X = datetime | float

PALETTE = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989")


@dataclass
class Series:
    """A named line, optionally with a band (low, high) around it."""

    label: str
    points: list[tuple[X, float]]
    band: list[tuple[X, float, float]] = field(default_factory=list)
    dashed: bool = False


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / (count - 1)
    return [lo + i * step for i in range(count)]


def _fmt(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _x(v: X) -> float:
    return v.timestamp() if isinstance(v, datetime) else float(v)


def line_chart(
    series: list[Series],
    *,
    title: str,
    chart_id: str,
    width: int = 640,
    height: int = 240,
    y_min: float | None = None,
    y_max: float | None = None,
    x_label: str | None = None,
) -> str:
    """An inline <svg> with one polyline per series and a translucent band for its interval."""
    left, right, top, bottom = 52, 12, 28, 44
    xs = [_x(p[0]) for s in series for p in s.points] + [_x(b[0]) for s in series for b in s.band]
    by_time = any(isinstance(p[0], datetime) for s in series for p in s.points)
    ys = [p[1] for s in series for p in s.points] + [
        v for s in series for b in s.band for v in (b[1], b[2])
    ]
    head = (
        f'<svg class="chart" id="{escape(chart_id)}" role="img" aria-label="{escape(title)}"'
        f' viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' data-series="{len(series)}" data-points="{sum(len(s.points) for s in series)}">'
        f'<text x="{left}" y="16" class="title">{escape(title)}</text>'
    )
    if not xs or not ys:
        return head + f'<text x="{left}" y="{height // 2}">no data</text></svg>'
    x0, x1 = min(xs), max(xs)
    lo = min(ys) if y_min is None else y_min
    hi = max(ys) if y_max is None else y_max
    if x1 == x0:
        x1 = x0 + 1
    if hi == lo:
        hi = lo + 1
    pw, ph = width - left - right, height - top - bottom

    def sx(t: X) -> float:
        return left + (_x(t) - x0) / (x1 - x0) * pw

    def sy(v: float) -> float:
        return top + (1 - (v - lo) / (hi - lo)) * ph

    parts = [head]
    for v in _ticks(lo, hi):
        y = sy(v)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_fmt(v)}</text>'
        )
    for k, t in enumerate(_ticks(x0, x1, 4)):
        x = left + (t - x0) / (x1 - x0) * pw
        label = datetime.fromtimestamp(t).strftime("%m-%d %H:%M") if by_time else f"{t:.0f}"
        anchor = ("start", "middle", "middle", "end")[k]
        parts.append(
            f'<text x="{x:.1f}" y="{height - 22}" text-anchor="{anchor}"'
            f' class="tick">{label}</text>'
        )
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        if s.band:
            upper = " ".join(f"{sx(t):.1f},{sy(h):.1f}" for t, _, h in s.band)
            lower = " ".join(f"{sx(t):.1f},{sy(lw):.1f}" for t, lw, _ in reversed(s.band))
            parts.append(
                f'<polygon class="band" points="{upper} {lower}" fill="{color}"'
                f' fill-opacity="0.15" stroke="none"/>'
            )
        pts = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in s.points)
        dash = ' stroke-dasharray="4 3"' if s.dashed else ""
        parts.append(
            f'<polyline class="line" data-label="{escape(s.label)}" points="{pts}" fill="none"'
            f' stroke="{color}" stroke-width="1.8"{dash}/>'
        )
        lx = left + 8 + i * 150
        parts.append(
            f'<rect x="{lx}" y="{height - 8}" width="10" height="3" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{height - 3}" class="legend">{escape(s.label)}</text>'
        )
    if x_label:
        parts.append(
            f'<text x="{width - right}" y="{height - 8}" text-anchor="end"'
            f' class="tick">{escape(x_label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
