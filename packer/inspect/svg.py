"""Small, dependency-free SVG charts (bars, histograms, lines) for the HTML report and the docs' figures.

Every string that reaches the SVG (labels, titles, units) goes through ``text``: class names and
keys are data, and a class named ``<script>`` must stay text. The charts are plain SVG 1.1
elements with inline attributes (no CSS classes, no scripts, no fonts to fetch), so a page or a
file holding one shows the same thing everywhere and offline.
"""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np

__all__ = ["text", "bar_chart", "histogram", "bin_counts", "line_chart", "BAR_COLOUR", "SERIES_COLOURS", "MAX_BARS"]

#: The one colour of bars and histogram bins.
BAR_COLOUR = "#3b6ea8"
#: Line colours, one per series, in order (colour-blind safe: Okabe-Ito).
SERIES_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")
#: Bars drawn by ``bar_chart`` at most (the caller says what was left out).
MAX_BARS = 60
_FONT = 'font-family="system-ui, sans-serif" font-size="12"'
_INVISIBLE = {0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x202A, 0x202B, 0x202C, 0x202D,
              0x202E, 0x2060, 0x2066, 0x2067, 0x2068, 0x2069, 0xFEFF}


def text(value: object, limit: int = 200) -> str:
    """``value`` as escaped HTML/SVG text on one line, cut at ``limit`` characters.

    Control characters, bidi overrides and other invisible characters are shown as ``\\uXXXX``
    (a key holding U+202E must not reorder the page), lone surrogates as escapes, and ``& < > " '``
    as entities, so the result is safe in element content and in quoted attributes alike.
    """
    raw = str(value)
    if len(raw) > limit:
        raw = raw[:limit] + "\u2026"
    shown = []
    for char in raw:
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0 or code in _INVISIBLE or 0xD800 <= code < 0xE000:
            shown.append(f"\\u{code:04x}")
        else:
            shown.append(char)
    return html.escape("".join(shown), quote=True)


def _number(value: float) -> str:
    """A value for an axis or a bar: integers with thousands separators, others to 3 figures."""
    if not math.isfinite(value):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.3g}"


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{text(title)}">'
            f'<rect width="{width}" height="{height}" fill="#ffffff"/>'
            f'<text x="8" y="18" {_FONT} font-weight="bold" fill="#222">{text(title)}</text>'
            + "".join(body) + "</svg>")


def bar_chart(rows: Sequence[tuple[object, float]], *, title: str, unit: str = "", width: int = 640) -> str:
    """Horizontal bars, one per ``(label, value)`` row, in the order given (at most ``MAX_BARS``).

    Args:
        rows: labels (any value, shown escaped) and non-negative values.
        title: the chart's title.
        unit: appended to each value (e.g. ``" samples"``).
        width: the SVG's width in pixels.

    Returns:
        One ``<svg>`` element as a string.
    """
    rows = list(rows)[:MAX_BARS]
    label_width = min(220, 12 + 7 * max((len(str(label)[:30]) for label, _ in rows), default=4))
    bar_height, top = 18, 30
    height = top + bar_height * max(len(rows), 1) + 10
    largest = max((float(value) for _, value in rows), default=0.0) or 1.0
    span = width - label_width - 110
    body = []
    if not rows:
        body.append(f'<text x="8" y="{top + 12}" {_FONT} fill="#666">nothing to show</text>')
    for i, (label, value) in enumerate(rows):
        y = top + i * bar_height
        length = max(1.0, span * float(value) / largest) if value else 0.0
        body.append(f'<text x="{label_width - 6}" y="{y + 13}" {_FONT} text-anchor="end" fill="#222">'
                    f"{text(label, 30)}</text>")
        body.append(f'<rect x="{label_width}" y="{y + 2}" width="{length:.1f}" height="{bar_height - 4}" '
                    f'fill="{BAR_COLOUR}"/>')
        body.append(f'<text x="{label_width + length + 4:.1f}" y="{y + 13}" {_FONT} fill="#222">'
                    f"{text(_number(float(value)) + unit)}</text>")
    return _svg(width, height, body, title)


def histogram(counts: Sequence[int], edges: Sequence[float], *, title: str, xlabel: str, width: int = 640,
              height: int = 220) -> str:
    """Histogram bars from counts already binned (``bin_counts``: memory stays flat on big columns).

    Args:
        counts: the number of values in each bin.
        edges: ``len(counts) + 1`` bin edges, ascending.
        title: the chart's title.
        xlabel: what the x axis measures (e.g. ``"bytes per sample"``).
        width, height: the SVG's size in pixels.

    Returns:
        One ``<svg>`` element as a string.
    """
    left, right, top, bottom = 56, 16, 30, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>',
            f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" {_FONT} text-anchor="middle" fill="#444">'
            f"{text(xlabel)}</text>"]
    counts = [int(c) for c in counts]
    if not counts or not any(counts):
        body.append(f'<text x="{left}" y="{top + 20}" {_FONT} fill="#666">no values</text>')
        return _svg(width, height, body, title)
    tallest = max(counts)
    bar_w = plot_w / len(counts)
    for i, count in enumerate(counts):
        if count:
            bar_h = max(1.0, plot_h * count / tallest)
            body.append(f'<rect x="{left + i * bar_w + 0.5:.1f}" y="{top + plot_h - bar_h:.1f}" '
                        f'width="{max(bar_w - 1, 0.5):.1f}" height="{bar_h:.1f}" fill="{BAR_COLOUR}">'
                        f"<title>{text(_number(float(edges[i])))} to {text(_number(float(edges[i + 1])))}: "
                        f"{count:,}</title></rect>")
    for x, value, anchor in ((left, edges[0], "start"), (left + plot_w, edges[-1], "end")):
        body.append(f'<text x="{x}" y="{top + plot_h + 14}" {_FONT} text-anchor="{anchor}" fill="#444">'
                    f"{text(_number(float(value)))}</text>")
    body.append(f'<text x="{left - 6}" y="{top + 10}" {_FONT} text-anchor="end" fill="#444">{tallest:,}</text>')
    body.append(f'<text x="{left - 6}" y="{top + plot_h}" {_FONT} text-anchor="end" fill="#444">0</text>')
    return _svg(width, height, body, title)


def bin_counts(values: np.ndarray, bins: int = 30, chunk: int = 1 << 22) -> tuple[list[int], list[float]]:
    """Equal-width bins over ``values`` (NaN and infinities left out), ``chunk`` values at a time.

    Returns:
        ``(counts, edges)`` for ``histogram``; both empty when there is no finite value.
    """
    low, high = math.inf, -math.inf
    for start in range(0, len(values), chunk):
        part = np.asarray(values[start:start + chunk], dtype=np.float64)
        part = part[np.isfinite(part)]
        if part.size:
            low, high = min(low, float(part.min())), max(high, float(part.max()))
    if low > high:
        return [], []
    if high == low:
        high = low + 1.0
    counts = np.zeros(bins, dtype=np.int64)
    for start in range(0, len(values), chunk):
        part = np.asarray(values[start:start + chunk], dtype=np.float64)
        counts += np.histogram(part[np.isfinite(part)], bins=bins, range=(low, high))[0]
    edges = np.linspace(low, high, bins + 1)
    return counts.tolist(), edges.tolist()


def line_chart(series: dict[str, Sequence[tuple[float, float]]], *, title: str, xlabel: str, ylabel: str,
               width: int = 640, height: int = 320) -> str:
    """Lines with markers, one per named series of ``(x, y)`` points, from y = 0, with a legend.

    Returns:
        One ``<svg>`` element as a string.
    """
    points = [p for values in series.values() for p in values]
    left, right, top, bottom = 70, 150, 30, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [float(x) for x, _ in points] or [0.0, 1.0]
    x_low, x_high = min(xs), max(xs)
    if x_high == x_low:
        x_high = x_low + 1.0
    y_high = max((float(y) for _, y in points), default=1.0) * 1.1 or 1.0

    def at(x: float, y: float) -> tuple[float, float]:
        return left + plot_w * (x - x_low) / (x_high - x_low), top + plot_h * (1 - y / y_high)

    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#888"/>',
            f'<text x="{left + plot_w / 2:.0f}" y="{height - 8}" {_FONT} text-anchor="middle" fill="#444">'
            f"{text(xlabel)}</text>",
            f'<text x="14" y="{top + plot_h / 2:.0f}" {_FONT} text-anchor="middle" fill="#444" '
            f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">{text(ylabel)}</text>']
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        value = y_high * fraction
        _, y = at(x_low, value)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eee"/>')
        body.append(f'<text x="{left - 6}" y="{y + 4:.1f}" {_FONT} text-anchor="end" fill="#444">'
                    f"{text(_number(round(value)))}</text>")
    for x in sorted(set(xs)):
        px, _ = at(x, 0)
        body.append(f'<text x="{px:.1f}" y="{top + plot_h + 16}" {_FONT} text-anchor="middle" fill="#444">'
                    f"{text(_number(x))}</text>")
    for n, (name, values) in enumerate(series.items()):
        colour = SERIES_COLOURS[n % len(SERIES_COLOURS)]
        placed = [at(float(x), float(y)) for x, y in sorted(values)]
        if placed:
            body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                        + " ".join(f"{x:.1f},{y:.1f}" for x, y in placed) + '"/>')
            body.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>' for x, y in placed)
        legend_y = top + 14 + 18 * n
        body.append(f'<rect x="{left + plot_w + 14}" y="{legend_y - 9}" width="12" height="12" fill="{colour}"/>')
        body.append(f'<text x="{left + plot_w + 32}" y="{legend_y + 1}" {_FONT} fill="#222">{text(name, 24)}</text>')
    return _svg(width, height, body, title)
