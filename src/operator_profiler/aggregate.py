"""Per-operator, per-module and per-layer-class figures, and the coverage summary.

Durations are the timeline's (integer ns), summed over all kernels of the measured iterations.
Hardware counters, when a later stage joins them (``matched/kernel_metrics.parquet``), are aggregated
by the metric catalog's rule; without them (CPU runs) ``bottleneck`` is ``not_collected``.
"""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd

from .timeline.kineto import DISPATCHER_OP

UNATTRIBUTED = "(unattributed)"
OUTSIDE_LAYERS = "(outside layers)"


def operators_table(attribution: pd.DataFrame, per_iteration: bool) -> pd.DataFrame:
    """One row per operator, sorted by time (descending).

    Columns: operator, calls, kernels, time_ns (every kernel of the attribution), time_share (0-1),
    mean_kernel_ns, paths, bottleneck, kernels_without_time (kernel records whose time is unknown: their
    0 ns are not a measurement); with ``per_iteration`` also time_per_iteration_ns (the mean over
    the measured iterations, from the kernels inside them only) and
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
            # Kernel records with invalid timestamps (Kineto, cases.md C04): their time is unknown, not 0.
            "kernels_without_time": (~df["valid_time"].astype(bool)).groupby(df["operator"], sort=False).sum()
            if "valid_time" in df else 0,
        }
    ).reset_index()
    table["kernels_without_time"] = table["kernels_without_time"].astype("int64")
    table["time_share"] = table["time_ns"] / total if total else 0.0
    table["mean_kernel_ns"] = (table["time_ns"] / table["kernels"]).round().astype("int64")
    table["bottleneck"] = "not_collected"
    columns = ["operator", "calls", "kernels", "time_ns", "time_share", "mean_kernel_ns", "paths", "bottleneck",
               "kernels_without_time"]
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
        stats["time_per_iteration_ns"] = (per_it.sum(axis=1) / max(iterations, 1)).round().astype("int64")
        table = table.merge(stats, left_on="operator", right_index=True, how="left")
        # Operators that ran only outside the measured iterations (warm-up leftovers): 0 per iteration.
        for column in ("time_per_iteration_ns", "iteration_min_ns", "iteration_median_ns", "iteration_max_ns"):
            table[column] = table[column].fillna(0).astype("int64")
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


PATHS = ("correlation", "nvtx", "inductor", "user_annotation")
# Paths whose answer is a region's name, not an operator: never compared with the others' answers.
NOT_COMPARED = frozenset({"user_annotation"})


def _path_answers(evidence: str) -> dict[str, object]:
    """What each path said in one kernel's evidence JSON: the operator name (paths a, b; the
    annotation's name for ``user_annotation``, written only where it was chosen), the fused ATen ops
    (path c, only for the call's own kernel), or None when the path ran without an answer."""
    ev = json.loads(evidence)
    answers: dict[str, object] = {}
    for key in ("correlation", "nvtx", "user_annotation"):
        if key in ev:
            answers[key] = ev[key].get("operator")
    site = ev.get("inductor")
    if site is not None:
        answers["inductor"] = site.get("fused_ops") or None if site.get("call_site", True) else None
    return answers


def _agree(path_1: str, answer_1, path_2: str, answer_2) -> bool:
    if path_2 == "inductor":  # a named op agrees with the fusion map when it is one of the fused ops
        return answer_1 in answer_2
    return answer_1 == answer_2


def _path_coverage(attribution: pd.DataFrame, total_ns: int) -> tuple[dict, dict]:
    """Per path: the share of kernels (count and time, 0-1) it named an operator for, whatever the
    merge chose; per pair of paths: on how many kernels both answered and how many agreed.

    Rows whose evidence holds one path only (a plain nsys or CPU run: most rows) are counted from the
    ``path`` column without parsing their JSON.
    """
    evidence = attribution["evidence"].astype(str)
    present = {p: evidence.str.contains(f'"{p}"', regex=False).to_numpy() for p in PATHS}
    n_present = sum(v.astype(int) for v in present.values()) if len(attribution) else 0
    answered = {p: pd.Series(False, index=attribution.index) for p in PATHS}
    compared = [p for p in PATHS if p not in NOT_COMPARED]
    agreement = {f"{a}/{b}": {"both": 0, "agree": 0} for i, a in enumerate(compared) for b in compared[i + 1:]}
    single = n_present <= 1
    for p in PATHS:
        answered[p] |= pd.Series(present[p] & single, index=attribution.index) & (attribution["path"] == p)
    multi = attribution.index[~single] if len(attribution) else attribution.index
    for idx, ev in zip(multi, evidence.loc[multi]):
        answers = _path_answers(ev)
        for p, answer in answers.items():
            answered[p].loc[idx] = answer is not None
        named = [(p, a) for p, a in answers.items() if a is not None and p not in NOT_COMPARED]
        for i, (p1, a1) in enumerate(named):
            for p2, a2 in named[i + 1:]:
                if p2 == "inductor" and not DISPATCHER_OP.match(str(a1)):
                    continue  # a wrapper (Inductor's CPU-side kernel event) is not an ATen op to compare
                pair = agreement[f"{p1}/{p2}"]
                pair["both"] += 1
                pair["agree"] += int(_agree(p1, a1, p2, a2))
    durations = attribution["duration_ns"]
    coverage = {
        p: {"count": float(answered[p].mean()) if len(attribution) else 0.0,
            "time": float(durations[answered[p]].sum() / total_ns) if total_ns else 0.0}
        for p in PATHS if present[p].any()
    }
    return coverage, {pair: a for pair, a in agreement.items() if a["both"]}


DISAGREEMENT_EXAMPLES = 5


def external_id_disagreements(attribution: pd.DataFrame) -> dict:
    """Kernels whose Kineto ``External id`` names another op than the ones enclosing their launch
    (evidence ``correlation.external_id_check: disagrees``; checked only where the trace's kernels
    carry op ids, DESIGN.md §3). The operator stays the launch's; this says how much to doubt the
    trace's op ids. ``checked``: kernels the check ran on; ``count``/``time_ns`` (ns) the disagreeing
    ones; ``examples``: the longest few (``kernel_id, name, operator, external_id, external_id_op``)."""
    evidence = attribution["evidence"].astype(str)
    checked = evidence.str.contains('"external_id_check": ', regex=False)
    disagree = checked & evidence.str.contains('"external_id_check": "disagrees"', regex=False)
    rows = attribution[disagree.to_numpy()]
    examples = []
    for row in rows.sort_values(["duration_ns", "kernel_id"], ascending=[False, True]).head(
            DISAGREEMENT_EXAMPLES).itertuples(index=False):
        said = json.loads(row.evidence)["correlation"]
        examples.append({"kernel_id": int(row.kernel_id), "name": str(row.name),
                         "operator": None if pd.isna(row.operator) else str(row.operator),
                         "external_id": said.get("external_id"), "external_id_op": said.get("external_id_op")})
    return {"checked": int(checked.sum()), "count": int(len(rows)), "time_ns": int(rows["duration_ns"].sum()),
            "examples": examples}


def counters_summary(attribution: pd.DataFrame, counters: pd.DataFrame, matching: dict | None) -> dict:
    """How many kernels got hardware counters, how many were refused and why, how many were not measured.

    ``counters``: ``matched/kernel_metrics.parquet`` (own counters, or copied from the layer class's measured
    instance: ``counters_from``); ``matching``: ``matched/diagnostics.json`` (each kernel without a partner and
    its reason, :data:`operator_profiler.matching.REASONS`), None when not at hand (then ``refused`` is None).
    A refused kernel that got counters from its layer class counts as having counters. Kernel counts; ``hints``:
    the matching's hints (what the input cannot tell apart and how to fix it), as written."""
    from .matching import REFUSED

    ids = set(attribution["kernel_id"].astype("int64"))
    got = counters[counters["kernel_id"].isin(ids)] if counters is not None else counters
    with_counters = set(got["kernel_id"].astype("int64")) if got is not None else set()
    own = int((got["kernel_id"] == got["counters_from"]).sum()) if got is not None and "counters_from" in got else \
        len(with_counters)
    out = {"kernels": len(ids), "with_counters": len(with_counters), "measured": own,
           "from_layer_class": len(with_counters) - own, "refused": None, "refused_reasons": None,
           "refused_rows": None, "refused_keys": None, "not_measured": None, "hints": []}
    if matching is None:
        return out
    out["hints"] = [str(h) for h in matching.get("hints", [])]
    listed = [k for k in matching.get("timeline_only_kernels", []) if k.get("reason") in REFUSED]
    seen = {k["kernel_id"] for k in listed}
    # --kernel-layers: kernels refused a copy of their class representative's counters (another launch config)
    listed += [k for k in matching.get("broadcast_refused", [])
               if k.get("reason") in REFUSED and k["kernel_id"] not in seen and "match_key" in k]
    refused = [k for k in listed if k["kernel_id"] in ids and k["kernel_id"] not in with_counters]
    per_key = matching.get("per_key", {})
    keys: dict = {}
    for k in refused:
        e = keys.setdefault((k["match_key"], k["reason"]), {"key": k["match_key"], "name": k["name"],
                                                            "reason": k["reason"], "refused": 0,
                                                            "timeline": per_key.get(k["match_key"], {}).get("timeline"),
                                                            "ncu": per_key.get(k["match_key"], {}).get("ncu")})
        e["refused"] += 1
    out.update(refused=len(refused), refused_reasons=dict(Counter(k["reason"] for k in refused)),
               refused_rows=(matching.get("counters") or {}).get("refused_rows"),
               refused_keys=sorted(keys.values(), key=lambda e: (-e["refused"], e["key"], e["reason"])),
               not_measured=len(ids) - len(with_counters) - len(refused))
    return out


def coverage(attribution: pd.DataFrame, counters_collected: bool, device: str | None = None,
             counters: pd.DataFrame | None = None, matching: dict | None = None) -> dict:
    """The coverage summary (DESIGN.md §3 ``coverage.json``); time shares are fractions 0-1.
    ``device`` (``cpu``, ``cuda``, or None when unknown) words the note on missing counters; ``matching``
    (``matched/diagnostics.json``) adds the refused kernels to ``counters`` (:func:`counters_summary`)."""
    total = int(attribution["duration_ns"].sum())
    attributed = attribution[attribution["path"] != "unattributed"]
    by_path = attribution.groupby("path")["duration_ns"].sum()
    path_coverage, agreement = _path_coverage(attribution, total)
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
        # Kernel time outside every measured iteration (when the trace marks iterations).
        "outside_iterations_time_ns": int(total - per_iteration.sum()) if len(per_iteration) else None,
        "attributed_time_ns": int(attributed["duration_ns"].sum()),
        "coverage_time": (int(attributed["duration_ns"].sum()) / total) if total else 0.0,
        "kernel_count": int(len(attribution)),
        "attributed_count": int(len(attributed)),
        "by_path": {p: (int(t) / total if total else 0.0) for p, t in by_path.items()},
        "path_coverage": path_coverage,
        "path_agreement": {pair: a["agree"] / a["both"] for pair, a in agreement.items() if a["both"]},
        "path_agreement_counts": agreement,
        "valid_timed_kernels": int(attribution["valid_time"].astype(bool).sum()) if "valid_time" in attribution
        else int(len(attribution)),
        "counters_coverage": None if not counters_collected else (
            float(attribution["kernel_id"].isin(counters["kernel_id"]).mean()) if counters is not None and len(attribution)
            else 0.0),
        "counters_note": None if counters_collected else counters_note(device),
        "counters": counters_summary(attribution, counters, matching) if counters_collected else None,
        "unattributed": [
            {"name": r.name, "time_ns": int(r.time_ns), "count": int(r.count), "reason": r.reason}
            for r in groups.itertuples(index=False)
        ],
        "unattributed_reasons": dict(Counter(unattributed["reason"].fillna("unknown"))),
        "external_id_disagreements": external_id_disagreements(attribution),
    }
