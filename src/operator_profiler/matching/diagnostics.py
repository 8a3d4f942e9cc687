"""Reasons, per-key statuses and the counters summary of a matching (DESIGN.md §3, matching/diagnostics.json)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from ..naming import COMMUNICATION

#: Why an ncu row or a timeline kernel has no partner. "Refused" reasons mean the input held a measurement the
#: join could not place with certainty; the others that there was nothing to place.
REASONS = {
    # refused
    "count_mismatch": "the ncu file and the timeline have different numbers of launches of this kernel in the "
                      "window, and the launch order does not say which launches ncu profiled",
    "order_ambiguous": "the launches of this kernel can pair in more than one way (launch order that differs between "
                       "runs: CUDA-graph nodes on several streams, interleaving threads, or a reordered sequence)",
    "unplaced_window": "the ncu file's launch window is unknown and its rows fit the timeline at more than one "
                       "place; declare the window (--window FILE=SKIP:COUNT, or FILE=contiguous)",
    "name_ambiguous": "the ncu name fits several timeline kernel names of the scope on the first rung it matches, "
                      "and the launch order does not settle which (a bare function name pairs in order only when "
                      "the window holds as many launches of those kernels as the file has rows of it, every row "
                      "pinning)",
    "process_ambiguous": "the ncu process cannot be mapped to one timeline process (several fit); pass "
                         "--process-map NCU_PID=TIMELINE_PID",
    "device_unknown": "the ncu file has no Device column but the timeline process used several devices",
    "window_mismatch": "the ncu file's rows are not the launches of the window declared for it (or not a run of "
                       "consecutive launches, for a contiguous window): the window or the file is another one",
    # nothing to place
    "name_unmatched": "no timeline kernel of the scope has this name on any rung",
    "process_unmatched": "no timeline process fits this ncu process",
    "device_unmatched": "the mapped timeline process used several devices, none of them with this ncu device's ordinal",
    "likely_autotune_or_benchmark": "the kernel is in the timeline but never with this launch configuration, and "
                                    "another row of the same kernel pairs: likely autotuning or cudnn.benchmark "
                                    "candidates inside the ncu range",
    "launch_config_not_in_timeline": "the kernel is in the timeline but never with this launch configuration, and "
                                     "no row of it pairs: likely a run with other input shapes (batch, sequence "
                                     "length) or another build",
    "layer_config_mismatch": "--kernel-layers: the kernel at this position of the layer class's measured instance "
                             "has the same name but another launch configuration (grid/block): another amount of "
                             "work, so its counters are not copied",
    "layer_kernel_mismatch": "--kernel-layers: the kernel at this position of the layer class's measured instance "
                             "is another kernel (name): its counters are not copied",
    "launch_config_unknown": "the row has no launch configuration (Grid/Block Size) where the file's other rows do: "
                             "it cannot be checked, so it is not attached",
    "not_in_timeline": "no timeline launch of the window pairs with this row (an extra launch in the ncu run)",
    "outside_window": "the kernel name is in the timeline, but not inside this file's window",
    "measured_twice": "two ncu files both pin this kernel: which one measured it is open, so neither is attached",
    "file_does_not_fit": "more than half of the ncu file's rows name kernels the timeline process never launched: a "
                         "run of another program, so none of its rows is attached",
    "not_in_ncu": "the ncu file(s) covering this kernel have no row for it (filtered out or not profiled)",
    "communication_not_profiled": "communication (NCCL) kernel without an ncu row: ncu runs leave them out (they wait "
                                  "on other ranks and hang under replay); a declared window counts them like any "
                                  "launch unless its kernel filter excludes them (NAME=S:C:regex:^(?!nccl))",
    "launched_on_other_thread": "none of this kernel's launches are in ncu and it was launched from a thread none of "
                                "the matched kernels came from (an ncu NVTX include filter sees only the launching "
                                "thread's push/pop ranges)",
}
REFUSED = frozenset({"count_mismatch", "order_ambiguous", "unplaced_window", "name_ambiguous", "process_ambiguous",
                     "device_unknown", "device_unmatched", "window_mismatch", "measured_twice",
                     "launch_config_unknown", "layer_config_mismatch"})


def results(tl: pd.DataFrame, ncu: pd.DataFrame, metrics: list, outcome, windowed: bool):
    """``(matched, diagnostics)`` from what :func:`.match.match_invocations` recorded in ``outcome``."""
    sources = ncu["source"].astype(str).tolist() if "source" in ncu.columns else [None] * len(ncu)
    labels = list(zip(sources, ncu["ncu_id"].astype("int64").tolist()))
    row_of = {lab: i for i, lab in enumerate(labels)}
    matched_ids = set(outcome.pairs)
    pair_rows = sorted(outcome.pairs.items())
    picked = ncu.iloc[[row_of[label] for _, (label, _) in pair_rows]]
    matched = pd.DataFrame({
        "kernel_id": np.array([kid for kid, _ in pair_rows], dtype=np.int64),
        "ncu_id": picked["ncu_id"].astype("int64").to_numpy(),
        "ncu_source": picked["source"].astype(str).to_numpy() if "source" in ncu.columns else None,
        "name_rung": [rung for _, (_, rung) in pair_rows],
        **{m: picked[m].to_numpy() for m in metrics},
    })
    for m in metrics:
        if str(ncu[m].dtype).startswith("float"):
            matched[m] = matched[m].astype("float64")
    matched.attrs = {"units": dict(ncu.attrs.get("units", {}))}

    # kernels without counters: refused, or not measured (with why)
    considered = outcome.covered | set(outcome.kernel_reason)
    left = tl[tl["kernel_id"].isin(considered - matched_ids)]
    reason = pd.Series([outcome.kernel_reason.get(k, "not_in_ncu") for k in left["kernel_id"].tolist()],
                       index=left.index, dtype=object)
    names = pd.Series(pd.unique(pd.concat([left["name"], left["match_key"]]).astype(str)))
    communication = set(names[names.str.contains(COMMUNICATION)])
    comm = left["name"].astype(str).isin(communication) | left["match_key"].astype(str).isin(communication)
    matched_tids = set(tl.loc[tl["kernel_id"].isin(matched_ids), "launch_tid"].dropna())
    ncu_keys = {outcome.row_key.get(lab) for lab in labels}
    other_thread = (~left["match_key"].isin(ncu_keys) & left["launch_tid"].notna()
                    & ~left["launch_tid"].isin(matched_tids)) if matched_tids else pd.Series(False, index=left.index)
    unmeasured = reason == "not_in_ncu"
    reason = reason.mask(unmeasured & other_thread, "launched_on_other_thread")
    reason = reason.mask(unmeasured & comm, "communication_not_profiled")
    timeline_only = [{"kernel_id": int(k), "name": str(n), "match_key": str(m), "reason": r}
                     for k, n, m, r in zip(left["kernel_id"], left["name"], left["match_key"], reason)]
    names_of = ncu["name"].astype(str).tolist()
    ncu_only = [{"ncu_id": lab[1], "source": lab[0], "name": names_of[i], "reason": outcome.row_reason[lab]}
                for i, lab in enumerate(labels) if lab in outcome.row_reason]

    per_key = _per_key(tl, labels, outcome, timeline_only, matched_ids)
    diag = {
        "matched": len(pair_rows),
        "ncu_only": len(ncu_only),
        "timeline_only": len(timeline_only),
        "outside_window": int(len(tl) - len(considered | matched_ids)) if windowed else 0,
        "name_disagreements": outcome.name_disagreements,
        "per_key": per_key,
        "hints": list(dict.fromkeys(outcome.hints)),
        "ncu_only_rows": ncu_only,
        "timeline_only_kernels": timeline_only,
        "timeline_only_reasons": _count(timeline_only),
        "ncu_only_reasons": _count(ncu_only),
        "scopes": outcome.scopes,
        "name_rungs": dict(Counter(rung for _, rung in outcome.pairs.values())),
    }
    if diag["timeline_only_reasons"].get("launched_on_other_thread"):
        diag["hints"].append("kernels launched on another thread have no ncu rows: an ncu --nvtx-include filter "
                             "matches push/pop ranges of the launching thread only")
    if diag["timeline_only_reasons"].get("unplaced_window") or diag["ncu_only_reasons"].get("unplaced_window"):
        files = sorted({r["source"] for r in ncu_only if r["reason"] == "unplaced_window" and r["source"]})
        diag["hints"].append(f"{len(files) or 'an'} ncu file(s) ({', '.join(files)}) fit the timeline at more than one "
                             "place: declare what each ncu run covered, --window NAME=SKIP:COUNT (its --launch-skip "
                             "and --launch-count) or NAME=contiguous (consecutive launches)")
    if diag["timeline_only_reasons"].get("communication_not_profiled"):
        diag["hints"].append("communication (NCCL) kernels are not profiled by ncu")
    for key, entry in per_key.items():
        if entry["status"] == "count_mismatch":
            diag["hints"].append(f"{key}: ncu has {entry['ncu']} launches, the timeline {entry['timeline']}, and the "
                                 "launch order cannot tell which were profiled: warm up (autotuning, cudnn.benchmark) "
                                 "before the ncu range, or declare the window (--launch-skip)")
            break
    diag["coverage_by_name"] = _coverage_by_name(tl, matched_ids)
    diag["counters_coverage"] = _time_coverage(tl, matched_ids)
    diag["counters"] = counters_summary(len(tl), matched_ids, timeline_only, per_key, ncu_only)
    return matched, diag


def _count(items) -> dict:
    return dict(Counter(it["reason"] for it in items))


def _per_key(tl, labels, outcome, timeline_only, matched_ids) -> dict:
    """Per timeline kernel name (``match_key``): launches in the windows, ncu rows, matched, status, reasons."""
    out: dict = {}

    def entry(key):
        return out.setdefault(str(key), {"timeline": 0, "ncu": 0, "matched": 0, "status": "ok", "reasons": Counter()})

    keys = tl["match_key"].astype(str)
    in_window = tl["kernel_id"].isin(outcome.covered | matched_ids | set(outcome.kernel_reason))
    for key, n in keys[in_window].value_counts().items():
        entry(key)["timeline"] = int(n)
    for key, n in keys[tl["kernel_id"].isin(matched_ids)].value_counts().items():
        entry(key)["matched"] = int(n)
    for lab in labels:
        key = outcome.row_key.get(lab)
        candidates = outcome.row_candidates.get(lab, ())
        # a row that names one kernel counts there; an unplaced row toward every kernel name it may be
        for k in ([key] if key is not None and key not in candidates and not candidates else candidates):
            e = entry(k)
            e["ncu"] += 1
            if lab in outcome.row_reason:
                e["reasons"][outcome.row_reason[lab]] += 1
    for k in timeline_only:
        if k["reason"] in REFUSED:
            entry(k["match_key"])["reasons"][k["reason"]] += 1
    for e in out.values():
        refused = {r: n for r, n in e["reasons"].items() if r in REFUSED}
        if refused:
            e["status"] = max(refused, key=lambda r: (refused[r], r))
        elif e["reasons"] and set(e["reasons"]) == {"likely_autotune_or_benchmark"}:  # beside paired rows
            e["status"] = "ncu_surplus"
        elif e["ncu"] and not e["matched"]:
            e["status"] = max(e["reasons"], key=lambda r: (e["reasons"][r], r)) if e["reasons"] else "ok"
        e["reasons"] = dict(e["reasons"])
    return out


def counters_summary(kernels: int, matched_ids, timeline_only: list, per_key: dict, ncu_only: list) -> dict:
    """How many kernels got counters, how many were refused and why (per key), how many were not measured, and
    how many ncu rows could not be placed (``refused_rows``): a row that fits several launches leaves all of them
    refused, so refused kernels can outnumber the rows behind them."""
    refused = [k for k in timeline_only if k["reason"] in REFUSED]
    refused_rows = [r for r in ncu_only if r["reason"] in REFUSED]
    keys: dict = {}
    for k in refused:
        e = keys.setdefault((k["match_key"], k["reason"]), {"key": k["match_key"], "name": k["name"],
                                                            "reason": k["reason"], "refused": 0})
        e["refused"] += 1
    for e in keys.values():
        info = per_key.get(e["key"], {})
        e["timeline"], e["ncu"] = info.get("timeline", 0), info.get("ncu", 0)
    return {
        "kernels": int(kernels),
        "with_counters": len(matched_ids),
        "refused": len(refused),
        "not_measured": int(kernels) - len(matched_ids) - len(refused),
        "refused_reasons": _count(refused),
        "refused_rows": len(refused_rows),
        "refused_keys": sorted(keys.values(), key=lambda e: (-e["refused"], e["key"], e["reason"])),
    }


def _coverage_by_name(tl: pd.DataFrame, matched_ids: set) -> dict:
    got = tl["kernel_id"].isin(matched_ids).groupby(tl["name"].astype(str), sort=True).agg(["sum", "size"])
    return {str(name): f"{int(r['sum'])}/{int(r['size'])}" for name, r in got.iterrows()}


def _time_coverage(tl: pd.DataFrame, matched_ids: set) -> dict:
    """Kernel time with counters: overall, compute, communication."""
    if "duration_ns" not in tl.columns:
        return {}
    comm = tl["name"].astype(str).str.contains(COMMUNICATION) | tl["match_key"].astype(str).str.contains(COMMUNICATION)
    got = tl["kernel_id"].isin(matched_ids)
    dur = tl["duration_ns"].fillna(0).astype("int64")
    out = {}
    for label, mask in (("overall", comm | ~comm), ("compute", ~comm), ("communication", comm)):
        total, with_counters = int(dur[mask].sum()), int(dur[mask & got].sum())
        out[label] = {"time_ns": total, "with_counters_ns": with_counters,
                      "fraction": (with_counters / total) if total else None}
    return out
