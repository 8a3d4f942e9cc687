"""The ncu replay plan of a layer class (written by the layer-class checkpoint, classify): its window as segments
of launch positions counted from cudaProfilerStart, for :mod:`.replay` to run on the GPU; and what the replays
measured against replaying every instance (for the reports). Details: docs/modules.md#ncu-replay."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import NcuReplayError
from ..naming import COMMUNICATION, REST_CLASS
from .replay import instances_scale


COUNTED_FROM = ("the first launch of the measured window: the harness re-run brackets its measured iterations with "
                "cudaProfilerStart/Stop (ncu --profile-from-start off) and the NVTX start/end range opprof.measured "
                "(ncu --nvtx-include opprof@opprof.measured), so warm-up launches are not counted")


def _segments(positions: list[int], kernel_ids: list[int]) -> list[dict]:
    segments: list[dict] = []
    for pos, kid in zip(positions, kernel_ids):
        if segments and pos == segments[-1]["launch_skip"] + segments[-1]["launch_count"]:
            segments[-1]["launch_count"] += 1
            segments[-1]["last_kernel_id"] = kid
        else:
            segments.append({"launch_skip": pos, "launch_count": 1, "first_kernel_id": kid, "last_kernel_id": kid})
    return segments


def plan_replay(kernels: pd.DataFrame, kernel_layers: pd.DataFrame, class_json: dict) -> dict:
    """The replay window of one class: its replay instances' kernels in the first measured iteration.

    Args:
        kernels: ``timeline/kernels.parquet`` (``kernel_id, pid, iteration, name, match_key``; optional
            ``activity``: nsys ``graph`` rows are not launches ncu profiles one by one).
        kernel_layers: ``layers/kernel_layers.parquet`` (``kernel_id, layer, layer_class``).
        class_json: one ``layers/classes/{cls}.json`` (``class, instances, replay_instances``).

    Returns:
        A canonical dict (no timestamps: it changes only when the window does): ``class``, ``instances``
        (all instance labels), ``replay_instances``, ``iteration`` (first measured iteration, None when the
        timeline has no iteration ranges), ``pid``, ``kernel_count``, ``segments`` (``launch_skip``,
        ``launch_count``: 0-based launch positions counted from cudaProfilerStart, see the module docstring;
        ``first_kernel_id``, ``last_kernel_id``), ``counted_from``, ``window`` (``{"kernel_ids": [...], "pid": pid}``,
        for matching) and ``warnings`` (communication kernels in the window, CUDA-graph rows in the timeline).

    Raises:
        NcuReplayError: no kernel of the replay instances in the timeline, or kernels of several processes.
    """
    cls = class_json["class"]
    replay = list(class_json.get("replay_instances") or [class_json["representative"]])
    kl = kernel_layers[["kernel_id", "layer", "layer_class"]]
    tl = kernels.merge(kl, on="kernel_id", how="left", validate="one_to_one")
    warnings: list[str] = []
    if "activity" in tl.columns and (tl["activity"].fillna("kernel") == "graph").any():
        warnings.append("the timeline traced CUDA graphs as whole graphs (<cuda_graph N> rows): their node kernels "
                        "are launches ncu profiles one by one (--graph-profiling node) but the timeline cannot place "
                        "them; launch positions after a graph launch are wrong. Capture with --cuda-graph-trace=node")
        tl = tl[tl["activity"].fillna("kernel") != "graph"]
    measured = tl["iteration"].dropna() if "iteration" in tl.columns else pd.Series(dtype="float64")
    iteration = int(measured.min()) if len(measured) else None
    in_iteration = tl["iteration"] == iteration if iteration is not None else pd.Series(True, index=tl.index)
    if cls == REST_CLASS:
        mine = tl["layer"].isna() & (tl["layer_class"] == REST_CLASS)
    else:
        mine = tl["layer"].isin(replay)
    chosen = tl[mine & in_iteration]
    if chosen.empty:
        raise NcuReplayError(f"layer class {cls}: no kernel of its replay instances {replay} in the first measured "
                             "iteration of the timeline; re-run classify_layers on this timeline")
    pids = sorted(chosen["pid"].dropna().astype("int64").unique().tolist())
    if len(pids) != 1:
        raise NcuReplayError(f"layer class {cls}: its replay instances ran in {len(pids)} processes {pids}; the replay "
                             "counts launches of one process: profile one process (rank) per workload")
    pid = pids[0]
    process = tl[tl["pid"] == pid].sort_values("kernel_id")
    position = pd.Series(range(len(process)), index=process["kernel_id"].to_numpy())
    ids = sorted(int(k) for k in chosen["kernel_id"])
    segments = _segments([int(position[k]) for k in ids], ids)
    names = chosen["name"].astype(str)
    comm = names.str.contains(COMMUNICATION) | chosen["match_key"].astype(str).str.contains(COMMUNICATION)
    if comm.any():
        warnings.append(f"{int(comm.sum())} communication kernel(s) in the window (e.g. {names[comm].iloc[0][:80]}): "
                        "ncu serialises launches and NCCL kernels wait on other ranks, so the replay may hang "
                        "(docs/field-cases.md C16)")
    return {
        "class": cls,
        "instances": list(class_json.get("instances", [])),
        "replay_instances": replay,
        "iteration": iteration,
        "pid": pid,
        "kernel_count": len(ids),
        "segments": segments,
        "counted_from": COUNTED_FROM,
        "window": {"kernel_ids": ids, "pid": pid},
        "warnings": warnings,
    }


def write_plans(kernels: pd.DataFrame, kernel_layers: pd.DataFrame, classes: dict[str, dict], out_dir: Path) -> None:
    """One ``{cls}.json`` plan per class in ``out_dir`` (canonical JSON, rewritten only when it changes,
    stale ones removed), so an unchanged class keeps a byte-identical plan and its replay is not re-run."""
    from ..layers import write_canonical_files

    write_canonical_files({name: plan_replay(kernels, kernel_layers, entry) for name, entry in classes.items()},
                          out_dir)


def match_window(records: dict[str, dict]) -> dict:
    """``stages.match_files`` window from the classes' ``replay.json`` (or plans): ``{"sources": {cls: window}}``;
    matching looks each ncu file up by its name's stem (``ncu/{cls}.parquet`` -> ``cls``)."""
    return {"sources": {cls: rec["window"] for cls, rec in sorted(records.items())}}


def replay_estimate(records: list[dict]) -> dict:
    """Measured replay time against replaying every layer instance.

    Returns ``{"classes": [{class, instances, replayed, kernels, runs, wall_s, estimate_all_s}], "wall_s",
    "estimate_all_s", "instances", "replayed"}``: ``estimate_all_s`` = sum over classes of wall_s x N/K
    (N instances, K replayed). It scales each run's whole wall time, harness start-up included, so it is an
    upper bound of what one ncu run over every layer would take."""
    rows = []
    for r in sorted(records, key=lambda r: r["class"]):
        rows.append({"class": r["class"], "instances": len(r.get("instances") or []),
                     "replayed": len(r.get("replay_instances") or []), "kernels": r.get("kernels_planned"),
                     "runs": len(r.get("segments") or []), "wall_s": float(r["wall_s"]),
                     "estimate_all_s": float(r["wall_s"]) * instances_scale(r)})
    return {"classes": rows, "wall_s": sum(r["wall_s"] for r in rows),
            "estimate_all_s": sum(r["estimate_all_s"] for r in rows),
            "instances": sum(r["instances"] for r in rows), "replayed": sum(r["replayed"] for r in rows)}
