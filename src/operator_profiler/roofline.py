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
                    "ceiling_fraction", "roofline"]
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


def memory_ceiling(ceilings: dict) -> float | None:
    memory = ceilings.get("memory_bytes_per_s") or {}
    best = memory.get("best") or max((v for v in memory.values() if isinstance(v, (int, float))), default=None)
    return float(best) if best else None


def with_roofline(table: pd.DataFrame, ceilings: dict | None, key: str = "operator") -> pd.DataFrame:
    """``table`` (with the work columns) plus :data:`ROOFLINE_COLUMNS`; all null without ``ceilings``."""
    out = table.copy()
    cols = {c: [None] * len(out) for c in ROOFLINE_COLUMNS}
    bandwidth = memory_ceiling(ceilings) if ceilings else None
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
            cols["roofline"][i] = f"{r[key]}: {fraction:.0%} of {name}, compute-bound"
        elif bandwidth and (flops == 0 or (ridge is not None and intensity is not None and intensity < ridge)):
            fraction = r["achieved_bytes_per_s"] / bandwidth
            cols["bound"][i], cols["ceiling"][i], cols["ceiling_fraction"][i] = "memory", "memory bandwidth", fraction
            detail = ("moves data only" if not flops else
                      f"intensity {intensity:.3g} FLOP/byte < ridge {ridge:.3g}")
            if fraction > 1:  # a working set that stays in cache is read faster than DRAM streams
                detail += "; above the measured bandwidth: its data is served from cache"
            cols["roofline"][i] = f"{r[key]}: {fraction:.0%} of memory bandwidth, memory-bound ({detail})"
        else:
            cols["roofline"][i] = f"{r[key]}: " + (
                f"no measured compute ceiling for {r.get('work_dtype') or 'its dtype'}" if flops
                else "no measured memory bandwidth")
    for c, values in cols.items():
        out[c] = values
    for c in ("ceiling_flops_per_s", "ceiling_bytes_per_s", "ridge_intensity", "ceiling_fraction"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    return out


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
    }
