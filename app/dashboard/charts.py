"""Server-side SVG line charts (no JavaScript, nothing fetched at run time): the geometry here,
the markup in templates/_macros.html (`chart`).

The x axis is time (datetime points, ticks as dates) or a number (a training step)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

X = datetime | float

PALETTE = ("#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989")


@dataclass
class Series:
    """A named line, optionally with a band (low, high) around it."""

    label: str
    points: list[tuple[X, float]]
    band: list[tuple[X, float, float]] = field(default_factory=list)
    dashed: bool = False


@dataclass(frozen=True)
class YTick:
    """A horizontal grid line and its label."""

    y: str
    label_y: str
    label: str


@dataclass(frozen=True)
class XTick:
    """A label under the x axis."""

    x: str
    anchor: str
    label: str


@dataclass(frozen=True)
class Line:
    """One series as drawn: its polyline's points, its band's polygon, its legend's place."""

    label: str
    color: str
    points: str
    band: str
    dashed: bool
    legend_x: int


@dataclass(frozen=True)
class Chart:
    """What the `chart` macro draws."""

    chart_id: str
    title: str
    width: int
    height: int
    left: int
    right: int
    n_series: int
    n_points: int
    empty: bool
    y_ticks: list[YTick] = field(default_factory=list)
    x_ticks: list[XTick] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    x_label: str | None = None


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
) -> Chart:
    """One polyline per series and a translucent band for its interval, scaled to the box."""
    left, right, top, bottom = 52, 12, 28, 44
    xs = [_x(p[0]) for s in series for p in s.points] + [_x(b[0]) for s in series for b in s.band]
    by_time = any(isinstance(p[0], datetime) for s in series for p in s.points)
    ys = [p[1] for s in series for p in s.points] + [
        v for s in series for b in s.band for v in (b[1], b[2])
    ]
    empty = Chart(
        chart_id=chart_id,
        title=title,
        width=width,
        height=height,
        left=left,
        right=right,
        n_series=len(series),
        n_points=sum(len(s.points) for s in series),
        empty=True,
    )
    if not xs or not ys:
        return empty
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

    y_ticks = [YTick(f"{sy(v):.1f}", f"{sy(v) + 4:.1f}", _fmt(v)) for v in _ticks(lo, hi)]
    x_ticks = []
    for k, t in enumerate(_ticks(x0, x1, 4)):
        label = datetime.fromtimestamp(t).strftime("%m-%d %H:%M") if by_time else f"{t:.0f}"
        x = left + (t - x0) / (x1 - x0) * pw
        x_ticks.append(XTick(f"{x:.1f}", ("start", "middle", "middle", "end")[k], label))
    lines = []
    for i, s in enumerate(series):
        band = ""
        if s.band:
            upper = " ".join(f"{sx(t):.1f},{sy(h):.1f}" for t, _, h in s.band)
            lower = " ".join(f"{sx(t):.1f},{sy(lw):.1f}" for t, lw, _ in reversed(s.band))
            band = f"{upper} {lower}"
        lines.append(
            Line(
                label=s.label,
                color=PALETTE[i % len(PALETTE)],
                points=" ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in s.points),
                band=band,
                dashed=s.dashed,
                legend_x=left + 8 + i * 150,
            )
        )
    return replace(
        empty,
        empty=False,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        lines=lines,
        x_label=x_label,
    )
