"""Work per operator and its place on the roofline of the measured machine ceilings.

Per operator (summed over its kernels, every measured iteration): ``flops`` and ideal ``bytes`` (the
analytic work of :mod:`operator_profiler.work`), achieved FLOP/s and bytes/s over its kernel time,
arithmetic ``intensity`` (FLOP/byte). With ``ceilings.json`` (rule measure_ceilings): the compute ceiling of
the operator's dtype and the memory bandwidth; ``bound`` is ``compute`` when the intensity reaches the ridge
point (ceiling FLOP/s / bandwidth), else ``memory``; ``ceiling_fraction`` is the achieved share of the
attainable performance there (FLOP/s of the compute ceiling, or bytes/s of the bandwidth); ``roofline`` is the
one-line reading. An operator whose work is not fully known gets no roofline figures, with ``work_note`` saying
why: never a figure from part of its kernels.
"""

from __future__ import annotations

import pandas as pd

WORK_COLUMNS = ["flops", "bytes", "flops_formula", "flops_per_iteration", "bytes_per_iteration",
                "achieved_flops_per_s", "achieved_bytes_per_s", "intensity", "work_dtype", "work_known", "work_note"]
ROOFLINE_COLUMNS = ["ceiling", "ceiling_flops_per_s", "ceiling_bytes_per_s", "ridge_intensity", "bound",
                    "ceiling_fraction", "ceiling_exceeded", "roofline"]
#: The advice of a reading above a ceiling the operator cannot beat.
REMEASURE = "re-measure: snakemake --forcerun measure_ceilings"
_DTYPE_LABEL = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "tf32": "tf32"}


def operator_work(attribution: pd.DataFrame, work: pd.DataFrame, key: str = "operator") -> pd.DataFrame:
    """Per ``key`` value: the work columns (:data:`WORK_COLUMNS` without the achieved rates)."""
    df = attribution[["kernel_id", key, "duration_ns", "iteration"]].merge(work, on="kernel_id", how="left")
    df[key] = df[key].fillna("(unattributed)")
    iterations = max(int(df["iteration"].dropna().nunique()), 1)
    rows = []
    for name, g in df.groupby(key, sort=False):
        unknown = g["flops"].isna() | g["bytes"].isna()
        notes = sorted({str(n) for n in g.loc[unknown, "work_note"].dropna()})
        known = not bool(unknown.any())
        with_work = g[g["flops"].fillna(0) > 0]
        dtypes = (with_work if len(with_work) else g[g["bytes"].fillna(0) > 0]).groupby("dtype")["flops"].sum()
        rows.append({
            key: name,
            "flops": float(g["flops"].sum()) if known else None,
            "bytes": float(g["bytes"].sum()) if known else None,
            "flops_formula": float(g["flops_formula"].sum()) if known else None,
            "work_dtype": str(dtypes.idxmax()) if len(dtypes) else None,
            "work_known": known,
            "work_note": None if known else (f"work unknown for {int(unknown.sum())} of {len(g)} kernels: "
                                             + ("; ".join(notes[:3]) or "no work computed")),
        })
    out = pd.DataFrame(rows, columns=[key, "flops", "bytes", "flops_formula", "work_dtype", "work_known", "work_note"])
    for c in ("flops", "bytes", "flops_formula"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    out["flops_per_iteration"] = out["flops"] / iterations
    out["bytes_per_iteration"] = out["bytes"] / iterations
    return out


def with_work(table: pd.DataFrame, attribution: pd.DataFrame, work: pd.DataFrame, key: str = "operator") -> pd.DataFrame:
    """``table`` (with ``time_ns``) plus :data:`WORK_COLUMNS`."""
    out = table.merge(operator_work(attribution, work, key), on=key, how="left")
    seconds = out["time_ns"].astype("float64") / 1e9
    out["achieved_flops_per_s"] = (out["flops"] / seconds).where(seconds > 0)
    out["achieved_bytes_per_s"] = (out["bytes"] / seconds).where(seconds > 0)
    out["intensity"] = (out["flops"] / out["bytes"]).where(out["bytes"] > 0)
    out["work_known"] = out["work_known"].fillna(False).astype(bool)
    return out


def compute_ceiling(ceilings: dict, dtype: str | None) -> tuple[str | None, float | None]:
    """(name, FLOP/s) of the measured compute ceiling for ``dtype``: its GEMM peak."""
    peaks = ceilings.get("compute_flops_per_s") or {}
    if dtype in peaks and peaks[dtype]:
        return f"{_DTYPE_LABEL.get(dtype, dtype)} GEMM peak", float(peaks[dtype])
    return None, None


def cache_bytes(ceilings: dict) -> int | None:
    """The cache the bandwidth benchmark streams past (bytes): the CPU's last-level cache (all instances) or the
    GPU's L2, from ceilings.json ``machine``; None when not recorded."""
    described = ceilings.get("machine")
    part, key = ("gpu", "l2_cache_bytes") if ceilings.get("device") == "cuda" else ("last_level_cache", "bytes")
    found = described.get(part) if isinstance(described, dict) else None
    value = found.get(key) if isinstance(found, dict) else None  # (the contract leaves machine's shape free)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def memory_ceiling(ceilings: dict) -> float | None:
    memory = ceilings.get("memory_bytes_per_s") or {}
    best = memory.get("best") or max((v for v in memory.values() if isinstance(v, (int, float))), default=None)
    return float(best) if best else None


def check_ceilings(ceilings: dict, source: str) -> None:
    """The figures the roofline uses: ``compute_flops_per_s`` and ``memory_bytes_per_s``, non-empty, positive finite
    numbers.

    Raises:
        InputError: naming ``source`` and the field."""
    import math

    from .errors import InputError

    for field in ("compute_flops_per_s", "memory_bytes_per_s"):
        values = ceilings.get(field)
        bad = (not isinstance(values, dict) or not values or
               any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0
                   for v in values.values()))
        if bad:
            raise InputError(f"{source}: {field} is {json_text(values)}, not a non-empty map of positive numbers "
                             "(FLOP/s or bytes/s); measure again: snakemake --forcerun measure_ceilings "
                             "(or opprof ceilings --out FILE)")


def json_text(value) -> str:
    import json

    text = json.dumps(value, default=str)
    return text if len(text) < 80 else text[:77] + "..."


def with_roofline(table: pd.DataFrame, ceilings: dict | None, key: str = "operator") -> pd.DataFrame:
    """``table`` (with the work columns) plus :data:`ROOFLINE_COLUMNS`; all null without ``ceilings``.

    ``ceiling_fraction`` is the achieved share of the bound's ceiling (FLOP/s over FLOP/s, or bytes/s over bytes/s).
    No kernel beats the peak it was measured against, so an operator above 100 % of a ceiling it cannot beat gets
    ``ceiling_exceeded`` true and a reading saying the ceiling was likely measured low (under load?) or part of its
    work ran in other operators' kernels, with how to re-measure: above its compute peak always; above the
    bandwidth only when its ideal bytes per call (``bytes`` / ``calls``) exceed the cache (:func:`cache_bytes`),
    since a working set that stays in cache is read faster than the bandwidth benchmark, sized beyond the caches,
    streams (the reading says so instead)."""
    out = table.copy()
    cols = {c: [None] * len(out) for c in ROOFLINE_COLUMNS}
    bandwidth = memory_ceiling(ceilings) if ceilings else None
    cache = cache_bytes(ceilings) if ceilings else None
    for i, r in enumerate(out.to_dict("records")):
        if not ceilings:
            cols["roofline"][i] = "no measured ceilings"
            continue
        if not r.get("work_known"):
            cols["roofline"][i] = f"{r[key]}: {r.get('work_note') or 'work unknown'}"
            continue
        flops, nbytes = r["flops"], r["bytes"]
        if not flops and not nbytes:
            cols["roofline"][i] = f"{r[key]}: no work of its own (views, or its call's work is on another kernel)"
            continue
        name, peak = compute_ceiling(ceilings, r.get("work_dtype"))
        cols["ceiling_bytes_per_s"][i] = bandwidth
        cols["ceiling_flops_per_s"][i] = peak
        ridge = peak / bandwidth if peak and bandwidth else None
        cols["ridge_intensity"][i] = ridge
        intensity = r.get("intensity")
        if flops and (ridge is None or intensity is None or intensity >= ridge) and peak:
            fraction = r["achieved_flops_per_s"] / peak
            cols["bound"][i], cols["ceiling"][i], cols["ceiling_fraction"][i] = "compute", name, fraction
            cols["ceiling_exceeded"][i] = bool(fraction > 1)
            cols["roofline"][i] = f"{r[key]}: {fraction:.0%} of {name}, compute-bound"
            if fraction > 1:  # no kernel beats the peak: the ceiling or the work is not this operator's
                cols["roofline"][i] += f"; {above_ceiling('peak', fraction)}"
        elif bandwidth and (flops == 0 or (ridge is not None and intensity is not None and intensity < ridge)):
            fraction = r["achieved_bytes_per_s"] / bandwidth
            cols["bound"][i], cols["ceiling"][i], cols["ceiling_fraction"][i] = "memory", "memory bandwidth", fraction
            detail = ("moves data only" if not flops else
                      f"intensity {intensity:.3g} FLOP/byte < ridge {ridge:.3g}")
            per_call = nbytes / r["calls"] if r.get("calls") and not pd.isna(r["calls"]) and r["calls"] > 0 else None
            exceeded = bool(fraction > 1 and cache is not None and per_call is not None and per_call > cache)
            cols["ceiling_exceeded"][i] = exceeded
            if exceeded:  # its data cannot stay in cache between its reads: the bandwidth is the roof
                detail += (f"; its {per_call / 2**20:.3g} MiB per call exceed the {cache / 2**20:.3g} MiB cache: "
                           + above_ceiling("bandwidth", fraction))
            elif fraction > 1 and cache is not None and per_call is not None:
                # a working set that stays in cache is read faster than DRAM streams
                detail += (f"; above the measured bandwidth: its {per_call / 2**20:.3g} MiB per call fit the "
                           f"{cache / 2**20:.3g} MiB cache, served from there")
            elif fraction > 1:  # no cache size (or no call count) to tell a cached working set from a bad ceiling
                detail += ("; above the measured bandwidth: whether its data stays in cache is not known (" +
                           ("the ceilings record no last-level cache size" if cache is None else
                            "its bytes per call are not known") + "), so the ceiling may be under-measured")
            cols["roofline"][i] = f"{r[key]}: {fraction:.0%} of memory bandwidth, memory-bound ({detail})"
        else:
            cols["roofline"][i] = f"{r[key]}: " + (
                f"no measured compute ceiling for {r.get('work_dtype') or 'its dtype'}" if flops
                else "no measured memory bandwidth")
    for c, values in cols.items():
        out[c] = values
    for c in ("ceiling_flops_per_s", "ceiling_bytes_per_s", "ridge_intensity", "ceiling_fraction"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    out["ceiling_exceeded"] = pd.array(out["ceiling_exceeded"], dtype="boolean")
    return out


def above_ceiling(what: str, fraction: float) -> str:
    """The reading of an operator above a ceiling it cannot beat (``what``: ``peak`` or ``bandwidth``)."""
    return (f"above the measured {what} ({fraction * 100:.0f} %): the ceiling was likely measured low (under load?) "
            f"or part of the work ran in other operators' kernels; {REMEASURE}")


def work_summary(attribution: pd.DataFrame, work: pd.DataFrame, ceilings: dict | None, ceilings_source: str | None) -> dict:
    """coverage.json ``work``: the share of kernel time whose work is known, FLOPs and bytes per iteration."""
    df = attribution[["kernel_id", "duration_ns", "iteration"]].merge(work, on="kernel_id", how="left")
    total = float(df["duration_ns"].sum())
    known = df["flops"].notna() & df["bytes"].notna()
    iterations = max(int(df["iteration"].dropna().nunique()), 1)
    return {
        "known_time_share": float(df.loc[known, "duration_ns"].sum() / total) if total else 0.0,
        "kernels_without_work": int((~known).sum()),
        "flops_per_iteration": float(df.loc[known, "flops"].sum() / iterations),
        "flops_by_pytorch_formulas_per_iteration": float(df.loc[known, "flops_formula"].sum() / iterations),
        "bytes_per_iteration": float(df.loc[known, "bytes"].sum() / iterations),
        "rules": {str(k): int(v) for k, v in df["work_rule"].fillna("unknown").value_counts().items()},
        "ceilings": ceilings_source,
        "ceilings_threads": (ceilings or {}).get("threads"),
        # what the measurement itself warns of (a trial under load, small sizes, emulated bf16): the reports show it
        "ceilings_warnings": [str(w) for w in (ceilings or {}).get("warnings") or []],
        # every measured ceiling, also of dtypes no operator ran in (the report draws them all)
        "compute_flops_per_s": dict((ceilings or {}).get("compute_flops_per_s") or {}) or None,
        "memory_bytes_per_s": memory_ceiling(ceilings) if ceilings else None,
    }


MEASURED_COLUMNS = ["measured_dram_bytes", "analytic_bytes_measured", "bytes_ratio", "measured_fp_flops",
                    "analytic_flops_measured", "flops_ratio", "work_check"]
#: measured / analytic outside [LOW, HIGH] is flagged
LOW, HIGH = 0.5, 1.5
#: FLOPs per thread instruction, as Nsight Compute's own roofline sections weight them: FP32 FADD, FMUL 1 and FFMA 2
#: (SpeedOfLight_HierarchicalSingleRooflineChart: ``derived__..._ffma_pred_on_x2``); the half-precision ones are
#: two-wide (HADD2, HMUL2, HFMA2: a half2 pair per thread), so HADD2 and HMUL2 are 2 and HFMA2 4
#: (SpeedOfLight_HierarchicalHalfRooflineChart: achieved FP16 FLOPs = hadd x2 + hmul x2 + hfma x4, its derived
#: metrics ``derived__..._hadd_pred_on_x2``, ``_hmul_pred_on_x2``, ``_hfma_pred_on_x4``).
_FP_FLOPS = {"fp32_add": 1, "fp32_mul": 1, "fp32_fma": 2, "fp16_add": 2, "fp16_mul": 2, "fp16_fma": 4}


def measured_vs_analytic(attribution: pd.DataFrame, work: pd.DataFrame, counters: pd.DataFrame, catalog,
                         key: str = "operator") -> pd.DataFrame:
    """Per ``key``: measured DRAM bytes and FP FLOPs (ncu, :data:`MEASURED_COLUMNS`) against the analytic work of
    the same kernels, and a ``work_check`` reading when the ratio is far from 1.

    Only calls whose every kernel has the counter are compared (a call's analytic work sits on one of its
    kernels), so a partial replay never makes a ratio of different kernel sets. Measured FLOPs (``measured_fp_flops``,
    FLOPs over every measured iteration) are the FP32 and FP16 add, multiply and FMA thread instructions weighted
    as Nsight Compute's SpeedOfLight roofline sections weight them (:data:`_FP_FLOPS`): FADD and FMUL 1, FFMA 2;
    the two-wide half-precision HADD2 and HMUL2 2, HFMA2 4 (the half-precision roofline chart section: achieved
    FP16 FLOPs = hadd x2 + hmul x2 + hfma x4). Tensor-core work is not in them, which the reading says where the
    tensor pipe ran. ``measured_dram_bytes`` is bytes; the ratios are measured over analytic (dimensionless).
    Counters the catalog does not resolve are left out (no column: no figure); raises nothing of its own."""
    resolved = catalog.resolve(counters.columns)
    df = attribution[["kernel_id", key]].assign(**{key: attribution[key].fillna("(unattributed)")}).merge(
        work[["kernel_id", "flops", "bytes", "work_call"]], on="kernel_id", how="left").merge(
        counters, on="kernel_id", how="left")
    df["work_call"] = df["work_call"].fillna("k" + df["kernel_id"].astype(str))

    def value(name):
        col = resolved.get(name)
        return pd.to_numeric(df[col], errors="coerce").astype("float64") if col else None

    dram = value("dram_bytes")
    if dram is None and value("dram_bytes_read") is not None and value("dram_bytes_write") is not None:
        dram = value("dram_bytes_read") + value("dram_bytes_write")
    parts = {n: value(n) for n in _FP_FLOPS}
    present = {n: v for n, v in parts.items() if v is not None}
    fp = sum(v * _FP_FLOPS[n] for n, v in present.items()) if present else None
    tensor = value("tensor_inst")
    rows = []
    for name, g in df.groupby(key, sort=False):
        row = {key: name}
        for measured, analytic, label in ((dram, "bytes", "bytes"), (fp, "flops", "flops")):
            m = measured.loc[g.index] if measured is not None else None
            if m is None:
                continue
            complete = (m.notna() & g[analytic].notna()).groupby(g["work_call"]).transform("all")
            if not complete.any():
                continue
            measured_sum, analytic_sum = float(m[complete].sum()), float(g.loc[complete, analytic].sum())
            row["measured_dram_bytes" if label == "bytes" else "measured_fp_flops"] = measured_sum
            row[f"analytic_{label}_measured"] = analytic_sum
            row[f"{label}_ratio"] = measured_sum / analytic_sum if analytic_sum > 0 else None
        used_tensor = tensor is not None and float(tensor.loc[g.index].fillna(0).sum()) > 0
        row["work_check"] = _check_reading(row, used_tensor)
        rows.append(row)
    out = pd.DataFrame(rows, columns=[key, *MEASURED_COLUMNS])
    for c in MEASURED_COLUMNS[:-1]:
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    return out


def _check_reading(row: dict, used_tensor: bool) -> str | None:
    notes = []
    b = row.get("bytes_ratio")
    if b is not None and not pd.isna(b):
        if b > HIGH:
            notes.append(f"DRAM bytes {b:.2f}x the ideal: extra traffic (layout copies, spills, rematerialization "
                         "or padding)")
        elif b < LOW:
            notes.append(f"DRAM bytes {b:.2f}x the ideal: data reused from L2 or already cached")
    f = row.get("flops_ratio")
    if f is not None and not pd.isna(f):
        if used_tensor and f < LOW:
            notes.append(f"FP instructions {f:.2f}x the analytic FLOPs: the rest ran on tensor cores "
                         "(not in these counters)")
        elif f > HIGH:
            notes.append(f"FP FLOPs {f:.2f}x the analytic: recomputation or padding")
        elif f < LOW:
            notes.append(f"FP FLOPs {f:.2f}x the analytic: fewer than counted (integer or special-function work)")
    return "; ".join(notes) or None
