"""``report.html``: one self-contained, offline page about a quantized graph.

:func:`write_report` renders, from ``graph.metadata['quantization']`` and the
analyses handed to it:

* the settings (platform, every key of the QuantizationSetting);
* the dispatch summary (TARGET / FP32 / SOI counts, op types per label, the
  names of the FP32 and SOI ops, the pinned ops);
* the per-layer error: an inline SVG horizontal bar chart with one bar per
  analysed op, in graph order (graphwise SNR in dB, coloured by band), a
  worst-ten table, and the same for a layer-wise analysis when given;
* the stage comparison table (:func:`ppqlike.analysis.compare_stages`);
* what the passes did: every pass with its time and report dict, the
  accuracy passes (everything beyond the core pipeline: equalization, bias
  correction, AdaRound, mixed precision ...) listed first;
* the formatting steps and any ``extra`` facts (calibration data, export notes).

Self-contained: no script, no external stylesheet, image or font, no URL
(the inline ``<svg>`` has no ``xmlns``); styles sit in one ``<style>``
element.  Every text from the graph, the settings or the reports goes
through ``html.escape``.

How the rendering was checked (tests/test_report.py does the structural part
automatically; the visual part by hand, and automatically where chromium is
installed)::

    apt-get update && apt-get install -y chromium      # Debian package, as root
    chromium --headless --no-sandbox --disable-gpu --disable-background-networking \\
        --disable-component-update --disable-sync --no-first-run \\
        --user-data-dir=$(mktemp -d) --screenshot=/tmp/report.png \\
        --window-size=1280,2000 file:///path/to/report.html

then look at ``/tmp/report.png``: the title and summary cards at the top, the
settings and dispatch tables, the bar chart with op names on the left, one
coloured bar per op and its value on the right, the stage table and the pass
list — nothing overflowing, no broken glyphs, no missing-resource icons.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from html import escape
from typing import Any, Mapping

from ..core.ir import Graph
from ..io.files import atomic_write_bytes
from .svg import bar_chart, legend

#: The passes of the core pipeline (DESIGN.md §5); any other pass is an accuracy or user pass.
CORE_PASSES = ("refine", "fusion", "simplify", "placement", "parameter", "calibration", "alignment", "passive",
               "baking")

_STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1060px;
       color: #222; background: #fafafa; font-size: 14px; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 2px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; }
h3 { font-size: 14px; margin-bottom: 4px; }
.sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; min-width: 130px; }
.card b { display: block; font-size: 18px; } .card span { color: #666; font-size: 12px; }
table { border-collapse: collapse; background: #fff; margin: 6px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; font-size: 13px; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.names { font-family: monospace; font-size: 12px; word-break: break-all; }
.chartbox { background: #fff; border: 1px solid #ddd; padding: 6px; overflow-x: auto; }
.legend { font-size: 12px; color: #444; } .key { margin-right: 14px; white-space: nowrap; }
.swatch { display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: -1px; }
.note { color: #8a5a00; } .muted { color: #777; }
ul.kv { margin: 0; padding-left: 16px; } ul.kv li { margin: 0; }
.tag { background: #e8eefb; color: #2b4f9e; border-radius: 3px; padding: 0 5px; font-size: 11px; }
"""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _number(value: Any, digits: int = 6) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _e(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return _e(f"{value:.{digits}g}")
    return _e(value)


def render_value(value: Any, depth: int = 0, limit: int = 40) -> str:
    """Any report value as escaped HTML: dicts as nested lists, long lists shortened."""
    if isinstance(value, Mapping):
        if not value:
            return '<span class="muted">{}</span>'
        if depth >= 3:
            return f'<span class="names">{_e(json.dumps(value, default=str)[:400])}</span>'
        items = "".join(f"<li><b>{_e(k)}</b>: {render_value(v, depth + 1, limit)}</li>" for k, v in value.items())
        return f'<ul class="kv">{items}</ul>'
    if isinstance(value, (list, tuple, set)):
        values = list(value)
        if not values:
            return '<span class="muted">none</span>'
        if all(not isinstance(v, (Mapping, list, tuple)) for v in values):
            shown = ", ".join(_number(v) for v in values[:limit])
            more = f' <span class="muted">\u2026 and {len(values) - limit} more</span>' if len(values) > limit else ""
            return f'<span class="names">{shown}</span>{more}'
        items = "".join(f"<li>{render_value(v, depth + 1, limit)}</li>" for v in values[:limit])
        more = f"<li class=\"muted\">\u2026 and {len(values) - limit} more</li>" if len(values) > limit else ""
        return f'<ul class="kv">{items}{more}</ul>'
    return _number(value)


def _table(head: list[str], rows: list[list[str]]) -> str:
    """``rows`` hold HTML already escaped."""
    header = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in row)
                   + "</tr>" for row in rows)
    return f"<table><tr>{header}</tr>{body}</table>"


def _num_cell(value: Any, digits: int = 6) -> str:
    return f'<td class="num">{_number(value, digits)}</td>'


# ----------------------------------------------------------------- sections --
def _cards(meta: dict, analysis, stages, graph: Graph | None = None) -> str:
    counts = meta.get("dispatch", {}).get("counts", {})
    cards = [(meta.get("platform", "?"), "platform"),
             (f"{counts.get('TARGET', 0)} / {counts.get('FP32', 0)} / {counts.get('SOI', 0)}",
              "ops TARGET / FP32 / SOI")]
    if "seconds" in meta:
        cards.append((f"{meta['seconds']:.1f} s", "quantization time"))
    if analysis:
        name, value = worst_visible(analysis, graph)
        unit = " dB" if _measure(analysis) == "snr" else ""
        cards.append((f"{_number(value, 4)}{unit}", f"worst op as its consumers see it: {name}"))
    for row in (stages or {}).get("rows", []):
        if row.get("reference") == "fp32_onnx" and row.get("measured") in ("exported", "quantized") \
                and "sqnr" in row:
            count = f" ({stages.get('samples', '?')} samples)"
            cards.append((f"{_number(row['sqnr'], 4)} dB", f"output SQNR, FP32 vs {row['measured']}{count}"))
            if "top1_agreement" in row:
                cards.append((f"{row['top1_agreement']:.3f}",
                              f"top-1 agreement, FP32 vs {row['measured']}{count}"))
            break
    return '<div class="cards">' + "".join(f"<div class=\"card\"><b>{_e(v)}</b><span>{_e(k)}</span></div>"
                                           for v, k in cards) + "</div>"


def _measure(analysis) -> str:
    return getattr(analysis, "method", "snr")


def _fused_into_successor(graph: Graph | None, name: str) -> bool:
    """Whether op ``name``'s output grid belongs to the activation after it (OVERLAPPED output config): its
    own output is never what a consumer reads (a Clip after it removes what lies outside the range)."""
    operation = graph.operations.get(name) if graph is not None else None
    if operation is None or operation.config is None or not operation.config.output_quantization_config:
        return False
    first = operation.config.output_quantization_config[0]
    return first is not None and first.state.name == "OVERLAPPED"


def worst_visible(analysis, graph: Graph | None = None) -> tuple[str, float]:
    """The worst op by the error its consumers see: ops fused into the activation after them are judged by
    that activation's output (the headline points where a fix helps)."""
    if hasattr(analysis, "sorted_items"):
        ranked = analysis.sorted_items()
    else:
        larger_is_better = _measure(analysis) in ("snr", "cosine")
        ranked = sorted(((n, v) for n, v in analysis.items() if v is not None and not math.isnan(v)),
                        key=lambda item: item[1], reverse=not larger_is_better) or list(analysis.items())
    visible = [item for item in ranked if not _fused_into_successor(graph, item[0])]
    return (visible or ranked)[0]


def _settings(meta: dict) -> str:
    """The setting as it ran: where it said None (the platform's default) the value used is shown."""
    effective = meta.get("effective_setting") or {}
    defaults = set(effective.get("platform_defaults", []))
    setting = {k: (effective[k] if k in defaults and k in effective else v)
               for k, v in (meta.get("setting") or {}).items()}
    pairs = [(_e(k), render_value(v) + (' <span class="muted">(platform default)</span>' if k in defaults else ""))
             for k, v in setting.items()]
    half = (len(pairs) + 1) // 2
    rows = []
    for index in range(half):  # two key/value pairs per row: the setting has some 30 keys
        right = pairs[half + index] if half + index < len(pairs) else ("", "")
        rows.append([f"<b>{pairs[index][0]}</b>", pairs[index][1], f"<b>{right[0]}</b>", right[1]])
    recipe = meta.get("recipe") or {}
    recipe_line = (f'; recipe <b>{_e(recipe.get("recipe"))}</b> (set: '
                   f'{_e(", ".join(f"{k}={v}" for k, v in recipe.get("changed", {}).items()) or "nothing")})'
                   if recipe else "")
    source = (f'<p class="sub">platform {_e(meta.get("platform", "?"))}{recipe_line}; source model '
              f'<span class="names">{_e(meta.get("source") or "not recorded (given in memory)")}</span></p>')
    return "<h2>Settings</h2>" + source + _table(["key", "value", "key", "value"], rows)


def _dispatch(meta: dict) -> str:
    dispatch = meta.get("dispatch") or {}
    counts = dispatch.get("counts", {})
    types = dispatch.get("types", {})
    rows = []
    for label in ("TARGET", "FP32", "SOI"):
        per_type = ", ".join(f"{t} {n}" for t, n in sorted((types.get(label) or {}).items()))
        rows.append([f"<b>{_e(label)}</b>", _num_cell(counts.get(label, 0)), _e(per_type or "\u2013")])
    html = [f"<h2>Dispatch</h2><p class=\"sub\">dispatcher: {_e(dispatch.get('dispatcher', '?'))}</p>",
            _table(["label", "ops", "op types"], rows)]
    for label, what in (("FP32", "FP32 ops (run in float)"), ("SOI", "SOI ops (shape or index, never quantized)")):
        names = dispatch.get(label) or []
        html.append(f"<h3>{_e(what)}: {len(names)}</h3>"
                    + (f'<p class="names">{_e(", ".join(map(str, names)))}</p>' if names
                       else '<p class="muted">none</p>'))
    if dispatch.get("pinned"):
        html.append("<h3>Pinned by the dispatching table</h3>" + render_value(dispatch["pinned"]))
    return "".join(html)


def _error_section(analysis, heading: str, what: str, graph: Graph) -> str:
    if not analysis:
        return ""
    measure = _measure(analysis)
    types = getattr(analysis, "op_types", None) or {n: graph.operations[n].type
                                                    for n in analysis if n in graph.operations}
    items = list(analysis.items())
    stats = getattr(analysis, "stats", None)
    if stats and measure != "snr" and all("snr" in s for s in stats.values()):
        chart_items, chart_measure = [(n, stats[n]["snr"]) for n, _ in items], "snr"  # the chart is in dB
    else:
        chart_items, chart_measure = items, measure
    cost = ""
    if hasattr(analysis, "samples"):
        cost = (f" Measured on {analysis.samples} sample(s) in {analysis.batches} batch(es) "
                f"in {analysis.seconds:.1f} s.")
    unit = "SNR (dB, higher is better)" if chart_measure == "snr" else _e(chart_measure)
    html = [f"<h2>{_e(heading)}</h2><p class=\"sub\">{_e(what)}{_e(cost)} Chart: {unit}, "
            f"{len(chart_items)} ops in graph order.</p>", legend(chart_measure),
            f'<div class="chartbox">{bar_chart(chart_items, chart_measure, types, heading)}</div>']
    if hasattr(analysis, "sorted_items"):
        worst = analysis.sorted_items()[:10]
    else:
        worst = sorted(items, key=lambda i: i[1], reverse=measure == "mse")[:10]
    rows = []
    for name, value in worst:
        s = (stats or {}).get(name, {})
        rows.append([f'<span class="names">{_e(name)}</span>', _e(types.get(name, "")),
                     _num_cell(s.get("snr", value if measure == "snr" else None), 4),
                     _num_cell(s.get("cosine", value if measure == "cosine" else None)),
                     _num_cell(s.get("mse", value if measure == "mse" else None), 4)])
    html.append("<h3>Worst ten</h3>" + _table(["op", "type", "SNR dB", "cosine", "MSE"], rows))
    return "".join(html)


def _stages(stages: dict | None) -> str:
    if not stages:
        return ""
    rows = []
    for row in stages.get("rows", []):
        pair = f"{_e(row['reference'])} \u2192 {_e(row['measured'])}"
        if "error" in row:
            rows.append([pair, f'<span class="names">{_e(row["output"])}</span>',
                         f'<td colspan="5" class="note">{_e(row["error"])}</td>'])
            continue
        rows.append([pair, f'<span class="names">{_e(row["output"])}</span>', _num_cell(row.get("cosine"), 7),
                     _num_cell(row.get("euclidean"), 5), _num_cell(row.get("sqnr"), 4),
                     _num_cell(row.get("max_abs_diff"), 4), _num_cell(row.get("top1_agreement", "\u2013"), 4)])
    seconds = ", ".join(f"{k} {v:.2f} s" for k, v in stages.get("seconds", {}).items())
    html = ["<h2>Stage comparison</h2>",
            f"<p class=\"sub\">Graph outputs on {_e(stages.get('samples', '?'))} sample(s): FP32 ONNX in "
            "onnxruntime \u2192 IR in float (executor, configs dequantized) \u2192 quantized simulation "
            f"\u2192 exported model in onnxruntime (optimization level {_e(stages.get('ort_optimization', '?'))}"
            f"{_FUSED if stages.get('ort_optimization') != 'disable' else ''})."
            " Euclidean similarity = 1 \u2212 \u2016a\u2212b\u2016 / \u2016(a+b)/2\u2016 (TPU-MLIR); "
            f"SQNR = 10 log10(\u03a3a\u00b2 / \u03a3(a\u2212b)\u00b2) dB. Times: {_e(seconds)}.</p>",
            _table(["stages", "output", "cosine", "Euclidean sim.", "SQNR dB", "max |a\u2212b|", "top-1 agree"],
                   rows)]
    for stage, reason in (stages.get("skipped") or {}).items():
        html.append(f'<p class="note">stage {_e(stage)} skipped: {_e(reason)}</p>')
    return "".join(html)


_FUSED = ("; onnxruntime then fuses QuantizeLinear/DequantizeLinear into integer kernels, another arithmetic "
          "than the simulation's, so quantized \u2192 exported differs by a few quantization steps")


def _passes(meta: dict) -> str:
    passes = meta.get("passes") or []
    accuracy = [p for p in passes if p.get("name") not in CORE_PASSES]
    html = ["<h2>What the passes did</h2>"]
    if accuracy:
        html.append(f"<p class=\"sub\">Accuracy / user passes: {_e(', '.join(str(p.get('name')) for p in accuracy))}"
                    "</p>")
    else:
        html.append('<p class="sub">No accuracy pass ran (core pipeline only).</p>')
    rows = []
    for record in passes:  # in the order they ran
        tag = "" if record.get("name") in CORE_PASSES else ' <span class="tag">accuracy</span>'
        rows.append([f"<b>{_e(record.get('name'))}</b>{tag}", _num_cell(record.get("seconds"), 4),
                     render_value(record.get("report") or {})])
    html.append(_table(["pass", "seconds", "report"], rows) if rows else '<p class="muted">no pass records</p>')
    if meta.get("formatting"):
        html.append("<h3>Formatting</h3>" + render_value(meta["formatting"]))
    return "".join(html)


def render_report(graph: Graph, analysis=None, stages: dict | None = None, extra: dict | None = None,
                  layerwise=None, title: str | None = None) -> str:
    """The report as one HTML string (see the module docstring)."""
    meta = graph.metadata.get("quantization") or {}
    source = meta.get("source")
    name = title or f"ppqlike quantization report \u2014 {os.path.basename(source) if source else graph.name}"
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    body = [f"<h1>{_e(name)}</h1>",
            f"<p class=\"sub\">{_e(len(graph.operations))} ops; generated {_e(stamp)} by ppqlike.</p>",
            _cards(meta, analysis, stages, graph), _settings(meta), _dispatch(meta),
            _error_section(analysis, "Per-layer error (graph-wise)",
                           "Each quantized op's output with the whole graph quantized, against the same graph in "
                           "float.", graph),
            _error_section(layerwise, "Per-layer sensitivity (layer-wise)",
                           "The graph outputs with only that op quantized, against the graph in float.", graph),
            _stages(stages), _passes(meta)]
    if not analysis:
        body.insert(5, '<h2>Per-layer error</h2><p class="muted">no analysis was run</p>')
    if extra:
        body.append("<h2>More</h2>" + _table(["key", "value"], [[_e(k), render_value(v)] for k, v in extra.items()]))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(name)}</title><style>{_STYLE}</style></head><body>"
            + "".join(body) + "</body></html>\n")


def write_report(path, graph: Graph, analysis=None, stages: dict | None = None, extra: dict | None = None,
                 layerwise=None, title: str | None = None) -> str:
    """Write ``report.html`` (atomically) and return its absolute path.

    ``analysis``: a graph-wise :class:`~ppqlike.analysis.ErrorAnalysis` (or any
    dict op name -> SNR dB); ``layerwise``: a layer-wise one; ``stages``: the
    result of :func:`~ppqlike.analysis.compare_stages`; ``extra``: more facts
    to list (key -> value).  ``path`` may be a folder: the file is then
    ``<path>/report.html``.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "report.html")
    text = render_report(graph, analysis, stages, extra, layerwise, title)
    atomic_write_bytes(path, text.encode("utf-8"))
    return os.path.abspath(path)
