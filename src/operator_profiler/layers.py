"""Layer instances and layer classes (the checkpoint that decides what ncu replays).

A *layer instance* is one forward call of a repeated submodule, seen in the timeline as our layer
range (``opprof.layer:<module path>``, :mod:`operator_profiler.harness`). Its *signature* is the ordered
sequence of its kernels' ``(match_key, grid, block)`` in the first measured iteration; instances with
identical signatures form a *layer class*, whose representative is the first instance in execution
order. Kernels outside every layer form the class ``rest``. Counters measured on a representative are
later broadcast to the other instances by position within the layer.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

REST_CLASS = "rest"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def layer_of_ranges(ranges: pd.DataFrame) -> dict[int, str | None]:
    """range id -> module path of the nearest enclosing layer range (itself included), via parent_id."""
    layer_of: dict[int, str | None] = {}
    ordered = ranges.sort_values("depth", kind="stable")  # parents before children
    for rid, parent, own in zip(ordered["range_id"], ordered["parent_id"], ordered["layer"]):
        inherited = None if pd.isna(parent) else layer_of.get(int(parent))
        layer_of[int(rid)] = inherited if pd.isna(own) else own
    return layer_of


def kernel_layers(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.Series:
    """Module path of the layer each kernel belongs to (None outside every layer).

    A forward kernel belongs to the layer range enclosing its launch on its launching thread; layer
    ranges never nest (:func:`operator_profiler.workloads.find_layers` picks the outermost repeated
    blocks), so a per-thread sorted search suffices. A backward kernel (launched by an autograd node,
    outside every layer range) belongs to the layer of the forward op that created its node, found
    through the autograd sequence number (:func:`operator_profiler.attribution.correlation.enclosing_ops`).
    Returns an object Series aligned with ``kernels``.
    """
    direct = _enclosing_layer(kernels, ranges)
    outside = direct.isna()
    if outside.any() and ranges["layer"].notna().any() and ranges["seq"].notna().any():
        from .attribution.correlation import enclosing_ops

        stacks = enclosing_ops(kernels[outside.to_numpy()], ranges)
        layer_of = layer_of_ranges(ranges)
        for idx, kid in zip(kernels.index[outside.to_numpy()], kernels.loc[outside, "kernel_id"]):
            fwd = stacks[int(kid)].forward_range_id
            if fwd is not None:
                direct.at[idx] = layer_of.get(fwd)
    return direct


def _enclosing_layer(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.Series:
    layer_ranges = ranges[ranges["layer"].notna()]
    result = pd.Series([None] * len(kernels), index=kernels.index, dtype=object)
    if layer_ranges.empty or kernels.empty:
        return result
    launch_start = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64")
    launch_end = kernels["launch_end_ns"].fillna(kernels["end_ns"]).astype("int64")
    for (pid, tid), group in layer_ranges.groupby(["pid", "tid"]):
        group = group.sort_values("start_ns")
        on_thread = (kernels["pid"] == pid) & (kernels["launch_tid"] == tid)
        if not on_thread.any():
            continue
        t0 = launch_start[on_thread].to_numpy()
        t1 = launch_end[on_thread].to_numpy()
        pos = np.searchsorted(group["start_ns"].to_numpy(), t0, side="right") - 1
        cand = np.clip(pos, 0, None)
        inside = (pos >= 0) & (t1 <= group["end_ns"].to_numpy()[cand])
        paths = np.where(inside, group["layer"].to_numpy()[cand], None)
        result[on_thread] = paths
    return result


def _class_name(module_class: str, signature: list) -> str:
    digest = hashlib.sha1(json.dumps(signature).encode()).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', module_class)}-{digest}"


def classify_layers(kernels: pd.DataFrame, ranges: pd.DataFrame, layers: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, dict]]:
    """Group layer instances into classes.

    Args:
        kernels: timeline kernels (DESIGN.md §3).
        ranges: timeline ranges with the ``layer`` column.
        layers: ``layers.json`` of the capture (``[{"path", "class", "param_shapes"}]``).

    Returns:
        ``(kernel_layers, instances, classes)``:
        ``kernel_layers``: kernel_id, layer (path or None), layer_class, position (index of the kernel
        within its layer instance and iteration, or within the iteration's rest kernels);
        ``instances``: layer, module_class, layer_class, iteration, kernel_count, time_ns, representative;
        ``classes``: class name -> canonical dict (class, module_class, signature, instances,
        representative, kernel_count). No timestamps, so an unchanged class serializes identically.
    """
    module_class = {l["path"]: l["class"] for l in layers}
    layer_order = {l["path"]: i for i, l in enumerate(layers)}
    kl = pd.DataFrame({"kernel_id": kernels["kernel_id"], "layer": kernel_layers(kernels, ranges)})
    kl["iteration"] = kernels["iteration"].fillna(-1).astype("int64").to_numpy()
    kl["match_key"] = kernels["match_key"].to_numpy()
    kl["grid"] = kernels["grid"].fillna("").to_numpy()
    kl["block"] = kernels["block"].fillna("").to_numpy()
    kl["duration_ns"] = kernels["duration_ns"].to_numpy()
    kl["instance"] = kl["layer"].fillna(REST_CLASS)
    kl["position"] = kl.groupby(["instance", "iteration"]).cumcount().astype("int64")
    # -1 marks kernels outside every iteration range; they never define a signature when a
    # measured iteration exists (otherwise one stray call would hide every layer).
    measured = kl.loc[kl["iteration"] >= 0, "iteration"]
    first_iteration = int(measured.min()) if len(measured) else -1

    # Signatures of the first measured iteration.
    signatures: dict[str, list] = {}
    for instance, group in kl[kl["iteration"] == first_iteration].groupby("instance", sort=False):
        signatures[instance] = group[["match_key", "grid", "block"]].values.tolist()

    classes: dict[str, dict] = {}
    instance_class: dict[str, str] = {}
    ordered = sorted((p for p in signatures if p != REST_CLASS), key=lambda p: layer_order.get(p, len(layer_order)))
    for path in ordered:
        cls = _class_name(module_class.get(path, "Layer"), signatures[path])
        entry = classes.setdefault(
            cls,
            {"class": cls, "module_class": module_class.get(path, "Layer"), "signature": signatures[path],
             "instances": [], "representative": path, "kernel_count": len(signatures[path])},
        )
        entry["instances"].append(path)
        instance_class[path] = cls
    if REST_CLASS in signatures:
        classes[REST_CLASS] = {
            "class": REST_CLASS, "module_class": None, "signature": signatures[REST_CLASS],
            "instances": [REST_CLASS], "representative": REST_CLASS, "kernel_count": len(signatures[REST_CLASS]),
        }
        instance_class[REST_CLASS] = REST_CLASS
    kl["layer_class"] = kl["instance"].map(instance_class)

    instances = (
        kl.groupby(["instance", "iteration"], sort=False)
        .agg(kernel_count=("kernel_id", "size"), time_ns=("duration_ns", "sum"), layer_class=("layer_class", "first"))
        .reset_index()
        .rename(columns={"instance": "layer"})
    )
    instances["module_class"] = instances["layer"].map(module_class)
    instances["representative"] = instances["layer"].map(
        lambda p: p in {c["representative"] for c in classes.values()}
    )
    instances["time_ns"] = instances["time_ns"].astype("int64")
    kernel_table = kl[["kernel_id", "layer", "layer_class", "position"]]
    return kernel_table, instances, classes


def canonical_json(obj: dict) -> str:
    """Sorted keys, fixed separators, trailing newline: byte-identical for equal content."""
    return json.dumps(obj, sort_keys=True, indent=1) + "\n"


def write_classes(classes: dict[str, dict], out_dir: Path) -> None:
    """One ``<class>.json`` per class in ``out_dir`` (created; stale class files removed)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.json"):
        if stale.stem not in classes:
            stale.unlink()
    for name, entry in classes.items():
        target = out_dir / f"{name}.json"
        text = canonical_json(entry)
        if not target.exists() or target.read_text() != text:  # keep mtime when unchanged
            target.write_text(text)
