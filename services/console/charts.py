"""Line charts as SVG text, rendered on the server (no JavaScript, no CDN): one series of (step, value) points.

Every point is a <circle> carrying data-step and data-value, so a page (and a test) can read what is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 24, 34


def _tick(value: float) -> str:
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.3g}"


def line_chart(title: str, points: Sequence[tuple[int, float]], *, css_class: str = "chart") -> str:
    """An SVG chart of `points` (sorted by step); a short note instead when there is nothing to draw."""
    label = escape(title)
    if not points:
        return f'<p class="empty-chart" data-chart="{label}">{label}: no data yet</p>'
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    if y0 == y1:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + (step - x0) / (x1 - x0) * plot_w

    def y(value: float) -> float:
        return TOP + (1 - (value - y0) / (y1 - y0)) * plot_h

    path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
    parts = [
        f'<svg class="{css_class}" data-chart="{label}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{label} by step" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{LEFT}" y="16" class="chart-title">{label}</text>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>',
    ]
    for value in (y0, (y0 + y1) / 2, y1):
        parts.append(
            f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" class="tick">{_tick(value)}</text>'
        )
    for step in sorted({x0, x1, steps[-1]} & set(steps)) or [steps[0]]:
        parts.append(f'<text x="{x(step):.1f}" y="{HEIGHT - 12}" text-anchor="middle" class="tick">{step}</text>')
    parts.append(f'<polyline points="{path}" class="series"/>')
    for s, v in points:
        parts.append(
            f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" class="point" data-step="{s}" data-value="{v:.6g}">'
            f"<title>step {s}: {v:.6g}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def bars(title: str, items: Sequence[tuple[str, float]], unit: str = "s") -> str:
    """Horizontal bars (e.g. seconds per phase of the latest step)."""
    label = escape(title)
    if not items:
        return f'<p class="empty-chart" data-chart="{label}">{label}: no data yet</p>'
    top = max(v for _, v in items) or 1.0
    row_h, name_w, bar_w = 22, 170, WIDTH - 170 - 80
    height = 24 + row_h * len(items)
    parts = [
        f'<svg class="chart bars" data-chart="{label}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{label}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="0" y="16" class="chart-title">{label}</text>',
    ]
    for i, (name, value) in enumerate(items):
        y = 24 + i * row_h
        width = max(value, 0) / top * bar_w
        parts.append(f'<text x="{name_w - 6}" y="{y + 14}" text-anchor="end" class="tick">{escape(name)}</text>')
        parts.append(f'<rect x="{name_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 6}" class="bar"/>')
        parts.append(f'<text x="{name_w + width + 4:.1f}" y="{y + 14}" class="tick">{value:.3g}{unit}</text>')
    parts.append("</svg>")
    return "".join(parts)
