"""Per-operator, per-module and per-layer-class figures, and the coverage summary.

Durations are the timeline's (integer ns), summed over all kernels of the measured iterations (``time_ns``);
with per-iteration columns, shares and rankings come from each group's per-iteration median instead, so one
slow iteration (a busy machine) decides nothing.
Hardware counters, when a later stage joins them (``matched/kernel_metrics.parquet``), are aggregated
by the metric catalog's rule; without them (CPU runs) ``bottleneck`` is ``not_collected``.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd

from .naming import PHASES
from .timeline.model import DISPATCHER_OP

UNATTRIBUTED = "(unattributed)"
OUTSIDE_LAYERS = "(outside layers)"
OUTSIDE_PHASES = "(outside phases)"
PHASE_COLUMNS = ["phase", "operator", "calls", "kernels", "time_ns", "phase_share", "time_share",
                 "time_per_iteration_ns", "iteration_median_ns"]


# The per-iteration statistics of a group (operator, module): its time in each measured iteration, summarized.
ITERATION_COLUMNS = ("time_per_iteration_ns", "iteration_min_ns", "iteration_p25_ns", "iteration_median_ns",
                     "iteration_p75_ns", "iteration_max_ns")


def iteration_stats(frame: pd.DataFrame, key: str) -> pd.DataFrame | None:
    """Per ``key`` group, its kernel time in each measured iteration (the kernels whose ``iteration`` is set;
    a group absent from an iteration spent 0 ns in it), summarized as the :data:`ITERATION_COLUMNS` (integer ns):
    the mean (``time_per_iteration_ns``), min, quartiles (linear interpolation, numpy's default), median and
    max. Indexed by ``key``; None when no kernel lies in an iteration range."""
    measured = frame[frame["iteration"].notna()]
    if not len(measured):
        return None
    seen = sorted(int(i) for i in measured["iteration"].unique())
    per_it = measured.assign(iteration=measured["iteration"].astype("int64")).pivot_table(
        index=key, columns="iteration", values="duration_ns", aggfunc="sum", fill_value=0)
    per_it = per_it.reindex(columns=seen, fill_value=0).astype("float64")
    values = per_it.to_numpy()
    stats = pd.DataFrame(
        {
            "time_per_iteration_ns": values.sum(axis=1) / len(seen),
            "iteration_min_ns": values.min(axis=1),
            "iteration_p25_ns": np.percentile(values, 25, axis=1),
            "iteration_median_ns": np.median(values, axis=1),
            "iteration_p75_ns": np.percentile(values, 75, axis=1),
            "iteration_max_ns": values.max(axis=1),
        },
        index=per_it.index,
    )
    return stats.round().astype("int64")


def _with_iteration_stats(table: pd.DataFrame, stats: pd.DataFrame | None, key: str) -> pd.DataFrame:
    """``table`` with the per-iteration columns (0 for groups that ran only outside the measured iterations),
    ``time_share`` from the per-iteration medians (each group's median / the sum of all medians), sorted by the
    median (then the total); without ``stats`` ``time_share`` is the total's share and the order by total."""
    if stats is None:
        table["time_share"] = table["total_share"]
        return table.sort_values(["time_ns", key], ascending=[False, True]).reset_index(drop=True)
    table = table.merge(stats, left_on=key, right_index=True, how="left")
    for column in ITERATION_COLUMNS:
        table[column] = table[column].fillna(0).astype("int64")
    medians = int(table["iteration_median_ns"].sum())
    table["time_share"] = table["iteration_median_ns"] / medians if medians else 0.0
    return table.sort_values(["iteration_median_ns", "time_ns", key], ascending=[False, False, True]
                             ).reset_index(drop=True)


def rank_overlaps(table: pd.DataFrame) -> pd.Series:
    """Per row of a table sorted by ``iteration_median_ns``: whether its per-iteration interquartile range
    [``iteration_p25_ns``, ``iteration_p75_ns``] overlaps the row's above or below, i.e. whether the two may
    swap places in another run. The IQR, not [min, max]: one slow iteration widens every min-max range."""
    lo, hi = table["iteration_p25_ns"].to_numpy(), table["iteration_p75_ns"].to_numpy()
    overlap = np.zeros(len(table), dtype=bool)
    if len(table) > 1:
        # rows i (above, larger median) and i + 1 overlap when the upper one's p25 is not above the lower's p75
        pair = lo[:-1] <= hi[1:]
        overlap[:-1] |= pair
        overlap[1:] |= pair
    return pd.Series(overlap, index=table.index)


CROSS_LAYER = "(cross-layer)"  # module row of the kernels whose FX nodes span several layer instances
UNKNOWN_LAYER = "(unknown layer)"  # module row of a whole-model compile's kernels whose modules are unknown


def module_labels(attribution: pd.DataFrame) -> pd.Series:
    """The module row of each kernel: its module path; without one :data:`CROSS_LAYER` / :data:`UNKNOWN_LAYER`
    by its ``membership`` (when the attribution has the column), else :data:`OUTSIDE_LAYERS`."""
    fill = pd.Series(OUTSIDE_LAYERS, index=attribution.index, dtype=object)
    if "membership" in attribution:
        fill = fill.mask(attribution["membership"] == "cross_layer", CROSS_LAYER)
        fill = fill.mask(attribution["membership"] == "unknown", UNKNOWN_LAYER)
    return attribution["module"].astype(object).where(attribution["module"].notna(), fill)


def operators_table(attribution: pd.DataFrame, per_iteration: bool) -> pd.DataFrame:
    """One row per operator, ranked by its per-iteration median (``per_iteration`` and iteration ranges present),
    else by its total time (descending).

    Columns: operator, calls, kernels, time_ns (every kernel of the attribution, the total), total_share (the
    total's share, 0-1), time_share (0-1: the operator's ``iteration_median_ns`` / the sum of every row's, so one
    slow iteration does not move shares or ranks; without per-iteration columns the total's share), mean_kernel_ns,
    paths, bottleneck, kernels_without_time (kernel records whose time is unknown: their 0 ns are not a
    measurement); with ``per_iteration`` also the :data:`ITERATION_COLUMNS` (the operator's time in each measured
    iteration present in the attribution: mean, min, quartiles, median, max; omitted when no kernel lies in an
    iteration range) and ``rank_overlap`` (:func:`rank_overlaps`). Unattributed kernels form the row
    ``(unattributed)`` so that time shares add up to 1.
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
            # Kernel records with invalid timestamps (Kineto, docs/field-cases.md C04): their time is unknown, not 0.
            "kernels_without_time": (~df["valid_time"].astype(bool)).groupby(df["operator"], sort=False).sum()
            if "valid_time" in df else 0,
        }
    ).reset_index()
    table["kernels_without_time"] = table["kernels_without_time"].astype("int64")
    table["total_share"] = table["time_ns"] / total if total else 0.0
    table["mean_kernel_ns"] = (table["time_ns"] / table["kernels"]).round().astype("int64")
    table["bottleneck"] = "not_collected"
    columns = ["operator", "calls", "kernels", "time_ns", "time_share", "total_share", "mean_kernel_ns", "paths",
               "bottleneck", "kernels_without_time"]
    stats = iteration_stats(df, "operator") if per_iteration else None
    table = _with_iteration_stats(table, stats, "operator")
    if stats is not None:
        table["rank_overlap"] = rank_overlaps(table)
        columns[6:6] = [*ITERATION_COLUMNS, "rank_overlap"]
    return table[columns]


def _has_phases(attribution: pd.DataFrame) -> bool:
    return "phase" in attribution and bool(attribution["phase"].notna().any())


def _per_iteration(measured: pd.DataFrame, keys: list[str], iterations: list[int]) -> pd.DataFrame:
    """``keys`` x measured iteration -> kernel time (ns), 0 where a group ran nothing in an iteration."""
    per_it = measured.pivot_table(index=keys, columns="iteration", values="duration_ns", aggfunc="sum", fill_value=0)
    for missing in set(iterations) - set(int(c) for c in per_it.columns):
        per_it[missing] = 0
    return per_it


def phases_table(attribution: pd.DataFrame) -> pd.DataFrame:
    """One row per (train-step phase, operator): the operators of each phase (``forward``, ``backward``,
    ``optimizer``; ``(outside phases)`` for kernels outside every phase range), in phase order, then by time.

    Columns (:data:`PHASE_COLUMNS`): phase, operator, calls, kernels, time_ns (every kernel of the
    attribution), phase_share (of the phase's kernel time, 0-1), time_share (of all kernel time, 0-1),
    time_per_iteration_ns (mean over the measured iterations) and iteration_median_ns (median of the
    per-iteration times; an iteration without the operator counts 0), both from the kernels inside
    iteration ranges. Empty (these columns) when no kernel has a phase (inference, foreign traces).
    """
    if not _has_phases(attribution):
        return pd.DataFrame({c: pd.Series(dtype="str" if c in ("phase", "operator") else
                                          "float64" if c.endswith("share") else "int64") for c in PHASE_COLUMNS})
    df = attribution.assign(operator=attribution["operator"].fillna(UNATTRIBUTED),
                            phase=attribution["phase"].fillna(OUTSIDE_PHASES))
    df = df.assign(call_key=df["operator_range_id"].astype("string").fillna("k" + df["kernel_id"].astype(str)))
    total = int(df["duration_ns"].sum())
    grouped = df.groupby(["phase", "operator"], sort=False)
    table = pd.DataFrame({"calls": grouped["call_key"].nunique(), "kernels": grouped.size(),
                          "time_ns": grouped["duration_ns"].sum().astype("int64")}).reset_index()
    phase_time = df.groupby("phase")["duration_ns"].sum()
    table["phase_share"] = [t / phase_time[p] if phase_time[p] else 0.0 for p, t in zip(table["phase"], table["time_ns"])]
    table["time_share"] = table["time_ns"] / total if total else 0.0
    measured = df[df["iteration"].notna()]
    iterations = sorted(int(i) for i in measured["iteration"].unique())
    if iterations:
        per_it = _per_iteration(measured, ["phase", "operator"], iterations)
        stats = pd.DataFrame({"time_per_iteration_ns": per_it.sum(axis=1) / len(iterations),
                              "iteration_median_ns": per_it.median(axis=1)}).round().astype("int64")
        table = table.merge(stats, left_on=["phase", "operator"], right_index=True, how="left")
    for column in ("time_per_iteration_ns", "iteration_median_ns"):
        table[column] = table[column].fillna(0).astype("int64") if column in table else 0
    order = {p: i for i, p in enumerate((*PHASES, OUTSIDE_PHASES))}
    table["_order"] = table["phase"].map(order).fillna(len(order))
    table = table.sort_values(["_order", "time_ns", "operator"], ascending=[True, False, True])
    return table[PHASE_COLUMNS].reset_index(drop=True)


def phase_summary(attribution: pd.DataFrame) -> list[dict] | None:
    """One entry per train-step phase present, in step order (``(outside phases)`` last): ``phase``,
    ``kernels``, ``time_ns``, ``time_share`` (0-1 of all kernel time) and ``iteration_median_ns`` (median over
    the measured iterations of the phase's kernel time per iteration, ns); None when no kernel has a phase."""
    if not _has_phases(attribution):
        return None
    df = attribution.assign(phase=attribution["phase"].fillna(OUTSIDE_PHASES))
    total = int(df["duration_ns"].sum())
    measured = df[df["iteration"].notna()]
    iterations = sorted(int(i) for i in measured["iteration"].unique())
    medians = _per_iteration(measured, ["phase"], iterations).median(axis=1) if iterations else pd.Series(dtype=float)
    out = []
    for phase in (*PHASES, OUTSIDE_PHASES):
        mine = df[df["phase"] == phase]
        if not len(mine):
            continue
        time_ns = int(mine["duration_ns"].sum())
        out.append({"phase": phase, "kernels": int(len(mine)), "time_ns": time_ns,
                    "time_share": time_ns / total if total else 0.0,
                    "iteration_median_ns": int(round(medians.get(phase, 0)))})
    return out


def modules_table(attribution: pd.DataFrame, per_iteration: bool = True) -> pd.DataFrame:
    """One row per module path (layer instance) plus ``(outside layers)``: module, kernels, time_ns (total),
    time_share, total_share and, with ``per_iteration`` and iteration ranges, the :data:`ITERATION_COLUMNS`;
    ranked and shared like :func:`operators_table` (by the per-iteration median when present: identical layers
    then show alike, whichever iteration the machine slowed). Where there are such kernels also the rows
    ``(cross-layer)`` and ``(unknown layer)`` (:func:`module_labels`)."""
    df = attribution.assign(module=module_labels(attribution))
    total = int(df["duration_ns"].sum())
    table = df.groupby("module", sort=False).agg(kernels=("kernel_id", "size"), time_ns=("duration_ns", "sum")).reset_index()
    table["time_ns"] = table["time_ns"].astype("int64")
    table["total_share"] = table["time_ns"] / total if total else 0.0
    stats = iteration_stats(df, "module") if per_iteration else None
    table = _with_iteration_stats(table, stats, "module")
    columns = ["module", "kernels", "time_ns", "time_share", "total_share"]
    return table[columns + (list(ITERATION_COLUMNS) if stats is not None else [])]


def layer_classes_table(instances: pd.DataFrame, classes: dict[str, dict], per_iteration: bool = True) -> pd.DataFrame:
    """One row per layer class: layer_class, module_class, instances, kernels_per_instance, time_ns,
    mean_instance_time_ns (an instance's total over the measured iterations, mean over the class's instances),
    representative, replays_without_dedup, replays_with_dedup, split_reason and split_detail (why one module
    class fell into several classes: :func:`operator_profiler.layers.explain_splits`; null when it did not); with
    ``per_iteration`` and measured iterations also instance_iteration_min_ns / _median_ns / _max_ns: over every
    (instance, measured iteration) of the class, the instance's time in that iteration (an instance absent from
    an iteration counts 0 ns)."""
    measured = instances[instances["iteration"] >= 0] if per_iteration else instances.iloc[0:0]
    per_call = None
    if len(measured):
        seen = sorted(int(i) for i in measured["iteration"].unique())
        per_call = measured.pivot_table(index="layer", columns="iteration", values="time_ns", aggfunc="sum",
                                        fill_value=0).reindex(columns=seen, fill_value=0)
    rows = []
    for name, entry in classes.items():
        mine = instances[instances["layer_class"] == name]
        per_instance = mine.groupby("layer")["time_ns"].sum()
        row = {
            "layer_class": name,
            "module_class": entry["module_class"],
            "instances": len(entry["instances"]),
            "kernels_per_instance": entry["kernel_count"],
            "time_ns": int(mine["time_ns"].sum()),
            "mean_instance_time_ns": int(round(per_instance.mean())) if len(per_instance) else 0,
            "representative": entry["representative"],
            "replays_without_dedup": len(entry["instances"]),
            "replays_with_dedup": 1,
            "split_reason": entry.get("split_reason"),
            "split_detail": entry.get("split_detail"),
        }
        if per_call is not None:
            calls = per_call.reindex(index=list(entry["instances"]), fill_value=0).to_numpy(dtype="float64").ravel()
            row.update({f"instance_iteration_{stat}_ns": int(round(float(fn(calls)))) if len(calls) else 0
                        for stat, fn in (("min", np.min), ("median", np.median), ("max", np.max))})
        rows.append(row)
    columns = ["layer_class", "module_class", "instances", "kernels_per_instance", "time_ns",
               "mean_instance_time_ns", "representative", "replays_without_dedup", "replays_with_dedup",
               "split_reason", "split_detail"]
    if per_call is not None:
        columns[6:6] = ["instance_iteration_min_ns", "instance_iteration_median_ns", "instance_iteration_max_ns"]
    return pd.DataFrame(rows, columns=columns)


def with_counters(table: pd.DataFrame, attribution: pd.DataFrame, counters: pd.DataFrame, key: str, catalog) -> pd.DataFrame:
    """Add the catalog metrics of each ``key`` group (operator, module or layer_class) to ``table``.

    ``counters``: one row per matched kernel (``kernel_id`` + metric columns as ncu spells them, base
    units), from ``matched/kernel_metrics.parquet``. Each metric is combined over the group's kernels by
    its catalog rule with the *timeline* durations as weights (``docs/DESIGN.md``: durations
    come from the clock-locked capture, not from ncu's replay); ``counters_kernels`` says how many of
    the group's kernels had counters, and ``bottleneck`` labels the group from its SOL figures.
    """
    from .ncu.catalog import aggregate as combine
    from .ncu.catalog import label_bottlenecks

    filled = (module_labels(attribution) if key == "module"
              else attribution[key].fillna({"operator": UNATTRIBUTED, "layer_class": "rest"}[key]))
    joined = attribution[["kernel_id", key, "duration_ns"]].assign(**{key: filled}).merge(
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


def _evidence_contains_each(evidence: pd.Series, texts: tuple[str, ...]) -> list[np.ndarray]:
    """Per text of ``texts``, per row, whether the evidence JSON contains it (boolean arrays; a null evidence reads
    "nan"), the column's distinct texts found once for all of them.

    A categorical evidence column (path (b)'s: a few distinct texts for a million kernels) is searched once per
    distinct text and the answers spread by the codes: ``astype(str)`` would build a string per kernel (0.6 s of
    ``opprof attribute`` at 1 M nsys kernels). So is an object column of texts (path (a)'s, shared strings)."""
    if isinstance(evidence.dtype, pd.CategoricalDtype):
        categories = evidence.cat.categories.astype(str)
        codes = evidence.cat.codes.to_numpy()
        found = []
        for text in texts:
            in_text = np.asarray(categories.str.contains(text, regex=False), dtype=bool)
            null_contains = text in "nan"  # what astype(str) made of a missing evidence
            found.append(np.where(codes >= 0, in_text[np.maximum(codes, 0)] if len(in_text) else False, null_contains))
        return found
    if evidence.dtype == object:
        # Path (a)'s evidence: one JSON text per kernel, most of them shared: searched once per distinct text.
        try:
            codes, distinct = pd.factorize(evidence.to_numpy())
        except TypeError:  # an unhashable value: searched row by row below
            distinct = None
        # (only texts: equal values of other types, 1 and True, would share a code but not a text)
        if distinct is not None and all(v.__class__ is str for v in distinct):
            distinct_texts = pd.Series(distinct, dtype=object).astype(str)
            missing = codes < 0
            found = []
            for text in texts:
                hits = np.zeros(len(codes), dtype=bool)
                if len(distinct):
                    hits = distinct_texts.str.contains(text, regex=False).to_numpy(dtype=bool)[codes]
                if missing.any():  # (nulls read as astype(str) reads them)
                    hits[missing] = evidence[missing].astype(str).str.contains(text, regex=False).to_numpy(dtype=bool)
                found.append(hits)
            return found
    as_text = evidence.astype(str)
    return [as_text.str.contains(text, regex=False).to_numpy(dtype=bool) for text in texts]


def external_id_disagreements(attribution: pd.DataFrame) -> dict:
    """Kernels whose Kineto ``External id`` names another op than the ones enclosing their launch
    (evidence ``correlation.external_id_check: disagrees``; checked only where the trace's kernels
    carry op ids, DESIGN.md §3). The operator stays the launch's; this says how much to doubt the
    trace's op ids. ``checked``: kernels the check ran on; ``count``/``time_ns`` (ns) the disagreeing
    ones; ``examples``: the longest few (``kernel_id, name, operator, external_id, external_id_op``)."""
    checked, disagree = _evidence_contains_each(attribution["evidence"], ('"external_id_check": ',
                                                                          '"external_id_check": "disagrees"'))
    disagree = disagree & checked
    rows = attribution[disagree]
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


def layer_membership(attribution: pd.DataFrame) -> dict | None:
    """How the kernels' layer instances were decided (the attribution's ``membership`` column,
    :data:`operator_profiler.layers.MEMBERSHIPS`): ``by_membership`` (membership -> ``kernels``, ``time_ns``),
    ``cross_layer`` (one entry per kernel name and spanned instances: ``name``, ``layers_spanned``, ``count``,
    ``time_ns``; by time, largest first) and ``unknown`` (per kernel name: ``name``, ``count``, ``time_ns``).
    None for an attribution without the column (written before it existed)."""
    if "membership" not in attribution:
        return None
    membership = attribution["membership"].fillna("unknown")
    groups = attribution.assign(membership=membership).groupby("membership")["duration_ns"].agg(["size", "sum"])
    out = {"by_membership": {str(m): {"kernels": int(r["size"]), "time_ns": int(r["sum"])} for m, r in groups.iterrows()},
           "cross_layer": [], "unknown": []}
    cross = attribution[membership == "cross_layer"]
    if len(cross):
        spans = cross["layers_spanned"].map(lambda v: " | ".join(v) if v is not None else "")
        table = (cross.assign(spans=spans).groupby(["name", "spans"], sort=False)
                 .agg(count=("kernel_id", "size"), time_ns=("duration_ns", "sum")).reset_index()
                 .sort_values(["time_ns", "name"], ascending=[False, True]))
        out["cross_layer"] = [{"name": r.name, "layers_spanned": r.spans.split(" | ") if r.spans else [],
                               "count": int(r.count), "time_ns": int(r.time_ns)} for r in table.itertuples(index=False)]
    unknown = attribution[membership == "unknown"]
    if len(unknown):
        table = (unknown.groupby("name", sort=False).agg(count=("kernel_id", "size"), time_ns=("duration_ns", "sum"))
                 .reset_index().sort_values(["time_ns", "name"], ascending=[False, True]))
        out["unknown"] = [{"name": r.name, "count": int(r.count), "time_ns": int(r.time_ns)}
                          for r in table.itertuples(index=False)]
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
        "phases": phase_summary(attribution),
        "external_id_disagreements": external_id_disagreements(attribution),
        "layer_membership": layer_membership(attribution),
    }
