"""Inline SVG horizontal bar charts for the HTML report (no scripts, no external references).

One ``<rect class="bar" data-op="...">`` per op, in the order given, with the
op name on the left, the value on the right and a ``<title>`` tooltip.  Every
text is escaped.  The ``svg`` element carries no ``xmlns`` attribute: inside
an HTML document it is not needed, and the file then holds no URL at all.
"""

from __future__ import annotations

import math
from html import escape

#: SNR (dB) colour bands: below 10 dB red, below 20 orange, below 30 yellow, else green.
SNR_BANDS = ((10.0, "#d9534f"), (20.0, "#f0ad4e"), (30.0, "#e6d74f"), (math.inf, "#5cb85c"))
NEUTRAL = "#4a7bd0"

ROW = 15          # px per bar
LABEL = 300       # px for the op names
BAR = 560         # px for the longest bar
VALUE = 110       # px for the value text


def snr_colour(value: float) -> str:
    if value is None or math.isnan(value):
        return "#999999"
    for limit, colour in SNR_BANDS:
        if value < limit:
            return colour
    return SNR_BANDS[-1][1]


def _short(name: str, limit: int = 44) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "\u2026"


def _format(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if math.isinf(value):
        return ("inf" if value > 0 else "-inf") + unit
    if unit == " dB":
        return f"{value:.2f}{unit}"
    return f"{value:.6g}{unit}"


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 or 10 times a power of ten >= ``value`` (axis end)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if step * power >= value * (1 - 1e-12):
            return step * power
    return 10.0 * power


def bar_chart(items: list[tuple[str, float]], measure: str = "snr", types: dict | None = None,
              title: str = "") -> str:
    """An SVG chart of (op name, value) rows.

    ``measure`` 'snr' draws dB on a linear axis from 0 to the largest finite value (negative
    values get no bar, +inf a full bar marked 'inf') and colours by :data:`SNR_BANDS`; other
    measures ('cosine', 'mse', ...) draw value / largest finite value in one colour.
    """
    types = types or {}
    unit = " dB" if measure == "snr" else ""
    finite = [v for _, v in items if v is not None and not math.isnan(v) and not math.isinf(v)]
    top = nice_ceiling(max([v for v in finite if v > 0] + [1e-30]))
    height = ROW * len(items) + 30
    width = LABEL + BAR + VALUE
    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img" aria-label="{escape(title or measure)}" '
             'style="font-family: sans-serif; font-size: 11px; background: #fff">']
    # axis: 0 and the top value, with a few grid lines
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = LABEL + fraction * BAR
        parts.append(f'<line x1="{x:.1f}" y1="14" x2="{x:.1f}" y2="{height - 4}" stroke="#e3e3e3"/>')
        parts.append(f'<text x="{x:.1f}" y="10" text-anchor="middle" fill="#666">'
                     f'{escape(_format(fraction * top, unit))}</text>')
    for row, (name, value) in enumerate(items):
        y = 16 + row * ROW
        if value is None or math.isnan(value):
            length = 0.0
        elif math.isinf(value):
            length = BAR if value > 0 else 0.0
        else:
            length = max(0.0, min(1.0, value / top)) * BAR
        colour = snr_colour(value) if measure == "snr" else NEUTRAL
        kind = types.get(name, "")
        tip = f"{name} ({kind}): {_format(value, unit)}" if kind else f"{name}: {_format(value, unit)}"
        parts.append(f'<g class="row"><title>{escape(tip)}</title>'
                     f'<text x="{LABEL - 6}" y="{y + ROW - 4}" text-anchor="end" fill="#222">'
                     f'{escape(_short(name))}</text>'
                     f'<rect class="bar" data-op="{escape(name)}" x="{LABEL}" y="{y + 1}" '
                     f'width="{length:.1f}" height="{ROW - 3}" fill="{colour}"/>'
                     f'<text x="{LABEL + length + 4:.1f}" y="{y + ROW - 4}" fill="#333">'
                     f'{escape(_format(value, unit))}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def legend(measure: str = "snr") -> str:
    """The colour key of an SNR chart, as HTML."""
    if measure != "snr":
        return ""
    lower, items = "", []
    for limit, colour in SNR_BANDS:
        label = f"&lt; {limit:g} dB" if lower == "" else (f"{lower} \u2013 {limit:g} dB" if math.isfinite(limit)
                                                          else f"\u2265 {lower} dB")
        items.append(f'<span class="key"><span class="swatch" style="background:{colour}"></span>{label}</span>')
        lower = f"{limit:g}"
    return '<p class="legend">' + " ".join(items) + "</p>"
