"""What both reports show of the work per operator and the roofline (operators.parquet's work and roofline
columns, :mod:`operator_profiler.roofline`; coverage.json ``work``): which operators get a point on the roofline
plot and why the others do not, the ceilings the operators were held against, the figures in words, and the
statement of what is analytic and what is measured.

The ceilings come from the operators table itself (``ceiling_flops_per_s`` per ``work_dtype``,
``ceiling_bytes_per_s``): the very figures each operator's bound and fraction were computed with, so the plot's
lines and the table's percentages cannot disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from .. import roofline

#: The columns a roofline view needs; an operators table without them predates the work columns.
NEEDED = ("flops", "bytes", "work_known", "achieved_flops_per_s", "achieved_bytes_per_s", "intensity")
NO_WORK = ("no work computed: operators.parquet has no work columns (results from an older version: re-run the "
           "workflow)")


def has_work(operators: pd.DataFrame) -> bool:
    """The operators table carries the work columns (``aggregate`` with ``work/kernels.parquet``)."""
    return all(c in operators for c in NEEDED)


def cache_controls(replays: list[dict] | None) -> list[str]:
    """The ``ncu --cache-control`` values the replays ran with (replay.json ``cache_control``; replays written
    before it was recorded ran ncu's default, ``all``)."""
    return sorted({str(r.get("cache_control") or "all") for r in replays or []})


def _cache_words(controls: list[str]) -> str:
    if controls == ["none"]:
        return ("; DRAM bytes and hit rates with warm caches (`ncu --cache-control none`), so they can vary "
                "between the replay's passes")
    if controls == ["all"]:
        return ("; DRAM bytes and hit rates are **cold-cache** values: ncu flushed the caches before every "
                "replay pass (`--cache-control all`), so data a kernel found in L2 in the model is read from DRAM "
                "here (config `ncu.cache_control: none` for warm caches)")
    if controls:
        return f"; replays ran with different cache controls ({', '.join(controls)}): their DRAM bytes do not compare"
    return ""


def analytic_and_measured(cuda: bool, cache_control: list[str] | None = None) -> str:
    """One paragraph (Markdown inline markup): which figures are analytic and which are measured (``cache_control``:
    :func:`cache_controls` of the replays, stated beside the counters)."""
    parts = ["kernel **time** (the timeline's durations)",
             "the **ceilings** (`ceilings.json`: timed GEMM and STREAM-like copy/triad microbenchmarks on this machine)"]
    if cuda:
        parts.append(f"the **Nsight Compute counters** (SOL %, DRAM bytes, occupancy{_cache_words(cache_control or [])})")
    measured = ", ".join(parts[:-1]) + " and " + parts[-1]
    return ("**Analytic** (computed, not measured): the **FLOPs** and **bytes** of each operator, from the recorded "
            "input shapes and dtypes of its calls: PyTorch's FLOP formulas (`torch.utils.flop_counter`: matrix "
            "products, convolutions, attention) and one documented count per element for the other ops; bytes "
            "are the ideal bytes (each input and output read or written once; a fused Inductor kernel's own "
            f"buffers). **Measured**: the {measured}. Achieved FLOP/s and bytes/s are analytic work over measured "
            "time: traffic beyond the ideal bytes (re-reads, spills, layout copies) is not in them. See "
            "docs/work.md.")


def si(value: float | None, unit: str, digits: int = 3) -> str:
    """``value`` with an SI prefix and ``digits`` significant digits: ``32.6 MFLOP``, ``45.6 GFLOP/s``; empty
    for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if value == 0:
        return f"0 {unit}"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def percent(fraction: float | None) -> str:
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return ""
    return f"{fraction * 100:.0f}%" if fraction >= 0.1 else f"{fraction * 100:.2g}%"


@dataclass
class Ceilings:
    """The ceilings the operators were held against: ``compute`` [(name, dtype, FLOP/s)] by FLOP/s, the memory
    ``bandwidth`` (bytes/s, None when not measured), and coverage.json's ``source`` (file) and ``threads``."""

    compute: list[tuple[str, str, float]] = field(default_factory=list)
    bandwidth: float | None = None
    source: str | None = None
    threads: int | None = None

    @property
    def measured(self) -> bool:
        return bool(self.compute) or self.bandwidth is not None

    def ridge(self, flops_per_s: float) -> float | None:
        """The intensity (FLOP/byte) where the memory roof meets a compute ceiling."""
        return flops_per_s / self.bandwidth if self.bandwidth else None

    def words(self) -> str:
        """``fp32 GEMM peak 50 GFLOP/s, memory bandwidth 12 GB/s``."""
        parts = [f"{name} {si(value, 'FLOP/s')}" for name, _, value in self.compute]
        if self.bandwidth is not None:
            parts.append(f"memory bandwidth {si(self.bandwidth, 'B/s')}")
        return ", ".join(parts)


def table_ceilings(operators: pd.DataFrame, coverage: dict) -> Ceilings:
    """The ceilings of the operators table: one compute ceiling per ``work_dtype`` whose ``ceiling_flops_per_s``
    is set, the ``ceiling_bytes_per_s`` (one value: roofline.with_roofline holds every operator against the same
    bandwidth), then the other measured ceilings coverage.json ``work`` lists, and the file and thread count it
    names."""
    work = coverage.get("work") or {}
    out = Ceilings(source=work.get("ceilings"), threads=work.get("ceilings_threads"))
    if "ceiling_flops_per_s" in operators and "work_dtype" in operators:
        rows = operators[operators["ceiling_flops_per_s"].notna() & operators["work_dtype"].notna()]
        for dtype, value in sorted({(str(d), float(v)) for d, v in zip(rows["work_dtype"], rows["ceiling_flops_per_s"])},
                                   key=lambda dv: dv[1]):
            name = roofline.compute_ceiling({"compute_flops_per_s": {dtype: value}}, dtype)[0] or f"{dtype} peak"
            out.compute.append((name, dtype, value))
    # the other measured ceilings (dtypes no operator ran in), which coverage.json work lists
    held = {dtype for _, dtype, _ in out.compute}
    for dtype, value in (work.get("compute_flops_per_s") or {}).items():
        if dtype not in held and isinstance(value, (int, float)) and value > 0:
            name = roofline.compute_ceiling({"compute_flops_per_s": {dtype: value}}, dtype)[0]
            out.compute.append((name, dtype, float(value)))
    out.compute.sort(key=lambda c: c[2])
    if "ceiling_bytes_per_s" in operators:
        bandwidths = sorted({float(v) for v in operators["ceiling_bytes_per_s"].dropna()})
        out.bandwidth = bandwidths[-1] if bandwidths else None
    if out.bandwidth is None and work.get("memory_bytes_per_s"):
        out.bandwidth = float(work["memory_bytes_per_s"])
    return out


@dataclass
class RooflineRows:
    """The operators table split for the plot: ``points`` (FLOPs and bytes known, both > 0, time > 0: at their
    intensity), ``data_movement`` (0 FLOPs, bytes > 0: not on a log intensity axis, drawn at its left edge),
    ``no_work`` (known work of 0 FLOPs and 0 bytes: views, or work counted on another operator's kernel),
    ``not_placed`` (known work that cannot be placed, with ``reason``) and ``unknown`` (work not known, with
    ``work_note``)."""

    points: pd.DataFrame
    data_movement: pd.DataFrame
    no_work: pd.DataFrame
    not_placed: pd.DataFrame
    unknown: pd.DataFrame


def roofline_rows(operators: pd.DataFrame) -> RooflineRows:
    """Split ``operators`` (with the work columns, :func:`has_work`) as :class:`RooflineRows` says."""
    known = operators["work_known"].fillna(False).astype(bool)
    flops, nbytes = operators["flops"].fillna(0), operators["bytes"].fillna(0)
    timed = operators["achieved_bytes_per_s"].notna() | operators["achieved_flops_per_s"].notna()
    points = known & (flops > 0) & (nbytes > 0) & timed
    moves = known & (flops == 0) & (nbytes > 0) & timed
    none = known & (flops == 0) & (nbytes == 0)
    rest = known & ~points & ~moves & ~none
    not_placed = operators[rest].copy()
    not_placed["reason"] = ["no measured time (its kernels' times are unknown)" if not t else
                            "FLOPs without bytes: its intensity is unbounded"
                            for t in timed[rest]]
    unknown = operators[~known].copy()
    unknown["work_note"] = unknown["work_note"].fillna("no work computed for its kernels") \
        if "work_note" in unknown else "no work computed for its kernels"
    return RooflineRows(operators[points], operators[moves], operators[none], not_placed, unknown)


def reading(row: dict) -> str:
    """The operator's ``roofline`` line without its leading ``<operator>: `` (the reports show the name apart)."""
    text = row.get("roofline")
    if not isinstance(text, str):
        return ""
    return text.removeprefix(f"{row['operator']}: ")


def thread_mismatch(ceilings: Ceilings, run: dict | None) -> str:
    """A warning when the CPU ceilings were measured with another thread count than the profile's torch used
    (run.json ``versions.cpu_threads``): the fractions then hold one thread count against another's peak."""
    if run is None or run["versions"].get("device") != "cpu" or not ceilings.threads:
        return ""
    used = run["versions"].get("cpu_threads")
    if not used or int(used) == int(ceilings.threads):
        return ""
    return (f"the ceilings were measured with {ceilings.threads} CPU thread(s), the profile ran torch with {used}: "
            "the fractions of the ceilings compare unlike figures (re-measure the ceilings with the profile's threads)")


def above_ceiling(operators: pd.DataFrame, names: dict | None = None) -> str:
    """The warning when operators run above a measured ceiling they cannot beat (operators.parquet
    ``ceiling_exceeded``, :func:`operator_profiler.roofline.with_roofline`): each with its percentage and ceiling,
    what that says of the ceiling, and how to re-measure; empty when none does (or the table predates the
    column). ``names``: operator -> the name to show."""
    if "ceiling_exceeded" not in operators:
        return ""
    rows = operators[operators["ceiling_exceeded"].fillna(False).astype(bool)]
    if rows.empty:
        return ""
    names = names or {}
    listed = ", ".join(f"{names.get(r['operator'], r['operator'])} at {r['ceiling_fraction'] * 100:.0f} % of "
                       f"{r['ceiling']}" for r in rows.to_dict("records"))
    return (f"{len(rows)} operator(s) above the measured ceiling they are held against ({listed}): no kernel beats "
            "the peak it is measured against, so the ceiling was likely measured low (under load?) or part of the "
            f"work ran in other operators' kernels; {roofline.REMEASURE}")


def ceilings_warnings(coverage: dict) -> list[str]:
    """ceilings.json's own warnings (coverage.json ``work.ceilings_warnings``: small sizes, a trial under load,
    emulated bf16, another machine's rerun identity)."""
    return [str(w) for w in (coverage.get("work") or {}).get("ceilings_warnings") or []]


def markdown_lines(operators: pd.DataFrame, coverage: dict, run: dict | None, iterations: int, top: int,
                   names, replays: list[dict] | None = None) -> list[str]:
    """report.md's "Work and roofline" section (``names``: the operators' names as the report cuts them,
    :func:`operator_profiler.report.markdown.short_names`; ``replays``: the ncu replay records)."""
    cuda = run is not None and run["versions"].get("device") == "cuda"
    lines = ["## Work and roofline", "", analytic_and_measured(cuda, cache_controls(replays)), ""]
    if not has_work(operators):
        return lines + [NO_WORK[0].upper() + NO_WORK[1:] + ".", ""]
    work = coverage.get("work") or {}
    rows = roofline_rows(operators)
    per_it = max(iterations, 1)
    known = operators[operators["work_known"].fillna(False).astype(bool)]
    flops = work.get("flops_per_iteration", float(known["flops"].sum()) / per_it)
    nbytes = work.get("bytes_per_iteration", float(known["bytes"].sum()) / per_it)
    line = f"- analytic work per measured iteration: {si(flops, 'FLOP')}"
    if work.get("flops_by_pytorch_formulas_per_iteration") is not None:
        line += f" ({si(work['flops_by_pytorch_formulas_per_iteration'], 'FLOP')} of it by PyTorch's FLOP formulas)"
    lines.append(line + f", {si(nbytes, 'B')} ideal bytes")
    if work.get("known_time_share") is not None:
        lines.append(f"- work known for {work['known_time_share'] * 100:.1f}% of kernel time "
                     f"({work.get('kernels_without_work', 0):,} kernels without known work)")
    ceilings = table_ceilings(operators, coverage)
    if ceilings.measured:
        where = f" from `{ceilings.source}`" if ceilings.source else ""
        threads = f", measured with {ceilings.threads} thread(s)" if ceilings.threads else ""
        lines.append(f"- ceilings: {ceilings.words()}{threads}{where}")
        lines += [f"- the ceilings' measurement warns: {w}" for w in ceilings_warnings(coverage)]
        mismatch = thread_mismatch(ceilings, run)
        if mismatch:
            lines.append(f"- **warning**: {mismatch}")
        above = above_ceiling(operators, {op: f"`{name}`" for op, name in zip(operators["operator"], names)})
        if above:
            lines.append(f"- **warning**: {above}")
    else:
        lines.append("- ceilings: **not measured** (no ceilings.json given to aggregate): no bound and no fraction "
                     "of a ceiling, only the achieved rates")
    shown = operators.head(top)
    cut = dict(zip(operators["operator"], names))
    lines += ["", f"Top {len(shown)} operators by time (achieved rates: analytic work over kernel time):", "",
              "| operator | share | GFLOP/s | GB/s | FLOP/byte | roofline |", "|---|---|---|---|---|---|"]
    for r in shown.to_dict("records"):
        flops_s, bytes_s, intensity = (r.get(c) for c in ("achieved_flops_per_s", "achieved_bytes_per_s", "intensity"))
        rates = f"{_fixed(flops_s, 1e9)} | {_fixed(bytes_s, 1e9)} | {_fixed(intensity, 1)}"
        if r.get("work_known") and not r.get("flops") and not r.get("bytes"):
            rates = "– | – | –"  # its work is counted elsewhere: 0 GB/s would read as a slow operator
        lines.append(f"| `{cut[r['operator']]}` | {r['time_share'] * 100:.2f}% | {rates} | "
                     f"{reading(r) if r.get('work_known') else 'work unknown'} |")
    if len(rows.unknown):
        lines += ["", "Work **unknown** (no roofline figures; never a figure from part of an operator's kernels):", ""]
        lines += [f"- `{cut[r['operator']]}`: {r['work_note']}" for r in rows.unknown.to_dict("records")]
    if len(rows.not_placed):
        lines += ["", "Work known but not placed on the roofline:", ""]
        lines += [f"- `{cut[r['operator']]}`: {r['reason']}" for r in rows.not_placed.to_dict("records")]
    return lines + measured_lines(operators, cut) + [""]


def measured_lines(operators: pd.DataFrame, cut: dict) -> list[str]:
    """CUDA with counters: the operators whose measured work (ncu DRAM bytes, FP instruction FLOPs) is far from
    the analytic (roofline.measured_vs_analytic), with the ratios; a line saying none is, when all compared."""
    if "bytes_ratio" not in operators:
        return []
    compared = operators[operators["bytes_ratio"].notna() | operators["flops_ratio"].notna()]
    if compared.empty:
        return ["", "Analytic vs measured work: no operator had counters for all kernels of its calls."]
    flagged = compared[compared["work_check"].notna()]
    lines = ["", f"Analytic vs measured work (ncu: `dram__bytes.sum`, FP32/FP16 add, mul and FMA thread "
                 f"instructions), over the calls whose every kernel had counters: {len(compared)} operators "
                 f"compared, {len(flagged)} far from 1 (outside 0.5-1.5x):"]
    if flagged.empty:
        return lines[:-1] + [lines[-1].rstrip(":") + "."]
    lines.append("")
    for r in flagged.to_dict("records"):
        lines.append(f"- `{cut.get(r['operator'], r['operator'])}`: {r['work_check']}")
    return lines


def _fixed(value, scale: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    v = value / scale
    return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
