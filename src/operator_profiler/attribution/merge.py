"""One attribution record per kernel, merging the paths that had data.

Precedence for ``operator`` (documented in DESIGN.md §3): the correlation path (a) names the
operator when a dispatcher op encloses the launch; NVTX (b) comes next; a kernel that no ATen op
encloses but that the Inductor fusion map (c) knows (a fused Triton/C++ kernel) gets the operator
label of its fused ATen ops. The fusion map always fills ``fused_ops``/``source_nodes`` when it has
the kernel's call site. ``layer``/``layer_class`` come from the layer classification (backward
kernels belong to the layer of their forward op); ``module`` is the layer instance's module path.
"""

from __future__ import annotations

import json

import pandas as pd

from . import inductor
from .correlation import OpStack, enclosing_ops

# Ops that only re-describe memory; a fused kernel's label skips them unless nothing else is left.
VIEW_OPS = frozenset(
    "aten::" + op
    for op in (
        "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "split", "split_with_sizes",
        "squeeze", "unsqueeze", "as_strided", "slice", "select", "alias", "detach", "clone", "_to_copy",
        "contiguous", "unbind", "cat",
    )
)


def fused_operator_label(fused_ops: list[str]) -> str | None:
    """``["aten::add", "aten::native_layer_norm", "aten::view"]`` -> ``"aten::add+aten::native_layer_norm"``."""
    if not fused_ops:
        return None
    compute = [op for op in fused_ops if op not in VIEW_OPS] or list(fused_ops)
    return "+".join(sorted(compute))


def _root_kernels(kernels: pd.DataFrame) -> dict[int, int]:
    """kernel_id -> the outermost CPU kernel enclosing it (itself for top-level and GPU kernels)."""
    parent = {int(k): (None if pd.isna(p) else int(p)) for k, p in zip(kernels["kernel_id"], kernels["parent_kernel_id"])}
    root: dict[int, int] = {}
    for kid in kernels["kernel_id"].astype(int):  # launch order: parents precede their children
        p = parent[kid]
        root[kid] = kid if p is None else root.get(p, p)
    return root


def _region_call_sites(kernels: pd.DataFrame, stacks: dict[int, OpStack], fusion_map: pd.DataFrame) -> tuple[dict[int, dict], dict[int, str]]:
    """kernel_id -> fusion-map row for kernels inside a compiled-graph region whose kernel
    sequence matches one graph's call sites; kernel_id -> reason for those that do not.

    Only the top-level kernels of a region are call sites (``extern_kernels.addmm`` runs
    ``aten::addmm``, which may run ``aten::copy_`` on a CPU); nested CPU kernels share the call
    site of the kernel that encloses them.
    """
    rows: dict[int, dict] = {}
    reasons: dict[int, str] = {}
    root = _root_kernels(kernels)
    by_region: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for k in kernels.itertuples(index=False):
        kid = int(k.kernel_id)
        region = stacks[kid].compiled_region
        if region is not None:
            by_region.setdefault(region, []).append(kid)
            names[kid] = k.name
    for region, members in by_region.items():
        calls = [kid for kid in members if root[kid] == kid]
        match = inductor.match_region([names[kid] for kid in calls], fusion_map) if len(fusion_map) else None
        if match is None:
            for kid in members:
                reasons[kid] = "no_fusion_map" if not len(fusion_map) else "fusion_map_mismatch"
            continue
        graph, call_indexes = match
        graph_rows = fusion_map[fusion_map["graph"] == graph].set_index("call_index")
        for kid, call_index in zip(calls, call_indexes):
            row = graph_rows.loc[call_index].to_dict()
            row["call_index"] = int(call_index)
            rows[kid] = row
        for kid in members:
            if root[kid] != kid and root[kid] in rows:
                rows[kid] = rows[root[kid]]
    return rows, reasons


def attribute(
    kernels: pd.DataFrame,
    ranges: pd.DataFrame,
    kernel_layers: pd.DataFrame,
    fusion_map: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Attribute every kernel of a Kineto timeline (paths a and c).

    Args:
        kernels, ranges: timeline tables (DESIGN.md §3).
        kernel_layers: ``kernel_id, layer, layer_class, position`` from
            :func:`operator_profiler.layers.classify_layers`.
        fusion_map: :func:`operator_profiler.attribution.inductor.load_fusion_map` output, or None.

    Returns:
        The ATTRIBUTION columns of :mod:`operator_profiler.tables` plus ``operator_range_id`` (the
        op instance, to count calls), ``duration_ns`` and ``iteration``. Unattributed kernels have
        ``path == "unattributed"``, ``operator`` null and a machine-readable ``reason``.
    """
    fusion_map = fusion_map if fusion_map is not None else pd.DataFrame()
    stacks = enclosing_ops(kernels, ranges)
    call_sites, region_reasons = _region_call_sites(kernels, stacks, fusion_map)
    names = ranges.set_index("range_id")["name"].to_dict()
    layer_of = dict(zip(kernel_layers["kernel_id"].astype(int), kernel_layers["layer"]))
    class_of = dict(zip(kernel_layers["kernel_id"].astype(int), kernel_layers["layer_class"]))

    records = []
    for k in kernels.itertuples(index=False):
        kid = int(k.kernel_id)
        found = stacks[kid]
        site = call_sites.get(kid)
        evidence: dict = {
            "correlation": {
                "stack": [names[r] for r in found.stack],
                "operator": found.operator,
                **({"reason": found.reason} if found.reason else {}),
            }
        }
        operator, path, reason = found.operator, "correlation" if found.operator else "unattributed", found.reason
        fused_ops: list[str] = []
        source_nodes: list[str] = []
        if site is not None:
            fused_ops, source_nodes = list(site["fused_ops"]), list(site["source_nodes"])
            evidence["inductor"] = {
                "graph": site["graph"], "call_index": site["call_index"], "kernel": site["kernel"],
                "kind": site["kind"], "fused_ops": fused_ops, "origin": site["origin"],
            }
            if operator is None:
                operator = fused_operator_label(fused_ops)
                path = "inductor" if operator else "unattributed"
                reason = None if operator else "fusion_map_without_ops"
        elif found.compiled_region is not None and operator is None:
            reason = region_reasons.get(kid, reason)
        layer = layer_of.get(kid)
        layer = None if pd.isna(layer) else layer
        module = layer
        records.append(
            {
                "kernel_id": kid,
                "operator": operator,
                "forward_operator": found.forward_operator,
                "module": module,
                "layer": layer,
                "layer_class": class_of.get(kid),
                "path": path,
                "fused_ops": fused_ops,
                "source_nodes": source_nodes,
                "reason": reason if path == "unattributed" else None,
                "evidence": json.dumps(evidence, sort_keys=True),
                "operator_range_id": found.operator_range_id,
                "duration_ns": int(k.duration_ns),
                "iteration": k.iteration,
                "name": k.name,
            }
        )
    out = pd.DataFrame.from_records(records)
    out["operator_range_id"] = pd.array(out["operator_range_id"], dtype="Int64")
    out["iteration"] = pd.array(out["iteration"], dtype="Int64")
    return out
