"""Layer-class dedup: counters measured on one instance of a class go to every instance (DESIGN.md §1)."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from .diagnostics import REFUSED


def broadcast_to_instances(matched: pd.DataFrame, kernels: pd.DataFrame, kernel_layers: pd.DataFrame
                           ) -> tuple[pd.DataFrame, dict]:
    """Layer-class dedup: counters measured on one instance of a class are copied to every kernel of
    the class at the same position (DESIGN.md §1, layer classes).

    Args:
        matched: ``kernel_id`` + metric columns of the kernels ncu measured (:func:`match_invocations`).
        kernels: timeline kernels (``kernel_id, match_key``).
        kernel_layers: ``kernel_id, layer_class, position`` from :func:`operator_profiler.layers.classify_layers`
            (position: index of the kernel within its layer instance and iteration, or within the
            iteration's kernels outside layers, class ``rest``).

    Returns:
        ``(counters, stats)``: one row per kernel that has counters, its own or its class's, with
        ``counters_from`` (the measured kernel id), that kernel's ``ncu_id``/``ncu_source`` and the metric columns (``attrs["units"]`` kept);
        ``stats`` per class: measured kernels, kernels filled by broadcast, kernels left without counters
        because no kernel at their position was measured, or its ``match_key`` differs (``name_mismatch``) or,
        both launch configurations known, its grid/block differs (``config_mismatch``): reported, never
        guessed; each such kernel is listed in ``counters.attrs["broadcast_refused"]`` with its reason, and, where two or more instances were measured (``dedup.verify``),
        ``verify_max_relative_difference`` per metric (the first measured instance stays the source).
    """
    metrics = [c for c in matched.columns if c not in ("kernel_id", "ncu_id", "ncu_source", "name_rung")]
    layout = kernel_layers[["kernel_id", "layer_class", "position"]].merge(
        kernels[["kernel_id", "match_key"]].assign(config=_configs(kernels)), on="kernel_id", how="left")
    measured = layout[layout["kernel_id"].isin(matched["kernel_id"])]
    # The first measured kernel at each (class, position) is the source (the representative's).
    sources = measured.sort_values("kernel_id").drop_duplicates(["layer_class", "position"])[
        ["layer_class", "position", "kernel_id", "match_key", "config"]].rename(
        columns={"kernel_id": "counters_from", "match_key": "source_key", "config": "source_config"})
    placed = layout.merge(sources, on=["layer_class", "position"], how="left")
    own = placed["kernel_id"].isin(matched["kernel_id"])
    placed.loc[own, "counters_from"] = placed.loc[own, "kernel_id"]
    has_source = placed["counters_from"].notna() & ~own
    same_name = placed["match_key"] == placed["source_key"]
    # the token must agree: name, and launch configuration where both launches have one (another grid is
    # another amount of work: dynamic shapes, the last partial batch)
    both_known = placed["config"].notna() & placed["source_config"].notna()
    same_config = ~both_known | (placed["config"] == placed["source_config"])
    agrees = own | (has_source & same_name & same_config)
    refusal = pd.Series(None, index=placed.index, dtype=object)
    refusal[has_source & ~same_name] = "layer_kernel_mismatch"
    refusal[has_source & same_name & ~same_config] = "layer_config_mismatch"
    stats: dict = {}
    for cls, group in placed.groupby("layer_class", sort=False, dropna=False):
        ok = agrees[group.index]
        stats[str(cls)] = {
            "kernels": len(group), "measured": int(own[group.index].sum()),
            "filled": int((ok & ~own[group.index]).sum()),
            "without_counters": int((~ok).sum()),
            "name_mismatch": int((refusal[group.index] == "layer_kernel_mismatch").sum()),
            "config_mismatch": int((refusal[group.index] == "layer_config_mismatch").sum()),
        }
    # dedup.verify: where ncu measured two or more instances of a class, how far apart they are
    # (the largest relative difference per metric over the class's positions).
    twice = measured[measured.duplicated(["layer_class", "position"], keep=False)]
    if len(twice) and metrics:
        values = twice.merge(matched[["kernel_id", *metrics]], on="kernel_id")
        by_position = values.groupby(["layer_class", "position"])[metrics]
        spread = (by_position.max() - by_position.min()) / by_position.agg(lambda v: v.abs().max())
        for cls, table in spread.groupby(level=0):
            worst = table.max()
            stats[str(cls)]["verify_max_relative_difference"] = {
                m: float(v) for m, v in worst.items() if pd.notna(v)}
    filled = placed[agrees][["kernel_id", "counters_from"]].astype({"counters_from": "int64"})
    carry = [c for c in ("ncu_id", "ncu_source", "name_rung") if c in matched.columns]  # the measured row (DESIGN.md §3)
    counters = filled.merge(matched[["kernel_id", *carry, *metrics]].rename(columns={"kernel_id": "counters_from"}),
                            on="counters_from", how="left").sort_values("kernel_id").reset_index(drop=True)
    counters.attrs = {"units": matched.attrs.get("units", {})}
    refused = placed[refusal.notna()]
    name_of = dict(zip(kernels["kernel_id"].astype("int64"), kernels["name"])) if "name" in kernels.columns else {}
    counters.attrs["broadcast_refused"] = [
        {"kernel_id": int(k), "match_key": str(key), "name": str(name_of.get(int(k), key)), "layer_class": str(c),
         "position": int(p), "counters_from": int(f), "reason": r}
        for k, key, c, p, f, r in zip(refused["kernel_id"], refused["match_key"], refused["layer_class"],
                                      refused["position"], refused["counters_from"], refusal[refused.index])]
    return counters, stats


def _configs(kernels: pd.DataFrame) -> pd.Series:
    """``grid|block`` per kernel (spaces removed), None where either is unknown."""
    if not {"grid", "block"} <= set(kernels.columns):
        return pd.Series(None, index=kernels.index, dtype=object)
    out = []
    for g, b in zip(kernels["grid"].tolist(), kernels["block"].tolist()):
        known = isinstance(g, str) and g.strip() and isinstance(b, str) and b.strip()
        out.append(f"{g.replace(' ', '')}|{b.replace(' ', '')}" if known else None)
    return pd.Series(out, index=kernels.index, dtype=object)


def count_broadcast(diagnostics: dict, counters: pd.DataFrame) -> None:
    """After the layer-class broadcast: ``counters.with_counters`` counts the kernels the written table holds
    (measured or filled), ``counters.from_layer_class`` the filled ones; a kernel whose class representative's
    kernel differs in launch configuration (``layer_config_mismatch``) and that has no counters of its own is
    counted as refused, with its reason, so the console line and the reports say what the file holds."""
    summary = diagnostics["counters"]
    own = counters["kernel_id"] == counters["counters_from"]
    have = set(counters["kernel_id"].astype("int64").tolist())
    summary["from_layer_class"] = int((~own).sum())
    summary["with_counters"] = len(have)
    refused_broadcast = counters.attrs.pop("broadcast_refused", [])
    diagnostics["broadcast_refused"] = refused_broadcast
    refused = {int(k["kernel_id"]): k["reason"] for k in diagnostics.get("timeline_only_kernels", [])
               if k.get("reason") in REFUSED and int(k["kernel_id"]) not in have}
    refused.update({e["kernel_id"]: e["reason"] for e in refused_broadcast
                    if e["reason"] == "layer_config_mismatch" and e["kernel_id"] not in refused})
    summary["refused"] = len(refused)
    summary["refused_reasons"] = dict(sorted(Counter(refused.values()).items()))
    summary["not_measured"] = int(summary["kernels"]) - len(have) - len(refused)
