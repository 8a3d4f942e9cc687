"""Per-operator, per-module and per-layer-class figures, and the coverage summary.

Durations are the timeline's (integer ns), summed over all kernels of the measured iterations.
Hardware counters, when a later stage joins them (``matched/kernel_metrics.parquet``), are aggregated
by the metric catalog's rule; without them (CPU runs) ``bottleneck`` is ``not_collected``.
"""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd

UNATTRIBUTED = "(unattributed)"
OUTSIDE_LAYERS = "(outside layers)"


def operators_table(attribution: pd.DataFrame, per_iteration: bool) -> pd.DataFrame:
    """One row per operator, sorted by time (descending).

    Columns: operator, calls, kernels, time_ns (all measured iterations), time_share (0-1),
    mean_kernel_ns, paths, bottleneck; with ``per_iteration`` also time_per_iteration_ns (mean) and
    iteration_min_ns / iteration_median_ns / iteration_max_ns (the operator's time in each measured
    iteration present in the attribution, to spot a noisy iteration; omitted when no kernel lies in
    an iteration range). Unattributed kernels form the row ``(unattributed)`` so
    that time shares add up to 1.
    """
    df = attribution.assign(operator=attribution["operator"].fillna(UNATTRIBUTED))
    # A call is one op instance (one enclosing dispatcher-op range); fused kernels count one call each.
    call_key = df["operator_range_id"].astype("string").fillna("k" + df["kernel_id"].astype(str))
    df = df.assign(call_key=call_key)
    total = int(df["duration_ns"].sum())
    grouped = df.groupby("operator", sort=False)
    table = pd.DataFrame(
        {
            "calls": grouped["call_key"].nunique(),
            "kernels": grouped.size(),
            "time_ns": grouped["duration_ns"].sum().astype("int64"),
            "paths": grouped["path"].agg(lambda s: ",".join(sorted(set(s)))),
        }
    ).reset_index()
    table["time_share"] = table["time_ns"] / total if total else 0.0
    table["mean_kernel_ns"] = (table["time_ns"] / table["kernels"]).round().astype("int64")
    table["bottleneck"] = "not_collected"
    columns = ["operator", "calls", "kernels", "time_ns", "time_share", "mean_kernel_ns", "paths", "bottleneck"]
    measured = df[df["iteration"].notna()]
    if per_iteration and len(measured):  # a trace without iteration ranges has nothing per iteration
        seen = sorted(int(i) for i in measured["iteration"].unique())
        iterations = len(seen)
        per_it = measured.pivot_table(index="operator", columns="iteration", values="duration_ns",
                                      aggfunc="sum", fill_value=0)
        # An operator absent from an iteration spent 0 ns in it.
        for missing in set(seen) - set(int(c) for c in per_it.columns):
            per_it[missing] = 0
        stats = pd.DataFrame(
            {
                "iteration_min_ns": per_it.min(axis=1),
                "iteration_median_ns": per_it.median(axis=1),
                "iteration_max_ns": per_it.max(axis=1),
            }
        ).round().astype("int64")
        table = table.merge(stats, left_on="operator", right_index=True, how="left")
        table["time_per_iteration_ns"] = (table["time_ns"] / max(iterations, 1)).round().astype("int64")
        columns[5:5] = ["time_per_iteration_ns", "iteration_min_ns", "iteration_median_ns", "iteration_max_ns"]
    return table[columns].sort_values(["time_ns", "operator"], ascending=[False, True]).reset_index(drop=True)


def modules_table(attribution: pd.DataFrame) -> pd.DataFrame:
    """One row per module path (layer instance) plus ``(outside layers)``: module, kernels, time_ns, time_share."""
    df = attribution.assign(module=attribution["module"].fillna(OUTSIDE_LAYERS))
    total = int(df["duration_ns"].sum())
    table = df.groupby("module", sort=False).agg(kernels=("kernel_id", "size"), time_ns=("duration_ns", "sum")).reset_index()
    table["time_ns"] = table["time_ns"].astype("int64")
    table["time_share"] = table["time_ns"] / total if total else 0.0
    return table.sort_values("time_ns", ascending=False).reset_index(drop=True)


def layer_classes_table(instances: pd.DataFrame, classes: dict[str, dict]) -> pd.DataFrame:
    """One row per layer class: layer_class, module_class, instances, kernels_per_instance, time_ns,
    mean_instance_time_ns, representative, replays_without_dedup, replays_with_dedup."""
    rows = []
    for name, entry in classes.items():
        mine = instances[instances["layer_class"] == name]
        per_instance = mine.groupby("layer")["time_ns"].sum()
        rows.append(
            {
                "layer_class": name,
                "module_class": entry["module_class"],
                "instances": len(entry["instances"]),
                "kernels_per_instance": entry["kernel_count"],
                "time_ns": int(mine["time_ns"].sum()),
                "mean_instance_time_ns": int(round(per_instance.mean())) if len(per_instance) else 0,
                "representative": entry["representative"],
                "replays_without_dedup": len(entry["instances"]),
                "replays_with_dedup": 1,
            }
        )
    columns = ["layer_class", "module_class", "instances", "kernels_per_instance", "time_ns",
               "mean_instance_time_ns", "representative", "replays_without_dedup", "replays_with_dedup"]
    return pd.DataFrame(rows, columns=columns)


def with_counters(table: pd.DataFrame, attribution: pd.DataFrame, counters: pd.DataFrame, key: str, catalog) -> pd.DataFrame:
    """Add the catalog metrics of each ``key`` group (operator, module or layer_class) to ``table``.

    ``counters``: one row per matched kernel (``kernel_id`` + metric columns as ncu spells them, base
    units), from ``matched/kernel_metrics.parquet``. Each metric is combined over the group's kernels by
    its catalog rule with the *timeline* durations as weights (``../shared/docs/DESIGN.md``: durations
    come from the clock-locked capture, not from ncu's replay); ``counters_kernels`` says how many of
    the group's kernels had counters, and ``bottleneck`` labels the group from its SOL figures.
    """
    from .ncu.catalog import aggregate as combine
    from .ncu.catalog import label_bottlenecks

    fill = {"operator": UNATTRIBUTED, "module": OUTSIDE_LAYERS, "layer_class": "rest"}[key]
    joined = attribution[["kernel_id", key, "duration_ns"]].assign(**{key: attribution[key].fillna(fill)}).merge(
        counters, on="kernel_id", how="left")
    figures = combine(joined, key, catalog)
    figures["bottleneck"] = label_bottlenecks(figures, catalog)
    table = table.drop(columns=[c for c in ("bottleneck",) if c in table])
    return table.merge(figures.drop(columns=["kernels"]), on=key, how="left")


def counters_note(device: str | None) -> str:
    if device == "cpu":
        return "hardware counters: not collected on CPU (Nsight Compute is GPU-only)"
    return "hardware counters: not collected (no Nsight Compute data for these kernels)"


def coverage(attribution: pd.DataFrame, counters_collected: bool, device: str | None = None,
             counters: pd.DataFrame | None = None) -> dict:
    """The coverage summary (DESIGN.md §3 ``coverage.json``); time shares are fractions 0-1.
    ``device`` (``cpu``, ``cuda``, or None when unknown) words the note on missing counters."""
    total = int(attribution["duration_ns"].sum())
    attributed = attribution[attribution["path"] != "unattributed"]
    by_path = attribution.groupby("path")["duration_ns"].sum()
    # Agreement of paths (a) and (c) on the operator of an extern/fallback call: only the call's own
    # kernel counts (work nested in the call, like addmm's bias copy, has an operator of its own).
    both = []
    with_site = attribution[attribution["evidence"].str.contains('"inductor"', regex=False)]
    for ev, op, range_id in zip(with_site["evidence"], with_site["operator"], with_site["operator_range_id"]):
        site = json.loads(ev).get("inductor")
        if site is not None and not pd.isna(range_id) and site.get("call_site", True):
            both.append(op in site["fused_ops"] or not site["fused_ops"])
    agree = sum(both)
    unattributed = attribution[attribution["path"] == "unattributed"]
    groups = (
        unattributed.assign(reason=unattributed["reason"].fillna("unknown"))
        .groupby(["name", "reason"]).agg(time_ns=("duration_ns", "sum"), count=("kernel_id", "size")).reset_index()
        .sort_values("time_ns", ascending=False)
    )
    measured = attribution[attribution["iteration"].notna()]
    per_iteration = measured.groupby(measured["iteration"].astype("int64"))["duration_ns"].sum()
    return {
        "kernel_time_ns": total,
        "iteration_time_ns": {str(i): int(t) for i, t in per_iteration.items()},
        "attributed_time_ns": int(attributed["duration_ns"].sum()),
        "coverage_time": (int(attributed["duration_ns"].sum()) / total) if total else 0.0,
        "kernel_count": int(len(attribution)),
        "attributed_count": int(len(attributed)),
        "by_path": {p: (int(t) / total if total else 0.0) for p, t in by_path.items()},
        "path_agreement": {"correlation/inductor": agree / len(both)} if len(both) else {},
        "counters_coverage": None if not counters_collected else (
            float(attribution["kernel_id"].isin(counters["kernel_id"]).mean()) if counters is not None and len(attribution)
            else 0.0),
        "counters_note": None if counters_collected else counters_note(device),
        "unattributed": [
            {"name": r.name, "time_ns": int(r.time_ns), "count": int(r.count), "reason": r.reason}
            for r in groups.itertuples(index=False)
        ],
        "unattributed_reasons": dict(Counter(unattributed["reason"].fillna("unknown"))),
    }
