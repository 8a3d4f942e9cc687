"""The HTML pages: one workload's report (``report.html``) and the comparison of two profiles of one
workload (``opprof compare``).

Both pages are self-contained: the plotly.js bundle is inlined once in the page's head, each figure is a
``<div>`` with its data (``Figure.to_html(include_plotlyjs=False)``), the operator tables sort with a few
lines of inlined JavaScript, and nothing is fetched from the network. Every name that comes from the
profile (operators are C++ templates with ``<``, ``>``, ``&``) is HTML-escaped, also in the figures'
labels (plotly renders label text as HTML and decodes the entities).

The header facts, the clocks text and the layer-class sentence are report.py's (the Markdown report),
converted here from their Markdown inline markup.
"""

from __future__ import annotations

import html
import math
import os
import re
import textwrap
from pathlib import Path

import pandas as pd

from . import markdown as report_md, roofline_view
from ..errors import InputError
from ..results import ReportInputs

# Operators/modules drawn in a bar chart before the rest are summed into one bar.
TOP_BARS = 20
# A bar's category label: names cut to this many characters (the hover shows them whole, wrapped).
LABEL_CHARS = 60
HOVER_LINE_CHARS = 90
# compare: an operator's change of time per iteration within max(NOISE_SHARE of A's value, NOISE_FLOOR_MS)
# is tagged "same" (run-to-run noise), beyond it "slower"/"faster"; when both operators tables have the
# per-iteration min/max, also "same" while the two sides' per-iteration ranges [min, max] overlap.
NOISE_SHARE = 0.02
NOISE_FLOOR_MS = 0.001

# The operator table's counter columns: catalog name, label, scale (report_md.KEY_COUNTERS) plus the
# DRAM speed of light; each header also shows the ncu metric name the value comes from.
COUNTER_COLUMNS = (report_md.KEY_COUNTERS[0], report_md.KEY_COUNTERS[1], ("dram_sol", "DRAM SOL %", 1),
                   *report_md.KEY_COUNTERS[2:])

SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  var heads = table.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var ascending = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var numeric = th.dataset.type === "num";
      var key = function (row) {
        var cell = row.cells[col];
        var v = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent.trim();
        return numeric ? (v === "" ? NaN : parseFloat(v)) : v.toLowerCase();
      };
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (numeric) {
          if (isNaN(x) || isNaN(y)) { return isNaN(x) - isNaN(y); }  /* empty cells last */
          return ascending ? x - y : y - x;
        }
        return ascending ? x.localeCompare(y) : y.localeCompare(x);
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""

CSS = """
:root { --fg: #1f2937; --muted: #6b7280; --line: #e5e7eb; --accent: #2563eb; --bg: #f8fafc; --warn: #b45309; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); background: var(--bg); }
header.top { background: #0f172a; color: #f8fafc; padding: 22px 0 14px; }
header.top h1 { margin: 0 0 4px; font-size: 24px; font-weight: 600; }
header.top .sub { color: #cbd5e1; font-size: 14px; }
header.top nav { margin-top: 12px; display: flex; gap: 18px; flex-wrap: wrap; }
header.top nav a { color: #93c5fd; text-decoration: none; font-size: 14px; }
main, header.top > div { max-width: 1240px; margin: 0 auto; padding: 0 28px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 20px 24px; margin: 22px 0; }
h2 { font-size: 19px; margin: 0 0 12px; font-weight: 600; }
h3 { font-size: 15px; margin: 18px 0 8px; font-weight: 600; }
p { margin: 8px 0; }
.muted { color: var(--muted); font-size: 13px; }
.note { border-left: 4px solid var(--warn); background: #fffbeb; padding: 10px 14px; border-radius: 4px; margin: 10px 0; }
.kpis { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 12px; margin: 4px 0 14px; }
.kpi { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; background: #f9fafb; }
.kpi .v { font-size: 21px; font-weight: 600; }
.kpi .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
ul.facts { margin: 6px 0; padding-left: 20px; }
ul.facts li { margin: 3px 0; }
code { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f1f5f9;
       padding: 1px 4px; border-radius: 3px; }
.scroll { max-height: 72vh; overflow: auto; border: 1px solid var(--line); border-radius: 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; }
th, td { padding: 6px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #f1f5f9; font-weight: 600; position: sticky; top: 0; z-index: 2; white-space: nowrap; }
/* a scrolled table keeps its first column (the operator) in view: opaque, above the cells scrolling under it */
.scroll td:first-child, .scroll th:first-child { position: sticky; left: 0; z-index: 1; background: #fff;
                                                 box-shadow: inset -1px 0 0 var(--line); }
.scroll thead th:first-child { z-index: 3; background: #f1f5f9; }
.scroll tbody tr:nth-child(even) td:first-child { background: #fafafa; }
.scroll tbody tr:hover td:first-child { background: #eff6ff; }
th .metric { display: block; font: 10.5px ui-monospace, Menlo, Consolas, monospace; color: var(--muted);
             font-weight: 400; white-space: normal; word-break: break-all; }
th .metric.words { font-family: inherit; word-break: normal; min-width: 70px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafafa; }
tbody tr:hover { background: #eff6ff; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th::after { content: " \\2195"; color: #cbd5e1; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; color: var(--accent); }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; color: var(--accent); }
td.name { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; word-break: break-all;
          min-width: 260px; max-width: 420px; }
.tag { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; background: #e0e7ff; color: #3730a3; }
.tag.slower { background: #fee2e2; color: #991b1b; }
.tag.faster { background: #dcfce7; color: #166534; }
.tag.only { background: #fef3c7; color: #92400e; }
.fig { margin: 8px 0 4px; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 20px; }
@media (max-width: 900px) { .grid2 { grid-template-columns: 1fr; } }
footer { color: var(--muted); font-size: 12px; text-align: center; padding: 10px 0 30px; }
"""


# ------------------------------------------------------------------------------ small helpers


def esc(value) -> str:
    """HTML-escaped text of any value (None -> empty)."""
    return "" if value is None else html.escape(str(value), quote=True)


def inline(markdown: str) -> str:
    """One line of the Markdown report as HTML: escaped, ``**bold**``, ``*em*`` and ```code``` converted."""
    text = esc(markdown)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"(?<![\w*])\*([^*]+)\*(?![\w*])", r"<em>\1</em>", text)


def _bullets(lines: list[str]) -> str:
    items = [inline(line[2:] if line.startswith("- ") else line) for line in lines if line.strip()]
    return '<ul class="facts">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _num_cell(value, text: str | None = None) -> str:
    """A numeric cell: the exact value in ``data-v`` (sorting, tests), ``text`` shown."""
    if _missing(value):
        return '<td class="num" data-v=""></td>'
    return f'<td class="num" data-v="{esc(value)}">{esc(text if text is not None else value)}</td>'


def _fmt(value, digits: int = 1) -> str:
    return "" if _missing(value) else f"{value:,.{digits}f}"


def _table(headers: list[tuple[str, str]], rows: list[str], table_id: str, sortable: bool = True,
           scroll: bool = False) -> str:
    """``headers``: (inner HTML, ``num`` or ``text``); ``rows``: each row's ``<td>`` cells."""
    head = "".join(f'<th data-type="{kind}"' + (' class="num"' if kind == "num" else "") + f">{label}</th>"
                   for label, kind in headers)
    body = "".join(f"<tr>{cells}</tr>" for cells in rows)
    table = (f'<table id="{table_id}"' + (' class="sortable"' if sortable else "")
             + f"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return f'<div class="scroll">{table}</div>' if scroll else table


def _figure(fig, div_id: str) -> str:
    """A figure's div and data (no plotly.js: the page inlines it once)."""
    fig.update_layout(template="plotly_white", font={"family": "system-ui, Segoe UI, Roboto, Arial, sans-serif",
                                                     "size": 13},
                      hoverlabel={"font": {"family": "ui-monospace, Menlo, Consolas, monospace"}})
    return '<div class="fig">' + fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                                              config={"displaylogo": False, "responsive": True}) + "</div>"


def _page(title: str, subtitle: str, nav: list[tuple[str, str]], body: str) -> str:
    from plotly.offline import get_plotlyjs

    links = "".join(f'<a href="#{anchor}">{esc(label)}</a>' for anchor, label in nav)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
            f'<header class="top"><div><h1>{esc(title)}</h1><div class="sub">{subtitle}</div>'
            f"<nav>{links}</nav></div></header><main>{body}</main>"
            "<footer>Operator Profiler &middot; self-contained page: plotly.js inlined, no network access"
            f"</footer><script>{SORT_JS}</script></body></html>\n")


def _all(n: int, word: str) -> str:
    """``All 5 operators``, ``The one operator``, ``No operator found``."""
    if n == 1:
        return f"The one {word}"
    return f"All {report_md._plural(n, word)}" if n else f"No {word} found"


def _operators_title(names) -> str:
    """A heading over rows of operators: ``All 58 operators``, counting the ``(unattributed)`` row apart."""
    names = list(names)
    n = report_md.operator_count(names)
    unattributed = n < len(names)
    if not n:
        return "No operator found" + (": only unattributed kernels" if unattributed else "")
    return _all(n, "operator") + (" and the unattributed kernels" if unattributed else "")


def _name_cell(name: str, shown: str) -> str:
    """A kernel or operator name cell: ``shown`` (cut in the middle, :func:`report.short_names`), the whole name
    on hover (``title``) and in ``data-v`` (sorting, tests)."""
    return f'<td class="name" title="{esc(name)}" data-v="{esc(name)}">{esc(shown)}</td>'


def _kpis(items: list[tuple[str, str]]) -> str:
    return '<div class="kpis">' + "".join(
        f'<div class="kpi"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>' for k, v in items) + "</div>"


def _top_with_other(table: pd.DataFrame, name: str, value: str, top: int) -> pd.DataFrame:
    """The ``top`` rows by ``value`` and one ``(other N)`` row summing the rest."""
    ordered = table.sort_values(value, ascending=False)
    head, rest = ordered.head(top), ordered.iloc[top:]
    if len(rest):
        head = pd.concat([head, pd.DataFrame({name: [f"(other {len(rest)})"], value: [rest[value].sum()]})],
                         ignore_index=True)
    return head


def bar_labels(names: list[str], limit: int = LABEL_CHARS) -> list[str]:
    """Category labels of a bar chart, one per name: cut in the middle to ``limit`` characters as the tables cut
    names (:func:`report.short_names`: where names alike at both ends would merge, the part where they first
    differ is shown), and made unique, since plotly stacks every bar of one category label into one bar:
    `` #2``, `` #3``... only for labels still alike. Not escaped."""
    labels, used = [], set()
    for cut in report_md.short_names(names, limit):
        label, n = cut, 1
        while label in used:
            n += 1
            label = f"{cut} #{n}"
        used.add(label)
        labels.append(label)
    return labels


def hover_text(*lines: str, width: int = HOVER_LINE_CHARS) -> str:
    """A hover label: each line escaped and wrapped at ``width`` characters (``<br>``), so a long operator name
    does not run off the plot."""
    return "<br>".join(esc(part) for line in lines
                       for part in (textwrap.wrap(str(line), width, break_on_hyphens=False) or [""]))


def _hbar(labels: list[str], values: list[float], hover: list[str], x_title: str, color="#2563eb"):
    """Horizontal bars, one per name in ``labels`` (full names: cut and made unique here); ``hover`` raw text."""
    import plotly.graph_objects as go

    # Longest first from the top: plotly draws the first category at the bottom.
    fig = go.Figure(go.Bar(x=values[::-1], y=[esc(s) for s in bar_labels(labels)][::-1], orientation="h",
                           marker_color=color if isinstance(color, str) else color[::-1],
                           hovertext=[hover_text(h) for h in hover][::-1], hoverinfo="text"))
    fig.update_layout(height=max(260, 26 * len(labels) + 110), margin={"l": 10, "r": 30, "t": 30, "b": 50},
                      xaxis_title=x_title, yaxis={"automargin": True, "type": "category"}, bargap=0.25)
    return fig


def counter_metric_names() -> dict[str, str]:
    """ncu's spelling (first catalog name) of each counter column of the operator table."""
    from ..ncu.catalog import load_catalog

    catalog = load_catalog()
    names = {}
    for metric, _, _ in COUNTER_COLUMNS:
        candidates = catalog[metric].candidates()
        names[metric] = candidates[0] if candidates else metric
    return names


def latency_threshold() -> float:
    """The catalog's bottleneck threshold: both SOL figures below it -> latency-bound."""
    from ..ncu.catalog import load_catalog

    return float(load_catalog().bottleneck["latency_below_pct"])


def no_iteration_ranges(run: dict | None, coverage: dict) -> bool:
    """A trace captured elsewhere without iteration ranges: its times are totals over the whole trace."""
    return run is None and not coverage.get("iteration_time_ns")


def headline_time(coverage: dict, iterations: int, no_ranges: bool = False, median: bool = True) -> tuple[str, float]:
    """The headline kernel time (label, ns): with ``median`` and 2 or more measured iterations the median over
    coverage.json's ``iteration_time_ns`` (one noisy iteration does not move it), the whole trace's total without
    iteration ranges, else the total over the measured iterations / their number (the mean)."""
    spread = report_md.iteration_spread(coverage)
    if median and spread is not None:
        return "kernel time / iteration (median)", spread["median_ns"]
    if no_ranges:
        return "kernel time (whole trace)", coverage["kernel_time_ns"]
    return "kernel time / iteration" + (" (mean)" if iterations > 1 else ""), coverage["kernel_time_ns"] / iterations


def kernels_per_iteration(coverage: dict, iterations: int, no_ranges: bool = False) -> tuple[str, str]:
    """The kernel count beside the per-iteration headline, per iteration as well (label, value): coverage.json's
    ``kernel_count`` / measured iterations (``81``, ``40.5``), the whole trace's count without iteration ranges."""
    if no_ranges:
        return "kernels (whole trace)", f"{coverage['kernel_count']:,}"
    per = coverage["kernel_count"] / max(iterations, 1)
    return "kernels / iteration", f"{per:,.0f}" if per == int(per) else f"{per:,.1f}"


def warns(spread: dict | None) -> bool:
    """The iteration spread is a warning: skewed, and not only by the first measured iteration (the profiler's
    usual start-up, stated plainly)."""
    return bool(spread and spread["skewed"] and not spread["first_slowest"])


def no_kernels_note(coverage: dict, diagnostics: dict | None) -> str:
    """Why a profile has no kernels (the timeline reader's warning, e.g. a CUPTI range-profiler trace); empty
    when it has kernels."""
    if coverage["kernel_count"]:
        return ""
    reasons = report_md.no_kernel_warnings(diagnostics) or ["nothing ran inside the measured window"]
    return ('<div class="note" id="no-kernels-note"><strong>The trace holds no kernels</strong>, so there is no '
            f"operator, module or layer to show: {'; '.join(inline(r) for r in reasons)}</div>")


def _no_plot(what: str, div_id: str) -> str:
    return f'<p class="note" id="{div_id}-none">No {what} to plot.</p>'


# ------------------------------------------------------------------------------ report.html


def _header_section(workload: str, run: dict | None, coverage: dict, operators: pd.DataFrame,
                    diagnostics: dict | None, clocks: dict | None, counters_time: float | None,
                    replays: list[dict] | None) -> str:
    iterations = report_md.measured_iterations(run, coverage)
    lines = report_md.measurement_lines(run, coverage, diagnostics, clocks,
                                        per_iteration_medians="iteration_median_ns" in operators)
    tools = []
    if diagnostics and diagnostics.get("format") != "kineto" and diagnostics.get("product_version"):
        tools.append(f"Nsight Systems {diagnostics['product_version']} (timeline)")
    if replays:
        tools.append(f"Nsight Compute {report_md.ncu_versions(replays)} ({report_md._plural(len(replays), 'replay')}; "
                     f"{sum(float(r['wall_s']) for r in replays):.1f} s)")
    if run is not None:
        tools.insert(0, f"timeline: {run.get('timeline', 'torch')} (profiler {run.get('profiler', '?')})")
    if tools:
        lines.append("- tools: " + "; ".join(tools))
    if coverage.get("counters_coverage") is not None:
        share = f"{coverage['counters_coverage'] * 100:.1f}% of kernels"
        if counters_time is not None:
            share += f", {counters_time * 100:.1f}% of kernel time"
        lines.append(f"- hardware counters (ncu) for {share}")
    missing = [ln for ln in report_md.metric_lines(replays) if ln.startswith("- ")]
    if missing:
        lines.append(f"- {report_md._plural(len(missing), 'catalog metric')} not collected (missing counters, never "
                     "zeros): " + "; ".join(ln[2:] for ln in missing))
    counters = ("not collected" if coverage.get("counters_coverage") is None
                else f"{coverage['counters_coverage'] * 100:.1f}%")
    label, time_ns = headline_time(coverage, iterations, no_iteration_ranges(run, coverage))
    n_operators = report_md.operator_count(operators["operator"])  # the (unattributed) row is not one
    kpis = _kpis([
        (label, f"{time_ns / 1e6:.3f} ms"),
        kernels_per_iteration(coverage, iterations, no_iteration_ranges(run, coverage)),
        ("operators", f"{n_operators:,}" if n_operators else "none found"),
        ("attributed time", f"{coverage['coverage_time'] * 100:.1f}%"),
        ("kernels with counters", counters),
    ])
    kind = "note" if warns(report_md.iteration_spread(coverage)) else ""
    spread = "".join(f'<p class="{kind}" id="iteration-spread">{inline(line)}</p>'
                     for line in report_md._iteration_spread(coverage) if line)
    return (f'<section id="measurement"><h2>What was profiled</h2>{no_kernels_note(coverage, diagnostics)}{kpis}'
            f"{_bullets(lines)}{spread}</section>")


# the per-iteration median, and min and max in one column ("min – max", sorted by the max)
RANGE_HEADER = "min – max / iteration (ms)"
# the per-iteration interquartile range "p25 – p75" (sorted by its width)
IQR_HEADER = "p25 – p75 / iteration (ms)"


# the operator table's roofline columns: label, what the figure is, sort kind
WORK_HEADERS = (("GFLOP/s", "analytic FLOPs / time", "num"), ("GB/s", "ideal bytes / time", "num"),
                ("FLOP/byte", "intensity", "num"), ("bound", "intensity vs ridge", "text"),
                ("% of ceiling", "measured ceiling", "num"))
NO_OWN_WORK = "no work of its own: a view, or its call's work is counted on another operator's kernel"


def _work_cells(r: dict) -> list[str]:
    """An operator's roofline cells (:data:`WORK_HEADERS`): ``data-v`` holds the exact FLOP/s, bytes/s, FLOP/byte
    and ceiling fraction (0-1); the ``% of ceiling`` cell names its ceiling on hover, an unknown work its note."""
    if not r.get("work_known"):
        note = esc(r.get("work_note") or "work unknown")
        return ['<td class="num" data-v=""></td>'] * 3 + [f'<td data-v="" title="{note}">work unknown</td>',
                                                          '<td class="num" data-v=""></td>']
    if not r.get("flops") and not r.get("bytes"):  # 0 and 0: not a slow operator, one whose work is elsewhere
        return [f'<td class="num" data-v="0.0" title="{esc(NO_OWN_WORK)}">–</td>'] * 2 + [
            '<td class="num" data-v=""></td>', f'<td data-v="" title="{esc(NO_OWN_WORK)}">none of its own</td>',
            '<td class="num" data-v=""></td>']
    bound = r.get("bound")
    bound = "" if _missing(bound) else str(bound)
    fraction = r.get("ceiling_fraction")
    giga = {c: None if _missing(r[c]) else r[c] / 1e9 for c in ("achieved_flops_per_s", "achieved_bytes_per_s")}
    cells = [_num_cell(r["achieved_flops_per_s"], _fmt(giga["achieved_flops_per_s"], 2)),
             _num_cell(r["achieved_bytes_per_s"], _fmt(giga["achieved_bytes_per_s"], 2)),
             _num_cell(r["intensity"], "" if _missing(r["intensity"]) else f"{r['intensity']:.3g}"),
             f'<td data-v="{esc(bound)}">{esc(bound)}</td>']
    if _missing(fraction):
        cells.append('<td class="num" data-v=""></td>')
    else:
        cells.append(f'<td class="num" data-v="{esc(fraction)}" title="{esc(r.get("ceiling"))}">'
                     f"{esc(roofline_view.percent(fraction))}</td>")
    return cells


def _operator_section(operators: pd.DataFrame, iterations: int, top: int, metric_names: dict[str, str],
                      no_ranges: bool = False) -> str:
    counters = [(m, label, scale) for m, label, scale in COUNTER_COLUMNS if m in operators
                and operators[m].notna().any()]
    # the operator's time in each measured iteration (aggregate.per_iteration): a noisy iteration moves the mean
    per_iteration = "iteration_median_ns" in operators
    ranges = "iteration_min_ns" in operators and "iteration_max_ns" in operators
    quartiles = "iteration_p25_ns" in operators and "iteration_p75_ns" in operators
    # the rank beside the operator, which stays the first column (sticky when the table scrolls sideways)
    headers = [("operator", "text")] + ([("rank", "num")] if per_iteration else []) + [("time (ms)", "num")]
    headers += [] if no_ranges else [("mean / iteration (ms)", "num")]
    headers += [("median / iteration (ms)", "num")] if per_iteration else []
    headers += [(IQR_HEADER, "num")] if quartiles else []
    headers += [(RANGE_HEADER, "num")] if ranges else []
    headers += [("share", "num"), ("calls", "num"), ("kernels", "num"), ("mean kernel (µs)", "num")]
    # the roofline figures (analytic work over kernel time), when operators.parquet has the work columns
    work = roofline_view.has_work(operators)
    headers += [(f'{label}<span class="metric words">{source}</span>', kind) for label, source, kind in WORK_HEADERS] \
        if work else []
    headers += [(f'{esc(label)}<span class="metric">{esc(metric_names.get(m, m))}</span>', "num")
                for m, label, _ in counters]
    if "counters_kernels" in operators:
        headers.append(("kernels with counters", "num"))
    show_bottleneck = (operators["bottleneck"] != "not_collected").any()
    headers += [("paths", "text")] + ([("bottleneck", "text")] if show_bottleneck else [])
    rows = []
    ranks = report_md.rank_labels(operators)
    for rank, r, shown in zip(ranks, operators.to_dict("records"), report_md.short_names(operators["operator"])):
        cells = [_name_cell(r["operator"], shown)]
        if per_iteration:
            overlap = report_md.RANK_OVERLAP_MARK in rank
            cells.append(f'<td class="num" data-v="{int(rank.split()[0])}"'
                         + (' title="its interquartile range overlaps a neighbour\'s: the two may swap places in '
                            'another run"' if overlap else "") + f">{esc(rank)}</td>")
        cells.append(_num_cell(int(r["time_ns"]), f"{r['time_ns'] / 1e6:.3f}"))
        if not no_ranges:
            cells.append(_num_cell(r["time_ns"] / iterations / 1e6, f"{r['time_ns'] / iterations / 1e6:.3f}"))
        if per_iteration:
            median = None if _missing(r["iteration_median_ns"]) else r["iteration_median_ns"] / 1e6
            cells.append(_num_cell(median, _fmt(median, 3)))
        if quartiles:
            q1, q3 = (None if _missing(r[c]) else r[c] / 1e6 for c in ("iteration_p25_ns", "iteration_p75_ns"))
            cells.append(_num_cell(None if q1 is None or q3 is None else q3 - q1,
                                   "" if q3 is None else f"{_fmt(q1, 3)} – {_fmt(q3, 3)}"))
        if ranges:
            lo, hi = (None if _missing(r[c]) else r[c] / 1e6 for c in ("iteration_min_ns", "iteration_max_ns"))
            cells.append(_num_cell(hi, "" if hi is None else f"{_fmt(lo, 3)} – {_fmt(hi, 3)}"))
        cells += [_num_cell(r["time_share"], f"{r['time_share'] * 100:.2f}%"),
                 _num_cell(int(r["calls"])), _num_cell(int(r["kernels"])),
                 _num_cell(r["mean_kernel_ns"] / 1e3, f"{r['mean_kernel_ns'] / 1e3:.1f}")]
        if work:
            cells += _work_cells(r)
        cells += [_num_cell(r[m], _fmt(None if _missing(r[m]) else r[m] * scale)) for m, _, scale in counters]
        if "counters_kernels" in operators:
            cells.append(_num_cell(r["counters_kernels"]))
        cells.append(f"<td>{esc(r['paths'])}</td>")
        if show_bottleneck:
            cells.append(f'<td><span class="tag">{esc(r["bottleneck"])}</span></td>')
        rows.append("".join(cells))
    if len(operators):
        share = _top_with_other(operators[["operator", "time_share"]], "operator", "time_share", top)
        fig = _hbar(list(share["operator"]), [v * 100 for v in share["time_share"]],
                    [f"{o}: {v * 100:.2f}%" for o, v in zip(share["operator"], share["time_share"])],
                    "share of the operators' per-iteration medians (%)" if per_iteration else
                    "share of kernel time (%)")
        plot = _figure(fig, "fig-operator-share")
        n = report_md.operator_count(operators["operator"])
        drawn = operators.sort_values("time_share", ascending=False)["operator"].head(top)  # not "(other N)"
        heading = (f"Time share, top {report_md.operator_count(drawn)} of {report_md.operators_phrase(n)}"
                   if len(operators) > top else "Time share per operator")
    else:
        plot, heading = _no_plot("operator", "fig-operator-share"), "Time share"
    if no_ranges:
        times = "Times are totals over the whole trace (it has no iteration ranges)"
    else:
        times = ("Times are totals over the measured iterations (mean / iteration: the total divided by their "
                 "number)" + ("; median, p25 – p75 (the interquartile range), min and max: the operator's time in "
                              "each measured iteration, where one noisy iteration moves the mean but not the median. "
                              "Rank and share come from the medians (share: of the sum of every operator's median, "
                              f"{operators['iteration_median_ns'].sum() / 1e6:.3f} ms); "
                              f"{report_md.RANK_OVERLAP_MARK} marks a rank whose interquartile range overlaps a "
                              "neighbour's: the two may swap places in another run" if per_iteration else ""))
    return ('<section id="operators"><h2>Operators</h2>'
            f"<h3>{heading}</h3>{plot}"
            f"<h3>{_operators_title(operators['operator'])}</h3>"
            f'<p class="muted">Click a column header to sort. {times}. Counters '
            "are combined over each operator's kernels weighted by their timeline durations (the header names the "
            "ncu metric)."
            + (" GFLOP/s and GB/s: the operator's analytic work over its kernel time; bound and % of ceiling: "
               'against the measured ceilings (see <a href="#roofline">Roofline</a>).' if work else "") + "</p>"
            f'{_table(headers, rows, "operator-table", scroll=True)}</section>')


def _sol_section(operators: pd.DataFrame, coverage: dict, threshold: float, roofline_shown: bool = False) -> str:
    """The ncu speed-of-light scatter (CUDA); without counters a note, or nothing when the roofline section
    (``roofline_shown``) gives the profile its hardware view instead."""
    import plotly.graph_objects as go

    title = '<section id="sol"><h2>Speed of light: compute vs memory throughput</h2>'
    if "sm_sol" not in operators or "memory_sol" not in operators:
        if roofline_shown:
            return ""
        note = coverage.get("counters_note") or "hardware counters: not collected"
        return (title + f'<div class="note" id="sol-note">No speed-of-light view: {inline(note)}. It needs '
                "Nsight Compute counters (SM and memory throughput, % of peak), which a CUDA run collects.</div>"
                "</section>")
    points = operators[operators["sm_sol"].notna() & operators["memory_sol"].notna()]
    if not len(points):
        return (title + '<div class="note" id="sol-note">No operator has both SM and memory throughput counters '
                "(see the counters coverage above).</div></section>")
    biggest = float(points["time_ns"].max()) or 1.0
    fig = go.Figure()
    fig.add_shape(type="rect", x0=0, y0=0, x1=threshold, y1=threshold, line_width=0, fillcolor="#fef3c7",
                  opacity=0.6, layer="below")
    fig.add_shape(type="line", x0=0, y0=0, x1=100, y1=100, line={"dash": "dot", "color": "#9ca3af"})
    fig.add_annotation(x=1, y=threshold - 1, xanchor="left", yanchor="top", showarrow=False, align="left",
                       text=f"latency-bound<br>(both &lt; {threshold:g}%)", font={"color": "#92400e", "size": 11})
    for label, group in points.groupby("bottleneck", sort=True):
        fig.add_trace(go.Scatter(
            x=group["memory_sol"].tolist(), y=group["sm_sol"].tolist(), mode="markers", name=esc(label),
            marker={"size": group["time_ns"].tolist(), "sizemode": "area", "sizeref": 2 * biggest / 46 ** 2, "sizemin": 5,
                    "line": {"width": 1, "color": "#ffffff"}, "opacity": 0.85},
            hovertext=[f"{esc(o)}<br>time {t / 1e6:.3f} ms ({s * 100:.1f}%)<br>memory {m:.1f}% · SM {c:.1f}%"
                       # the total beside its own share (time_share comes from the medians)
                       for o, t, s, m, c in zip(group["operator"], group["time_ns"],
                                                group["total_share"] if "total_share" in group else group["time_share"],
                                                group["memory_sol"], group["sm_sol"])],
            hoverinfo="text"))
    fig.update_layout(height=560, margin={"l": 60, "r": 20, "t": 30, "b": 60}, legend_title_text="bottleneck",
                      xaxis={"title": "memory throughput, % of peak (gpu__compute_memory_throughput)",
                             "range": [0, 105]},
                      yaxis={"title": "compute (SM) throughput, % of peak (sm__throughput)", "range": [0, 105]})
    with_counters = report_md.operator_count(points["operator"])
    return (title + f'<p class="muted">One point per operator with counters ({with_counters} of '
            f'{report_md.operator_count(operators["operator"])}'
            + (", and one for the unattributed kernels" if with_counters < len(points) else "")
            + "), marker area proportional to its kernel time. Up and left: compute-bound; down and right: "
            "memory-bound; near the origin: neither unit busy (latency, launch overhead or too little work).</p>"
            f'{_figure(fig, "fig-sol")}</section>')


BOUND_COLORS = {"compute": "#7c3aed", "memory": "#0d9488"}
NO_BOUND_COLOR = "#6b7280"
# marker area of the operator with the largest time share (px^2 = MARKER_PX ** 2); the smallest drawn at 5 px
MARKER_PX = 40


def roofline_axis(points: pd.DataFrame, ceilings: roofline_view.Ceilings) -> tuple[float, float]:
    """The roofline plot's intensity range (FLOP/byte, whole decades): below the smallest intensity drawn (by at
    least 2x: the data-movement operators sit at its left edge, apart from every real point) and above the largest
    intensity or ridge point."""
    intensities = [float(v) for v in points["intensity"] if v > 0]
    ridges = [r for _, _, peak in ceilings.compute if (r := ceilings.ridge(peak))]
    low = min(intensities) / 2 if intensities else min(ridges, default=1.0) / 100
    high = max([*intensities, *ridges], default=low * 1000) * 2
    return 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(max(high, low * 100)))


def _served_from_cache(r: dict) -> bool:
    """Whether the operator's reading (roofline.with_roofline) found its bytes per call within the recorded
    cache: only then is a rate above the bandwidth said to come from cache."""
    return isinstance(r.get("roofline"), str) and "served from there" in r["roofline"]


def _roofline_hover(r: dict, iterations: int, ceilings: roofline_view.Ceilings, moves_only: bool) -> str:
    """A roofline point's hover: the operator, its time per iteration, its rates and intensity (a data-movement
    operator: its bytes/s and their share of the bandwidth), its place against the ceiling."""
    share = r["total_share"] if "total_share" in r and not _missing(r.get("total_share")) else r["time_share"]
    lines = [r["operator"], (f"time {r['time_ns'] / iterations / 1e6:.3f} ms / iteration (mean), "
                             f"{share * 100:.1f}% of kernel time")]
    if moves_only:
        bytes_s = r["achieved_bytes_per_s"]
        if ceilings.bandwidth:
            fraction = bytes_s / ceilings.bandwidth
            lines.append(f"data movement only: {bytes_s / 1e9:.3g} GB/s = {fraction * 100:.0f} % of bandwidth"
                         + ((" (above it: served from cache)" if _served_from_cache(r) else
                             " (above it: cache use not known, the ceiling may be under-measured)")
                            if fraction > 1 else ""))
        else:
            lines.append(f"data movement only: {bytes_s / 1e9:.3g} GB/s (no measured bandwidth)")
        return hover_text(*lines, f"{roofline_view.si(r['bytes'] / iterations, 'B')} / iteration, 0 FLOP")
    lines.append(f"{r['achieved_flops_per_s'] / 1e9:.3g} GFLOP/s · {r['achieved_bytes_per_s'] / 1e9:.3g} GB/s · "
                 f"{r['intensity']:.3g} FLOP/byte")
    lines.append(f"{roofline_view.si(r['flops'] / iterations, 'FLOP')} and "
                 f"{roofline_view.si(r['bytes'] / iterations, 'B')} / iteration")
    if not _missing(r.get("ceiling_fraction")):
        exceeded = not _missing(r.get("ceiling_exceeded")) and bool(r.get("ceiling_exceeded"))
        lines.append(f"{roofline_view.percent(r['ceiling_fraction'])} of {r['ceiling']} ({r['bound']}-bound)"
                     + ("; above the measured ceiling: likely measured low (re-measure)" if exceeded else
                        ("; above the measured bandwidth: served from cache" if _served_from_cache(r) else
                         "; above the measured bandwidth: cache use not known") if r["ceiling_fraction"] > 1
                        and r["bound"] == "memory" else ""))
    else:
        lines.append(roofline_view.reading(r) or "no ceiling")
    return hover_text(*lines)


def roofline_figure(rows: roofline_view.RooflineRows, ceilings: roofline_view.Ceilings, iterations: int):
    """The roofline: log-log, x arithmetic intensity (FLOP/byte), y achieved FLOP/s; the memory roof (bandwidth x
    intensity up to the highest ridge) and one horizontal line per compute ceiling (from its ridge); one point per
    operator of ``rows.points`` coloured by ``bound`` and, at the left edge (x = the axis minimum, y = its bytes/s x
    that intensity: its height against the memory roof is its share of the bandwidth), one triangle per operator of
    ``rows.data_movement``. Marker area: the operator's time share."""
    import plotly.graph_objects as go

    lo, hi = roofline_axis(rows.points, ceilings)
    fig = go.Figure()
    top_ridge = max((ceilings.ridge(p) or 0 for _, _, p in ceilings.compute), default=0) or hi
    if ceilings.bandwidth is not None:
        end = min(top_ridge, hi)
        fig.add_trace(go.Scatter(x=[lo, end], y=[ceilings.bandwidth * lo, ceilings.bandwidth * end], mode="lines",
                                 name=f"memory bandwidth {roofline_view.si(ceilings.bandwidth, 'B/s')}",
                                 line={"color": "#0f172a", "width": 2}, hoverinfo="name",
                                 meta={"ceiling": "memory", "bytes_per_s": ceilings.bandwidth}))
    for (name, dtype, peak), dash in zip(ceilings.compute, ("solid", "dash", "dot", "dashdot", "longdash") * 4):
        start = max(ceilings.ridge(peak) or lo, lo)
        fig.add_trace(go.Scatter(x=[start, hi], y=[peak, peak], mode="lines",
                                 name=f"{esc(name)} {roofline_view.si(peak, 'FLOP/s')}",
                                 line={"color": "#0f172a", "width": 2, "dash": dash}, hoverinfo="name",
                                 meta={"ceiling": "compute", "dtype": dtype, "flops_per_s": peak}))
        fig.add_annotation(x=math.log10(hi), y=math.log10(peak), xanchor="right", yanchor="bottom", showarrow=False,
                           text=f"{esc(name)}: {roofline_view.si(peak, 'FLOP/s')}", font={"size": 11})
    if ceilings.bandwidth is not None:
        fig.add_annotation(x=math.log10(lo), y=math.log10(ceilings.bandwidth * lo), xanchor="left", yanchor="bottom",
                           showarrow=False, text=f"memory: {roofline_view.si(ceilings.bandwidth, 'B/s')}",
                           font={"size": 11}, textangle=0)
    shares = pd.concat([rows.points["time_share"], rows.data_movement["time_share"]])
    biggest = float(shares.max()) if len(shares) and shares.max() > 0 else 1.0
    marker = {"sizemode": "area", "sizeref": 2 * biggest / MARKER_PX ** 2, "sizemin": 5, "opacity": 0.85,
              "line": {"width": 1, "color": "#ffffff"}}
    bounds = rows.points["bound"].where(rows.points["bound"].notna(), None) if "bound" in rows.points else \
        pd.Series([None] * len(rows.points), index=rows.points.index)
    for bound in ("compute", "memory", None):
        group = rows.points[bounds.isna()] if bound is None else rows.points[bounds == bound]
        if not len(group):
            continue
        label = f"{bound}-bound" if bound else ("bound unknown (no ceiling for its dtype)" if ceilings.measured
                                                else "no ceilings measured")
        fig.add_trace(go.Scatter(
            x=group["intensity"].tolist(), y=group["achieved_flops_per_s"].tolist(), mode="markers", name=label,
            marker={**marker, "size": group["time_share"].tolist(), "symbol": "circle",
                    "color": BOUND_COLORS.get(bound, NO_BOUND_COLOR)},
            hovertext=[_roofline_hover(r, iterations, ceilings, False) for r in group.to_dict("records")],
            hoverinfo="text", customdata=group["operator"].tolist()))
    moves = rows.data_movement
    if len(moves):
        fig.add_trace(go.Scatter(
            x=[lo] * len(moves), y=(moves["achieved_bytes_per_s"] * lo).tolist(), mode="markers",
            name="data movement only (0 FLOP: at the left edge, y = bytes/s × its intensity)",
            marker={**marker, "size": moves["time_share"].tolist(), "symbol": "triangle-right",
                    "color": BOUND_COLORS["memory"], "line": {"width": 1, "color": "#0f172a"}},
            hovertext=[_roofline_hover(r, iterations, ceilings, True) for r in moves.to_dict("records")],
            hoverinfo="text", customdata=moves["operator"].tolist()))
    fig.update_layout(height=560, margin={"l": 70, "r": 20, "t": 30, "b": 60},
                      legend={"orientation": "h", "y": -0.16, "itemsizing": "constant"},
                      xaxis={"title": "arithmetic intensity (FLOP/byte; analytic FLOPs / ideal bytes)", "type": "log",
                             # a little room left of the edge, so the triangles there are drawn whole
                             "range": [math.log10(lo) - 0.08, math.log10(hi)]},
                      yaxis={"title": "achieved FLOP/s (analytic FLOPs / kernel time)", "type": "log",
                             "exponentformat": "SI"})
    return fig


def _roofline_section(operators: pd.DataFrame, coverage: dict, run: dict | None, iterations: int,
                      replays: list[dict] | None = None) -> str:
    """The roofline of the operators' analytic work against the measured ceilings (:func:`roofline_figure`), the
    statement of what is analytic and what is measured, and the operators that have no point, with why."""
    cuda = run is not None and run["versions"].get("device") == "cuda"
    statement = roofline_view.analytic_and_measured(cuda, roofline_view.cache_controls(replays))
    title = ('<section id="roofline"><h2>Roofline: analytic work per operator against the measured ceilings</h2>'
             f'<p id="analytic-measured">{inline(statement)}</p>')
    if not roofline_view.has_work(operators):
        return title + f'<div class="note" id="roofline-note">{esc(roofline_view.NO_WORK)}.</div></section>'
    rows = roofline_view.roofline_rows(operators)
    ceilings = roofline_view.table_ceilings(operators, coverage)
    work = coverage.get("work") or {}
    per_it = max(iterations, 1)
    known = operators[operators["work_known"].fillna(False).astype(bool)]
    kpis = _kpis([
        ("FLOP / iteration (analytic)", roofline_view.si(work.get("flops_per_iteration",
                                                                  float(known["flops"].sum()) / per_it), "FLOP")),
        ("bytes / iteration (ideal)", roofline_view.si(work.get("bytes_per_iteration",
                                                                float(known["bytes"].sum()) / per_it), "B")),
        *([("work known for", f"{work['known_time_share'] * 100:.1f}% of kernel time")]
          if work.get("known_time_share") is not None else []),
    ])
    notes = []
    if ceilings.measured:
        where = f" from <code>{esc(ceilings.source)}</code>" if ceilings.source else ""
        threads = f", measured with {ceilings.threads} thread(s)" if ceilings.threads else ""
        notes.append(f'<p id="roofline-ceilings">Ceilings: {esc(ceilings.words())}{threads}{where}.</p>')
        measured = roofline_view.ceilings_warnings(coverage)
        if measured:
            notes.append('<ul class="muted" id="roofline-ceilings-warnings">' + "".join(
                "<li>" + esc("the ceilings' measurement warns: " + w) + "</li>" for w in measured) + "</ul>")
        mismatch = roofline_view.thread_mismatch(ceilings, run)
        if mismatch:
            notes.append(f'<p class="note" id="roofline-threads"><strong>Warning</strong>: {esc(mismatch)}.</p>')
        above = roofline_view.above_ceiling(operators)
        if above:
            notes.append(f'<p class="note" id="roofline-above-ceiling"><strong>Warning</strong>: {esc(above)}.</p>')
    else:
        notes.append('<p class="note" id="roofline-no-ceilings">The machine\'s ceilings were not measured (no '
                     "ceilings.json given to aggregate): the points show the achieved rates, without ceiling lines, "
                     "bound or fraction of a ceiling.</p>")
    placed = len(rows.points) + len(rows.data_movement)
    if placed:
        n = report_md.operator_count(operators["operator"])
        mine = report_md.operator_count([*rows.points["operator"], *rows.data_movement["operator"]])
        caption = (f'<p class="muted">One point per operator with known work ({mine} of {n}'
                   + (", and one for the unattributed kernels" if mine < placed else "")
                   + "), marker area proportional to its share of kernel time, colour by its bound. An operator on "
                   "its roof runs at the ceiling; under the sloped memory roof it is memory-bound, under a flat "
                   "compute ceiling compute-bound (the ridge point is where they meet). Above the memory roof "
                   "(over 100 % of the bandwidth) an operator whose bytes per call fit the cache is served from there, "
                   "which the bandwidth benchmark, sized beyond the caches, does not measure; its hover says when "
                   "the cache size is not known. Triangles at the left edge: operators that only move "
                   "data (0 FLOP cannot sit on a log axis), drawn at y = their bytes/s × the edge's intensity, so "
                   "their height against the memory roof is their share of the bandwidth.</p>")
        plot = caption + _figure(roofline_figure(rows, ceilings, per_it), "fig-roofline")
    else:
        plot = '<p class="note" id="fig-roofline-none">No operator with known work to plot.</p>'
    lists = []
    if len(rows.unknown):
        body = [_name_cell(r["operator"], cut) + f"<td>{esc(r['work_note'])}</td>"
                for r, cut in zip(rows.unknown.to_dict("records"), report_md.short_names(rows.unknown["operator"]))]
        lists.append("<h3>Work unknown (no point; never a figure from part of an operator's kernels)</h3>"
                     + _table([("operator", "text"), ("why", "text")], body, "work-unknown-table", scroll=True))
    if len(rows.not_placed):
        body = [_name_cell(r["operator"], cut) + f"<td>{esc(r['reason'])}</td>"
                for r, cut in zip(rows.not_placed.to_dict("records"),
                                  report_md.short_names(rows.not_placed["operator"]))]
        lists.append("<h3>Work known, not placed on the roofline</h3>"
                     + _table([("operator", "text"), ("why", "text")], body, "work-not-placed-table", scroll=True))
    if len(rows.no_work):
        names = ", ".join(f"<code>{esc(n)}</code>" for n in report_md.short_names(rows.no_work["operator"], 60))
        lists.append(f'<p class="muted" id="work-none">No work of their own (views, or their call\'s work is '
                     f"counted on another operator's kernel; no point): {names}.</p>")
    return title + kpis + "".join(notes) + plot + "".join(lists) + "</section>"


def _coverage_section(coverage: dict, diagnostics: dict | None) -> str:
    rows = []
    for path, share in sorted(coverage["by_path"].items()):
        entry = (coverage.get("path_coverage") or {}).get(path)
        rows.append(f"<td>{esc(path)}</td>" + _num_cell(share, f"{share * 100:.2f}%")
                    + (_num_cell(entry["count"], f"{entry['count'] * 100:.2f}%") if entry else _num_cell(None))
                    + (_num_cell(entry["time"], f"{entry['time'] * 100:.2f}%") if entry else _num_cell(None)))
    paths = _table([("path", "text"), ("time share (chosen)", "num"), ("kernels it named (any)", "num"),
                    ("time it named (any)", "num")], rows, "path-table", sortable=False)
    text = (f"<p>{coverage['attributed_count']:,} of {coverage['kernel_count']:,} kernels attributed to an operator, "
            f"{coverage['coverage_time'] * 100:.2f}% of {coverage['kernel_time_ns'] / 1e6:.3f} ms kernel time.</p>")
    extra = "".join(f"<p>{inline(line)}</p>" for line in [*report_md._agreement_lines(coverage),
                                                          *report_md.user_annotation_lines(coverage),
                                                          *report_md.external_id_lines(coverage),
                                                          *report_md._outside_iterations(coverage),
                                                          *report_md._invalid_time_line(coverage)] if line)
    unattributed = coverage.get("unattributed") or []
    if unattributed:
        shown = report_md.short_names([u["name"] for u in unattributed])
        u_rows = [_name_cell(u["name"], cut) + _num_cell(u["count"]) + _num_cell(u["time_ns"] / 1e6, f"{u['time_ns'] / 1e6:.3f}")
                  + f"<td><code>{esc(u['reason'])}</code></td>" for u, cut in zip(unattributed, shown)]
        u_table = _table([("kernel", "text"), ("count", "num"), ("total (ms)", "num"), ("reason", "text")], u_rows,
                         "unattributed-table", scroll=True)
    else:
        u_table = "<p>None: every kernel was attributed.</p>" if coverage["kernel_count"] else "<p>None (no kernels).</p>"
    notes = ""
    if diagnostics and (diagnostics.get("warnings") or diagnostics.get("info")):
        notes = "<h3>Capture notes</h3>" + _bullets([line for line in report_md._notes(diagnostics)
                                                     if line.startswith("- ")])
    return (f'<section id="coverage"><h2>Attribution coverage</h2>{text}{paths}{extra}'
            f"<h3>Unattributed kernels</h3>{u_table}{_refused_counters(coverage)}{notes}</section>")


def _refused_counters(coverage: dict) -> str:
    """The kernels whose ncu counters the matching refused, per kernel name and reason, then the matching's hints
    (empty when neither)."""
    from ..matching import REASONS

    c = coverage.get("counters") or {}
    hints = (f"<h3>Matching hints</h3>{_bullets(['- ' + h for h in c['hints']])}" if c.get("hints") else "")
    if not c.get("refused"):
        return hints
    shown = report_md.short_names([e["name"] for e in c["refused_keys"]])
    rows = [f'<td class="name" title="{esc(e["name"])}">{esc(name)}</td>'
            f"<td><code>{esc(e['reason'])}</code></td>" + _num_cell(e["refused"]) + _num_cell(e["timeline"])
            + _num_cell(e["ncu"]) for name, e in zip(shown, c["refused_keys"])]
    table = _table([("kernel", "text"), ("reason", "text"), ("refused", "num"), ("launches in the window", "num"),
                    ("ncu rows", "num")], rows, "refused-table", scroll=True)
    reasons = _bullets([f"- `{r}`: {REASONS.get(r, r)}" for r in sorted(c["refused_reasons"])])
    rows_ = c.get("refused_rows")
    behind = (f"{rows_:,} ncu row(s) could not be placed with certainty, so the {c['refused']:,} kernel(s) they may "
              "belong to have no counters" if rows_ is not None else f"{c['refused']:,} kernel(s) may have an ncu "
              "measurement that could not be placed with certainty, so they have no counters")
    return f"<h3>Counters refused</h3><p>{behind} (a wrong counter is never attached).</p>{table}{reasons}{hints}"


def _layers_section(layer_classes: pd.DataFrame, iterations: int, replays: list[dict] | None,
                    no_ranges: bool = False, coverage: dict | None = None, run: dict | None = None) -> str:
    import plotly.graph_objects as go

    est = {}
    if replays:
        from ..ncu.plan import replay_estimate

        est = {r["class"]: r for r in replay_estimate(replays)["classes"]}
    # K: the instances an ncu replay runs per class. Without ncu replays (CPU runs, ncu off, imported traces)
    # nothing was replayed: K is what a CUDA run would replay.
    k_label = "replayed K" if replays else "would replay K (CUDA)"
    per_call = "instance_iteration_median_ns" in layer_classes
    headers = [("layer class", "text"), ("module class", "text"), ("instances N", "num"), (k_label, "num"),
               ("kernels / instance", "num"),
               ("ms / instance / iteration: median", "num") if per_call else
               ("ms / instance" + ("" if no_ranges else " / iteration"), "num")]
    headers += [("min – max / instance / iteration (ms)", "num")] if per_call else []
    headers += [("total (ms)", "num")]
    if est:
        headers += [("ncu runs", "num"), ("replay measured (s)", "num"), ("every instance (s)", "num"),
                    ("saving N/K", "num")]
    rows, names, n_values, k_values = [], [], [], []
    for r in layer_classes.to_dict("records"):
        e = est.get(r["layer_class"])
        k = e["replayed"] if e else int(r["replays_with_dedup"])
        # per call: the median over the class's (instance, iteration) pairs; else the mean instance's total / iterations
        per = (r["instance_iteration_median_ns"] if per_call else r["mean_instance_time_ns"] / max(iterations, 1)) / 1e6
        cells = (f"<td>{esc(r['layer_class'])}</td><td>{esc(r['module_class'] if not _missing(r['module_class']) else '(kernels in no layer instance)')}</td>"
                 + _num_cell(int(r["instances"])) + _num_cell(k) + _num_cell(int(r["kernels_per_instance"]))
                 + _num_cell(per, f"{per:.3f}"))
        if per_call:
            lo, hi = r["instance_iteration_min_ns"] / 1e6, r["instance_iteration_max_ns"] / 1e6
            cells += _num_cell(hi, f"{lo:.3f} – {hi:.3f}")
        cells += _num_cell(r["time_ns"] / 1e6, f"{r['time_ns'] / 1e6:.3f}")
        if est:
            saving = e["estimate_all_s"] / e["wall_s"] if e and e["wall_s"] else None
            cells += (_num_cell(e["runs"] if e else None) + _num_cell(e["wall_s"] if e else None, _fmt(e and e["wall_s"]))
                      + _num_cell(e["estimate_all_s"] if e else None, _fmt(e and e["estimate_all_s"]))
                      + _num_cell(saving, f"{saving:.1f}x" if saving else ""))
        rows.append(cells)
        names.append(r["layer_class"])
        n_values.append(int(r["instances"]))
        k_values.append(k)
    summary = f"<p>{inline(report_md.layer_summary(layer_classes, run))}</p>"
    splits = report_md.split_lines(layer_classes)
    if splits:
        summary += f'<p id="layer-splits">{inline(splits[0])}</p>' + _bullets(splits[2:])
    if est:
        total = replay_estimate_total(replays)
        summary += f"<p>{inline(total)}</p>"
    figure = ""
    if (layer_classes["layer_class"] != "rest").any():
        labels = [esc(n) for n in bar_labels(names)][::-1]  # plotly draws the first category at the bottom
        fig = go.Figure([go.Bar(name=k_label, y=labels, x=k_values[::-1], orientation="h",
                                marker_color="#2563eb"),
                         go.Bar(name="instances N", y=labels, x=n_values[::-1], orientation="h",
                                marker_color="#94a3b8")])
        fig.update_layout(barmode="group", height=max(240, 60 * len(names) + 120),
                          margin={"l": 10, "r": 30, "t": 30, "b": 50}, xaxis_title="layer instances",
                          yaxis={"automargin": True, "type": "category"}, legend={"orientation": "h", "y": 1.12})
        figure = _figure(fig, "fig-layer-classes")
    table = _table(headers, rows, "layer-class-table") if rows else ""
    return f'<section id="layers"><h2>Layer classes</h2>{summary}{figure}{table}{_membership(coverage, layer_classes)}</section>'


def _membership(coverage: dict | None, layer_classes: pd.DataFrame | None = None) -> str:
    """The layer membership of compiled kernels (report.py ``layer_membership_lines``): its sentences, and the
    cross-layer and unknown kernels as a table."""
    lines = report_md.layer_membership_lines(coverage or {}, limit=10**9, layer_classes=layer_classes)
    if not lines:
        return ""
    text = "".join(f"<p>{inline(line)}</p>" for line in lines
                   if line.startswith(("Layer membership", "Instances of one module class")))
    info = (coverage or {}).get("layer_membership") or {}
    rows = [f"<td>{esc(c['name'])}</td><td>{esc(' + '.join(c['layers_spanned']))}</td>" + _num_cell(c["count"])
            + _num_cell(c["time_ns"] / 1e6, f"{c['time_ns'] / 1e6:.3f}") for c in info.get("cross_layer") or []]
    rows += [f"<td>{esc(u['name'])}</td><td>unknown (FX nodes' modules not known)</td>" + _num_cell(u["count"])
             + _num_cell(u["time_ns"] / 1e6, f"{u['time_ns'] / 1e6:.3f}") for u in info.get("unknown") or []]
    headers = [("kernel", "text"), ("spans", "text"), ("count", "num"), ("total (ms)", "num")]
    return (f'<div id="layer-membership">{text}</div>'
            + (_table(headers, rows, "layer-membership-table") if rows else ""))


PHASE_COLORS = {"forward": "#2563eb", "backward": "#d97706", "optimizer": "#0d9488"}


def _phases_section(coverage: dict, phases: pd.DataFrame | None, top: int) -> str:
    """The train-step split (report.md's "Time per train-step phase"): median kernel time per iteration of each
    phase as bars, and each phase's top operators; empty for a profile without phase ranges."""
    summary = coverage.get("phases")
    if not summary:
        return ""
    names = [e["phase"] for e in summary]
    fig = _hbar(names, [e["iteration_median_ns"] / 1e6 for e in summary],
                [f"{e['phase']}: {e['iteration_median_ns'] / 1e6:.3f} ms per iteration (median), "
                 f"{e['time_share'] * 100:.1f}% of kernel time, {e['kernels']} kernels" for e in summary],
                "kernel time per iteration, median (ms)", color=[PHASE_COLORS.get(p, "#94a3b8") for p in names])
    lines = report_md.phase_lines(coverage, None, top)
    intro = next((line for line in lines if line.startswith("Each measured iteration")), "")
    rows = [f'<td class="name">{esc(p)}</td>' + _num_cell(e["iteration_median_ns"], f"{e['iteration_median_ns'] / 1e6:.3f}")
            + _num_cell(e["time_ns"], f"{e['time_ns'] / 1e6:.3f}")
            + _num_cell(e["time_share"], f"{e['time_share'] * 100:.2f}%") + _num_cell(int(e["kernels"]))
            for p, e in zip(names, summary)]
    body = _table([("phase", "text"), ("ms / iteration (median)", "num"), ("total (ms)", "num"), ("share", "num"),
                   ("kernels", "num")], rows, "phase-table")
    n = min(top, report_md.PHASE_TOP)
    for phase in names if phases is not None else []:
        mine = phases[phases["phase"] == phase].head(n)
        if not len(mine):
            continue
        shown = report_md.short_names(mine["operator"])
        rows = [_name_cell(r["operator"], cut) + _num_cell(int(r["calls"])) + _num_cell(int(r["kernels"]))
                + _num_cell(int(r["iteration_median_ns"]), f"{r['iteration_median_ns'] / 1e6:.3f}")
                + _num_cell(int(r["time_ns"]), f"{r['time_ns'] / 1e6:.3f}")
                + _num_cell(r["phase_share"], f"{r['phase_share'] * 100:.2f}%")
                for r, cut in zip(mine.to_dict("records"), shown)]
        body += f"<h3>Top operators of <code>{esc(phase)}</code></h3>" + _table(
            [("operator", "text"), ("calls", "num"), ("kernels", "num"), ("ms / iteration (median)", "num"),
             ("total (ms)", "num"), ("share of phase", "num")], rows, f"phase-{esc(phase)}-table", scroll=True)
    return (f'<section id="phases"><h2>Time per train-step phase</h2><p>{inline(intro)}</p>'
            f'{_figure(fig, "fig-phases")}{body}</section>')


def replay_estimate_total(replays: list[dict]) -> str:
    """The measured ncu replay time against replaying every instance, as report.py words it."""
    lines = [line for line in report_md._replay_lines(replays) if line.startswith("Replaying ")]
    return lines[0] if lines else ""


def _modules_section(modules: pd.DataFrame, top: int, no_ranges: bool = False) -> str:
    # with per-iteration columns the plot, the order and the shares use each module's median per iteration
    median = "iteration_median_ns" in modules and "iteration_p25_ns" in modules
    value = "iteration_median_ns" if median else "time_ns"
    if len(modules):
        shown = _top_with_other(modules[["module", value]], "module", value, top)
        fig = _hbar(list(shown["module"]), [v / 1e6 for v in shown[value]],
                    [f"{m}: {t / 1e6:.3f} ms" for m, t in zip(shown["module"], shown[value])],
                    "median kernel time per measured iteration (ms)" if median else
                    "kernel time over the " + ("whole trace" if no_ranges else "measured iterations") + " (ms)",
                    color="#0d9488")
        plot = _figure(fig, "fig-modules")
    else:
        plot = _no_plot("module", "fig-modules")
    rows = []
    for r in modules.to_dict("records"):
        cells = f'<td class="name">{esc(r["module"])}</td>' + _num_cell(int(r["kernels"]))
        if median:
            q1, q3 = r["iteration_p25_ns"] / 1e6, r["iteration_p75_ns"] / 1e6
            cells += (_num_cell(r["iteration_median_ns"] / 1e6, f"{r['iteration_median_ns'] / 1e6:.3f}")
                      + _num_cell(q3 - q1, f"{q1:.3f} – {q3:.3f}"))
        rows.append(cells + _num_cell(int(r["time_ns"]), f"{r['time_ns'] / 1e6:.3f}")
                    + _num_cell(r["time_share"], f"{r['time_share'] * 100:.2f}%"))
    headers = [("module", "text"), ("kernels", "num")]
    headers += [("median / iteration (ms)", "num"), (IQR_HEADER, "num")] if median else []
    headers += [("total (ms)", "num"), ("share", "num")]
    table = _table(headers, rows, "module-table", scroll=True)
    note = ('<p class="muted">Ranked by each module\'s median kernel time per measured iteration (share: of the sum '
            "of the medians), so identical layers read alike whichever iteration the machine slowed; total: over all "
            "measured iterations.</p>" if median else "")
    return f'<section id="modules"><h2>Modules (layer instances)</h2>{note}{plot}{table}</section>'


def render_html(workload: str, inputs: ReportInputs, top_operators: int = TOP_BARS) -> str:
    """``report.html`` of one workload: ``inputs`` as for :func:`operator_profiler.report.markdown.render_markdown`
    (``counters_time``: the share of kernel time whose kernels have ncu counters, when collected)."""
    run, coverage, operators, modules = inputs.run, inputs.coverage, inputs.operators, inputs.modules
    layer_classes, diagnostics, matching = inputs.layer_classes, inputs.diagnostics, inputs.matching
    replays, clocks, phases, counters_time = inputs.replays, inputs.clocks, inputs.phases, inputs.counters_time
    iterations = report_md.measured_iterations(run, coverage)
    no_ranges = no_iteration_ranges(run, coverage)
    device = "" if run is None else (run["versions"].get("device_name") or run["versions"]["device"])
    measured = ("no iteration ranges: totals over the whole trace" if no_ranges
                else report_md._plural(iterations, "measured iteration"))
    subtitle = esc(" · ".join(p for p in (
        run and run["workload"]["kind"], run and run["mode"],
        run and (f"compiled, scope {run['compile_scope']}" if run["compiled"] and run.get("compile_scope")
                 else "compiled" if run["compiled"] else "eager"), device, measured) if p))
    # on CPU (no ncu counters) the roofline is the profile's hardware view: no empty speed-of-light section
    sol = _sol_section(operators, coverage, latency_threshold(), roofline_view.has_work(operators))
    sections = [
        _header_section(workload, run, coverage, operators, diagnostics, clocks, counters_time, replays),
        _operator_section(operators, iterations, top_operators, counter_metric_names(), no_ranges),
        sol,
        _roofline_section(operators, coverage, run, iterations, replays),
        _coverage_section(coverage, diagnostics),
        _phases_section(coverage, phases, top_operators),
        _layers_section(layer_classes, iterations, replays, no_ranges, coverage, run),
        _modules_section(modules, top_operators, no_ranges),
    ]
    nav = [("measurement", "Measurement"), ("operators", "Operators"), *([("sol", "Speed of light")] if sol else []),
           ("roofline", "Roofline"), ("coverage", "Coverage"), *([("phases", "Train-step phases")] if coverage.get("phases") else []),
           ("layers", "Layer classes"), ("modules", "Modules")]
    return _page(f"Operator profile: {workload}", subtitle, nav, "".join(sections))


# ------------------------------------------------------------------------------ compare.html


def workload_identity(run: dict | None, folder_name: str) -> str:
    """What must agree for two profiles to be of one workload: the model kind (and a custom model's factory)
    from run.json; the results folder's name for a trace captured elsewhere (no run.json)."""
    if run is None:
        return f"results folder {folder_name!r}"
    w = run["workload"]
    return f"kind {w['kind']!r}" + (f", factory {w['factory']!r}" if w.get("factory") else "")


def compares_medians(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Both operator tables have the per-iteration median (``iteration_median_ns``, aggregate.per_iteration)."""
    return "iteration_median_ns" in a and "iteration_median_ns" in b


def compares_ranges(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Both operator tables have each operator's per-iteration range (``iteration_min_ns``,
    ``iteration_max_ns``, aggregate.per_iteration): a change counts only beyond it."""
    return all(c in t for t in (a, b) for c in ("iteration_min_ns", "iteration_max_ns"))


def change_rule(ranges: bool, short: bool = False) -> str:
    """The rule that tags a change ``slower``/``faster`` rather than ``same``, in words (page; ``short``: the
    summary line of ``opprof compare``)."""
    floor = f"{NOISE_SHARE * 100:g}% of A's time and {NOISE_FLOOR_MS * 1000:g} µs"
    if short:
        return (f"a change counts when the per-iteration ranges [min, max] do not overlap and it is at least {floor}"
                if ranges else f"a change counts when it is at least {floor}")
    if ranges:
        return (f"an operator is slower (faster) only when all its per-iteration times in B are above (below) all "
                f"of them in A, the two per-iteration ranges [min, max] not overlapping, and the change is at "
                f"least {floor}")
    return f"a change counts when it is at least {floor}"


def compare_table(a: pd.DataFrame, iterations_a: int, b: pd.DataFrame, iterations_b: int) -> pd.DataFrame:
    """One row per operator of either profile: ``a_ms``, ``b_ms`` (ms per measured iteration, NaN where the
    operator did not run: the per-iteration median when both tables have it (:func:`compares_medians`), else the
    total / measured iterations, the mean), ``delta_ms`` (B - A, an absent side counting 0), ``ratio`` (B / A,
    both sides only), ``side`` (``both``, ``only A``, ``only B``), ``change`` (``slower``, ``faster``, ``same``:
    ``|delta|`` within max(NOISE_SHARE of A, NOISE_FLOOR_MS) or, when both tables have the per-iteration range
    (:func:`compares_ranges`), the two sides' ``[iteration_min_ns, iteration_max_ns]`` overlapping: B's min above
    A's max is slower, B's max below A's min faster; ``only A``/``only B``) and, per counter column of
    the operator table present on a side, ``<metric>_a``, ``<metric>_b``, ``<metric>_delta``; sorted by the size
    of the time change. ``attrs["basis"]``: ``median`` or ``mean``; ``attrs["ranges"]``: the range rule applied."""
    median = compares_medians(a, b)
    ranges = compares_ranges(a, b)
    counters = [m for m, _, _ in COUNTER_COLUMNS if m in a or m in b]

    def side(table: pd.DataFrame, iterations: int, suffix: str) -> pd.DataFrame:
        ms = table["iteration_median_ns"] / 1e6 if median else table["time_ns"] / iterations / 1e6
        extra = {"lo": table["iteration_min_ns"] / 1e6, "hi": table["iteration_max_ns"] / 1e6} if ranges else {}
        return table[["operator", *[m for m in counters if m in table]]].assign(ms=ms, **extra).rename(
            columns={m: f"{m}_{suffix}" for m in [*counters, "ms", *extra]})

    merged = side(a, iterations_a, "a").merge(side(b, iterations_b, "b"), on="operator", how="outer", indicator=True)
    out = pd.DataFrame({"operator": merged["operator"]})
    out["side"] = merged["_merge"].map({"both": "both", "left_only": "only A", "right_only": "only B"}).astype(str)
    out["a_ms"] = merged["ms_a"].astype(float)
    out["b_ms"] = merged["ms_b"].astype(float)
    out["delta_ms"] = out["b_ms"].fillna(0) - out["a_ms"].fillna(0)
    out["ratio"] = out["b_ms"] / out["a_ms"].where(out["a_ms"] > 0)
    noise = (out["a_ms"].fillna(0) * NOISE_SHARE).clip(lower=NOISE_FLOOR_MS)
    changes = ["same" if abs(d) < n else "slower" if d > 0 else "faster" for d, n in zip(out["delta_ms"], noise)]
    if ranges:
        # beyond the floor, and B's whole per-iteration range on one side of A's (NaN compares False: same)
        changes = ["slower" if c == "slower" and lo_b > hi_a else "faster" if c == "faster" and hi_b < lo_a
                   else "same" for c, lo_a, hi_a, lo_b, hi_b in zip(changes, merged["lo_a"], merged["hi_a"],
                                                                     merged["lo_b"], merged["hi_b"])]
    out["change"] = out["side"].where(out["side"] != "both", pd.Series(changes, index=out.index, dtype=object))
    for m in counters:
        va = merged[f"{m}_a"] if f"{m}_a" in merged else pd.Series(float("nan"), index=merged.index)
        vb = merged[f"{m}_b"] if f"{m}_b" in merged else pd.Series(float("nan"), index=merged.index)
        out[f"{m}_a"], out[f"{m}_b"], out[f"{m}_delta"] = va, vb, vb - va
    order = out["delta_ms"].abs().sort_values(ascending=False, kind="stable").index
    out = out.loc[order].reset_index(drop=True)
    out.attrs["basis"] = "median" if median else "mean"
    out.attrs["ranges"] = ranges
    return out


def compare_totals(table: pd.DataFrame) -> dict[str, float]:
    """The comparison's headline, from its own table (:func:`compare_table`): ``a_ms``, ``b_ms`` (ms per iteration:
    the sum over every row, ``(unattributed)`` included, of the per-iteration medians, or means, the table shows;
    an operator absent from a side counts 0), ``delta_ms`` (``b_ms - a_ms``, also the sum of the rows' deltas) and
    ``change`` (``b_ms / a_ms - 1``, a fraction; None when ``a_ms`` is 0). Summing the table's own figures keeps the
    headline and the rows consistent: the median iteration's total is another statistic, which a few slow
    iterations move differently from each operator's median."""
    a_ms, b_ms = float(table["a_ms"].fillna(0).sum()), float(table["b_ms"].fillna(0).sum())
    return {"a_ms": a_ms, "b_ms": b_ms, "delta_ms": b_ms - a_ms, "change": b_ms / a_ms - 1 if a_ms > 0 else None}


def total_within_noise(a: dict, b: dict) -> str:
    """A note when the headline change is within the run-to-run noise by the operators' rule: the two profiles'
    kernel time per iteration (coverage.json ``iteration_time_ns``) ranges [min, max] overlap; empty otherwise or
    without 2 measured iterations on both sides."""
    spread_a, spread_b = report_md.iteration_spread(a["coverage"]), report_md.iteration_spread(b["coverage"])
    if spread_a is None or spread_b is None:
        return ""
    if spread_b["min_ns"] > spread_a["max_ns"] or spread_b["max_ns"] < spread_a["min_ns"]:
        return ""
    return ('<p class="note" id="total-noise">The change of the total is <strong>within the run-to-run noise</strong>: '
            f"A's kernel time per iteration ranged {spread_a['min_ns'] / 1e6:.3f} – {spread_a['max_ns'] / 1e6:.3f} ms, "
            f"B's {spread_b['min_ns'] / 1e6:.3f} – {spread_b['max_ns'] / 1e6:.3f} ms, and the ranges overlap (the rule "
            "that tags an operator <em>same</em>).</p>")


def operator_changes(table: pd.DataFrame) -> dict[str, int]:
    """How many operators of a :func:`compare_table` are ``slower``, ``faster``, ``same``, ``only A``, ``only B``;
    the ``(unattributed)`` row is not an operator and is not counted (it stays in the table)."""
    rows = table[table["operator"] != report_md.UNATTRIBUTED]
    return {k: int(v) for k, v in rows["change"].value_counts().items()}


def _per_iteration(profile: dict, median: bool) -> tuple[str, float, int, bool]:
    """A profile's headline kernel time per iteration: (label, ns, measured iterations, no iteration ranges)."""
    run, coverage = profile["run"], profile["coverage"]
    iterations = report_md.measured_iterations(run, coverage)
    no_ranges = no_iteration_ranges(run, coverage)
    label, time_ns = headline_time(coverage, iterations, no_ranges, median=median)
    return label, time_ns, iterations, no_ranges


def _facts(profile: dict, median: bool) -> dict[str, str]:
    run, coverage = profile["run"], profile["coverage"]
    label, time_ns, iterations, no_ranges = _per_iteration(profile, median)
    facts = {"results folder": str(profile["folder"])}
    if run is not None:
        v = run["versions"]
        facts.update({
            "model": report_md._model_line(run)[len("- model: "):],
            **{f"workload.{k}": str(val) for k, val in sorted(run["workload"].items())},
            "device": v["device"] + (f" ({v['device_name']})" if v.get("device_name") else ""),
            "torch": str(v.get("torch")), "CUDA / driver": f"{v.get('cuda_runtime') or 'none'} / {v.get('driver') or 'n/a'}",
            "harness": f"{iterations} measured after {report_md.warmup_iterations(run)} warm-up"
                       + ("" if (run.get("warmup") or {}).get("steady", True) is not False else " (not steady)")
                       + f", seed {run['harness']['seed']}",
            "clocks": "not locked (CPU run)" if report_md.is_cpu_run(run) else report_md._clocks_text(profile["clocks"]),
            "determinism": (report_md.determinism_text(run) or "determinism: not recorded")[len("determinism: "):],
        })
    facts.update({
        # "2.307 ms / iteration (median)", "... (whole trace)": in the value, so the rows of A and B align. The
        # median iteration's total, not the headline (the sum of the operators' medians, compare_totals)
        "kernel time of the median iteration" if label.endswith("(median)") else "kernel time":
            f"{time_ns / 1e6:.3f} ms{label[len('kernel time'):]}",
        # per iteration: totals of runs with different iteration counts differ though each iteration is alike
        "kernels / iteration": kernels_per_iteration(coverage, iterations, no_ranges)[1],
        "attributed time": f"{coverage['coverage_time'] * 100:.2f}%",
        "counters": coverage.get("counters_note") or f"{(coverage.get('counters_coverage') or 0) * 100:.1f}% of kernels",
    })
    return facts


def _spread_notes(a: dict, b: dict, median: bool) -> str:
    """Each side's kernel time per iteration (median, min, max) and report.py's warning when it is skewed."""
    advice = ("this page compares the per-iteration medians, which one slow iteration does not move" if median else
              "this page compares means (a profile has no per-iteration medians), which it does move: profile "
              "again with more warm-up iterations")
    first = (report_md.FIRST_SLOWEST if median else "the first measured iteration is the slowest, as is usual right "
             "after the profiler starts; this page compares means (a profile has no per-iteration medians), which it "
             "moves")
    notes = []
    for name, profile in (("A", a), ("B", b)):
        spread = report_md.iteration_spread(profile["coverage"])
        for line in report_md._iteration_spread(profile["coverage"], advice, first):
            if line:
                notes.append(f'<p class="{"note" if warns(spread) else "muted"}" id="spread-{name.lower()}">'
                             f"<strong>{name}</strong>: {inline(line)}</p>")
    return "".join(notes)


def render_compare(a: dict, b: dict, top: int = TOP_BARS, forced: bool = False) -> str:
    """``compare.html``: profile ``b`` against profile ``a`` (dicts of ``folder``, ``workload``, ``run``,
    ``coverage``, ``operators``, ``clocks``). ``forced``: the identities differ and the user asked anyway."""
    import plotly.graph_objects as go

    it_a = report_md.measured_iterations(a["run"], a["coverage"])
    it_b = report_md.measured_iterations(b["run"], b["coverage"])
    median = compares_medians(a["operators"], b["operators"])
    table = compare_table(a["operators"], it_a, b["operators"], it_b)
    facts_a, facts_b = _facts(a, median), _facts(b, median)
    rows = []
    for key in dict.fromkeys([*facts_a, *facts_b]):
        va, vb = facts_a.get(key, ""), facts_b.get(key, "")
        mark = ' style="background:#fff7ed"' if va != vb and key != "results folder" else ""
        rows.append(f"<td{mark}>{esc(key)}</td><td>{inline(va)}</td><td>{inline(vb)}</td>")
    facts = _table([("", "text"), ("A (before)", "text"), ("B (after)", "text")], rows, "facts-table", sortable=False)
    warning = ""
    if forced:
        warning = (f'<div class="note">These are different workloads (A: {esc(workload_identity(a["run"], a["workload"]))}; '
                   f'B: {esc(workload_identity(b["run"], b["workload"]))}): compared on request (--force); '
                   "operators need not correspond.</div>")
    totals = compare_totals(table)
    per = "median" if median else "mean"
    total_label = f"kernel time / iteration (sum of operator {per}s)"
    changes = operator_changes(table)
    kpis = _kpis([(f"A: {total_label}", f"{totals['a_ms']:.3f} ms"),
                  (f"B: {total_label}", f"{totals['b_ms']:.3f} ms"),
                  ("change", f"{totals['delta_ms']:+.3f} ms ({totals['change'] * 100:+.1f}%)"
                   if totals["change"] is not None else f"{totals['delta_ms']:+.3f} ms"),
                  ("operators slower / faster / same", f"{changes.get('slower', 0)} / {changes.get('faster', 0)} / "
                                                      f"{changes.get('same', 0)}"),
                  ("operators only in A / only in B", f"{changes.get('only A', 0)} / {changes.get('only B', 0)}")])
    if median:
        basis = ("Times are each operator's <strong>per-iteration median</strong> (its time in each measured "
                 "iteration, <code>iteration_median_ns</code> of operators.parquet): one slow iteration does not "
                 "move them, and profiles with different iteration counts compare.")
    else:
        basis = ("Times are <strong>per-iteration means</strong> (each profile's total divided by its measured "
                 "iterations): a profile has no per-iteration medians (<code>aggregate.per_iteration</code> off, or "
                 "a trace without iteration ranges), so one slow iteration moves them.")
    basis += (f" The headline figures are the sums of the table's {per} column for A and B over every row "
              "(<code>(unattributed)</code> included; an operator absent from a side counts 0), so the headline change "
              "is the sum of the rows' deltas.")
    rule = change_rule(table.attrs["ranges"])
    tolerance = (f"Run-to-run noise is tagged <em>same</em> and not plotted: {esc(rule)}.")
    shown = table[table["change"].ne("same") & table["delta_ms"].ne(0)].head(top)
    fig = go.Figure(go.Bar(
        x=list(shown["delta_ms"])[::-1], y=[esc(label) for label in bar_labels(list(shown["operator"]))][::-1],
        orientation="h", marker_color=["#dc2626" if d > 0 else "#16a34a" for d in shown["delta_ms"]][::-1],
        hovertext=[hover_text(o, f"A {_fmt(x, 3) or '-'} ms → B {_fmt(y, 3) or '-'} ms ({d:+.3f} ms, {c})")
                   for o, x, y, d, c in zip(shown["operator"], shown["a_ms"], shown["b_ms"], shown["delta_ms"],
                                            shown["change"])][::-1], hoverinfo="text"))
    fig.update_layout(height=max(260, 26 * len(shown) + 110), margin={"l": 10, "r": 30, "t": 30, "b": 50},
                      xaxis_title=f"change of the {'median' if median else 'mean'} time per iteration, B - A (ms); "
                                  "red: slower, green: faster",
                      yaxis={"automargin": True, "type": "category"})
    counters = [(m, label, scale) for m, label, scale in COUNTER_COLUMNS if f"{m}_delta" in table
                and table[f"{m}_delta"].notna().any()]
    headers = [("operator", "text"), ("change", "text"), (f"A ({per} ms / it)", "num"), (f"B ({per} ms / it)", "num"),
               ("delta (ms)", "num"), ("ratio B/A", "num")]
    headers += [(f'Δ {esc(label)}<span class="metric">B - A</span>', "num") for _, label, _ in counters]
    tags = {"only A": '<span class="tag only">only in A</span>', "only B": '<span class="tag only">only in B</span>',
            "slower": '<span class="tag slower">slower</span>', "faster": '<span class="tag faster">faster</span>',
            "same": '<span class="tag">same</span>'}
    body = []
    for r, shown in zip(table.to_dict("records"), report_md.short_names(table["operator"])):
        cells = (_name_cell(r["operator"], shown)
                 + f'<td data-v="{esc(r["change"])}">{tags[r["change"]]}</td>'
                 + _num_cell(r["a_ms"], _fmt(r["a_ms"], 3)) + _num_cell(r["b_ms"], _fmt(r["b_ms"], 3))
                 + _num_cell(r["delta_ms"], f"{r['delta_ms']:+.3f}")
                 + _num_cell(r["ratio"], "" if _missing(r["ratio"]) else f"{r['ratio']:.2f}x"))
        cells += "".join(_num_cell(r[f"{m}_delta"], "" if _missing(r[f"{m}_delta"]) else f"{r[f'{m}_delta'] * scale:+.1f}")
                         for m, _, scale in counters)
        body.append(cells)
    title = f"Operator profile comparison: {a['workload']}" + (f" vs {b['workload']}" if b["workload"] != a["workload"] else "")
    sections = [
        f'<section id="runs"><h2>The two profiles</h2>{warning}{kpis}'
        f'{total_within_noise(a, b)}<p id="compare-basis">{basis} {tolerance}</p>{_spread_notes(a, b, median)}'
        '<p class="muted">Highlighted rows differ.</p>'
        f"{facts}</section>",
        '<section id="changes"><h2>Largest time changes</h2>' + (
            _figure(fig, "fig-compare-delta") if len(shown) else
            '<p class="note">No operator\'s time changed beyond the noise tolerance.</p>')
        + "</section>",
        f'<section id="operators"><h2>{_operators_title(table["operator"])}</h2><p class="muted">Sorted by the size of the '
        "change; click a column header to sort. An operator that ran on one side only counts 0 ms on the other."
        f'</p>{_table(headers, body, "compare-table", scroll=True)}</section>',
    ]
    subtitle = f"A: {esc(a['folder'])} &nbsp;→&nbsp; B: {esc(b['folder'])}"
    return _page(title, subtitle, [("runs", "Profiles"), ("changes", "Largest changes"), ("operators", "Operators")],
                 "".join(sections))


HTML_SUFFIXES = (".html", ".htm")


def html_output(out: str | Path, example: str = "report.html", results: str | Path | None = None) -> Path:
    """The path of an HTML page to write (``report.html``, ``compare.html``), checked before anything is read or
    written: a name ending in ``.html``/``.htm`` (so no input table, JSON or other file is ever overwritten by a
    page), not a folder, in a folder that exists, and not the ``report.html`` of a results folder (one holding
    ``operators.parquet``) other than ``results`` (the folder the page is of; None: any), which Snakemake would
    then take as up to date. Errors name ``out`` as given.

    Raises:
        InputError: an empty path, a folder, another suffix, a missing parent folder, or another results
            folder's report.html.
    """
    text = str(out)
    if not text.strip():
        raise InputError(f"--out {text!r} is empty; name the HTML page to write, e.g. -o {example}")
    path = Path(text)
    if text.endswith(("/", os.sep)) or path.name in ("", ".", "..") or path.is_dir():
        raise InputError(f"--out {text} is a folder; name the HTML page to write, e.g. -o {path / example}")
    if path.suffix.lower() not in HTML_SUFFIXES:
        raise InputError(f"--out {text} does not end in .html; the page is only written to an .html (or .htm) "
                         f"file, so that no other file is overwritten: e.g. -o {example}")
    if not path.parent.is_dir():
        raise InputError(f"--out {text}: the folder {path.parent} does not exist; create it first, or choose "
                         "another --out")
    if (path.name.lower() == "report.html" and (path.parent / "operators.parquet").is_file()
            and (results is None or path.parent.resolve() != Path(results).resolve())):
        raise InputError(f"--out {text} is the report.html of the results folder {path.parent} (the workflow's "
                         "output, which Snakemake would then take as up to date); write the page elsewhere, e.g. "
                         f"-o {example}")
    return path
