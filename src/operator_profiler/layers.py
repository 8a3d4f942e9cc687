"""Layer instances and layer classes (the checkpoint that decides what ncu replays).

A *layer instance* is one forward call of a repeated submodule, seen in the timeline as our layer
range (``opprof.layer:<module path>``, :mod:`operator_profiler.capture.harness`), or, in a whole-model compiled
workload (no layer ranges inside the compiled region), as the FX nodes its compiled kernels were generated
from (the fusion map's ``module_paths``, :mod:`operator_profiler.capture.fx_module_paths`). A compiled kernel fusing
FX nodes of two layer instances (block i's residual add with block i+1's layer norm), or of one and of code
outside every layer, is a *cross-layer* kernel: it belongs to no instance (class ``rest``) and lists the
instances it spans (``layers_spanned``). Its *signature* is the ordered
sequence of its kernels' ``(match_key, grid, block)`` in the first measured iteration; instances with
identical signatures and identical parameter and input shapes (layers.json: kernels of the same names and grids
can run layers of other widths) form a *layer class*, whose representative is the first instance in execution
order. Kernels outside every layer form the class ``rest``. Counters measured on a representative are
later broadcast to the other instances by position within the layer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from .naming import REST_CLASS
from .timeline.model import iteration_at, kernel_phases
from .heap import bulk_memory

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def layer_range_of_ranges(ranges: pd.DataFrame) -> dict[int, int | None]:
    """range id -> id of the innermost layer range enclosing it (itself included), via parent_id."""
    layer_range: dict[int, int | None] = {}
    ordered = ranges.sort_values("depth", kind="stable")  # parents before children
    for rid, parent, own in zip(ordered["range_id"], ordered["parent_id"], ordered["layer"]):
        inherited = None if pd.isna(parent) else layer_range.get(int(parent))
        layer_range[int(rid)] = inherited if pd.isna(own) else int(rid)
    return layer_range


def instance_labels(ranges: pd.DataFrame) -> dict[int, str]:
    """layer range id -> instance label: the module path, with ``#k`` for the k-th further call of
    the same module within one iteration (a layer called twice per forward, shared weights), so
    every call is an instance of its own."""
    layer_ranges = ranges[ranges["layer"].notna()].sort_values(["start_ns", "range_id"])
    iterations = iteration_at(layer_ranges["pid"].to_numpy(), layer_ranges["start_ns"].astype("int64").to_numpy(), ranges)
    labels: dict[int, str] = {}
    calls: dict[tuple, int] = {}
    for rid, path, iteration in zip(layer_ranges["range_id"], layer_ranges["layer"], iterations):
        key = (path, None if pd.isna(iteration) else int(iteration))
        k = calls.get(key, 0)
        calls[key] = k + 1
        labels[int(rid)] = path if k == 0 else f"{path}#{k}"
    return labels


#: How a kernel's layer instance was decided (kernel_layers ``membership``).
MEMBERSHIPS = {
    "layer_range": "the layer range around its launch (or around its forward op, for a backward kernel)",
    "fx_nodes": "all the FX nodes it was generated from lie in this layer instance (fusion map module_paths)",
    "outside_layers": "outside every layer: no layer range encloses it, or all its FX nodes lie outside every layer",
    "cross_layer": "its FX nodes lie in several layer instances, or in one and outside every layer: no instance "
    "(class rest); layers_spanned lists them",
    "unknown": "a whole-model compiled workload's kernel of the model (inside the model range, or its forward op "
    "is) whose FX nodes' modules are unknown (not placed on a fusion-map call site with module paths, e.g. eager "
    "code between compiled graphs): no instance (class rest)",
}
NO_SPANS: list[str] = []  # shared, never mutated
OUTSIDE_LAYERS = "(outside layers)"  # in layers_spanned: FX nodes outside every layer


def layer_of_module(path: str, layer_paths: set[str]) -> str | None:
    """The layer instance label a module path of the fusion map lies in (the innermost layer, as with nested
    layer ranges), or None outside every layer: ``transformer.h.3.ln_1`` -> ``transformer.h.3``;
    ``blocks.0#1.lin`` (the module's second call) -> ``blocks.0#1``, the label :func:`instance_labels` gives
    that call's range."""
    found = None
    parts = path.split(".") if path else []
    for i in range(1, len(parts) + 1):
        base = ".".join(p.partition("#")[0] for p in parts[:i])
        if base in layer_paths:
            call = parts[i - 1].partition("#")[2]
            found = f"{base}#{call}" if call and call != "0" else base
    return found


_UNKNOWN = object()


def _entry_layer(entry: str, layer_paths: set[str]):
    """The layer instance of one fusion-map module path entry, None outside every layer, ``_UNKNOWN`` when it
    cannot be said. An entry ``"A|B"`` (a node known only to lie between nodes of modules A and B,
    :func:`operator_profiler.attribution.torch_trace.node_entries`) lies in a layer holding both; between two
    modules outside every layer it lies outside them too (a layer has parameters, whose reads would lie
    between); otherwise it may or may not be in the layer of one of them."""
    if "|" not in entry:
        return layer_of_module(entry, layer_paths)
    a, _, b = entry.partition("|")
    from .attribution.torch_trace import common_path

    both = layer_of_module(common_path([a, b]), layer_paths)
    if both is not None:
        return both
    if layer_of_module(a, layer_paths) is None and layer_of_module(b, layer_paths) is None:
        return None
    return _UNKNOWN


def site_membership(module_paths, scope, layer_paths: set[str]) -> tuple[str, str | None, list[str]] | None:
    """``(membership, layer instance, layers spanned)`` of a kernel placed on a fusion-map call site with
    ``module_paths`` (scope ``model`` only: a frame's relative paths name no instance); None when the site says
    nothing (no paths, another scope, or an entry whose layer cannot be said: :func:`_entry_layer`)."""
    if scope != "model" or module_paths is None or len(module_paths) == 0:
        return None
    labels = {_entry_layer(str(p), layer_paths) for p in module_paths}
    if _UNKNOWN in labels:
        return None
    if len(labels) == 1:
        (label,) = labels
        return ("fx_nodes", label, []) if label is not None else ("outside_layers", None, [])
    return "cross_layer", None, sorted(OUTSIDE_LAYERS if lab is None else lab for lab in labels)


def fx_membership(kernels: pd.DataFrame, ranges: pd.DataFrame, fusion_map: pd.DataFrame,
                  layer_paths: list[str], ops=None) -> pd.DataFrame:
    """Layer membership of the kernels of a Kineto timeline that path (c) places on a fusion-map call site
    (:func:`operator_profiler.attribution.compiled_graphs.resolve`, the placement attribution uses):
    ``kernel_id, membership, layer, module, layers_spanned`` (see :func:`site_membership`), one row per placed
    kernel whose site says something."""
    from .attribution.compiled_graphs import resolve
    from .attribution.correlation import find_ops

    columns = ["kernel_id", "membership", "layer", "module", "layers_spanned"]
    if fusion_map is None or fusion_map.empty or "module_paths" not in fusion_map or kernels.empty:
        return pd.DataFrame(columns=columns)
    ops = ops if ops is not None else find_ops(kernels, ranges)
    sites = resolve(kernels, ranges, ops, fusion_map).sites
    wanted = set(layer_paths)
    rows = []
    answers: dict[tuple, tuple | None] = {}  # every iteration repeats the same call sites
    for kid, site in sites.items():
        paths = site.get("module_paths")
        key = (tuple(paths) if paths is not None else (), site.get("module_paths_scope"))
        if key not in answers:
            answers[key] = site_membership(list(key[0]), key[1], wanted)
        answer = answers[key]
        if answer is not None:
            membership, label, spanned = answer
            rows.append((int(kid), membership, label, label.partition("#")[0] if label else None, spanned))
    return pd.DataFrame(rows, columns=columns)


def fx_membership_by_name(kernels: pd.DataFrame, fusion_map: pd.DataFrame, layer_paths: list[str]) -> pd.DataFrame:
    """:func:`fx_membership` for a timeline without compiled-graph ranges (nsys, no torch.profiler run beside it):
    generated kernels joined to their call site by name and launch order
    (:func:`operator_profiler.attribution.inductor.attribute_by_name`); library kernels (cuBLAS for
    ``extern_kernels.mm``) are never joined by name, so they stay ``unknown``."""
    from .attribution.inductor import attribute_by_name

    columns = ["kernel_id", "membership", "layer", "module", "layers_spanned"]
    if fusion_map is None or fusion_map.empty or "module_paths" not in fusion_map or kernels.empty:
        return pd.DataFrame(columns=columns)
    found = attribute_by_name(kernels, fusion_map)
    wanted = set(layer_paths)
    rows = []
    for kid, match, paths, scope in zip(found["kernel_id"], found["match"], found["module_paths"],
                                        found["module_paths_scope"]):
        answer = site_membership(paths, scope, wanted) if match is not None else None
        if answer is not None:
            membership, label, spanned = answer
            rows.append((int(kid), membership, label, label.partition("#")[0] if label else None, spanned))
    return pd.DataFrame(rows, columns=columns)


def carry_membership(pairs: pd.DataFrame, source_kernels: pd.DataFrame, source_layers: pd.DataFrame) -> pd.DataFrame:
    """The layer membership of another run of the same program (the torch.profiler run beside an nsys timeline,
    ``source_layers``: :func:`kernel_layers` on ``source_kernels``) on this timeline's kernels, as the
    ``fx_answers`` of :func:`kernel_layers`: ``pairs`` (``kernel_id``, ``source_kernel_id``) from
    :func:`operator_profiler.attribution.transfer.align_runs`; unpaired kernels get none (so ``unknown``)."""
    columns = ["kernel_id", "membership", "layer", "module", "layers_spanned"]
    if not len(pairs) or not len(source_kernels):
        return pd.DataFrame(columns=columns)
    source = source_layers.assign(source_kernel_id=source_kernels["kernel_id"].astype("int64").to_numpy())
    merged = pairs.merge(source.drop(columns=[c for c in ("kernel_id",) if c in source]), on="source_kernel_id")
    return merged[columns]


def kernel_layers(kernels: pd.DataFrame, ranges: pd.DataFrame, layers: list[dict] | None = None,
                  fusion_map: pd.DataFrame | None = None, fx_answers: pd.DataFrame | None = None) -> pd.DataFrame:
    """The layer instance each kernel belongs to.

    A forward kernel belongs to the innermost layer range enclosing its launch on the launching
    thread (a layer module called inside another layer takes its own kernels; the outer layer keeps
    the rest). A backward kernel (launched by an autograd node, outside every layer range) belongs to
    the layer of the forward op that created its node, found through the autograd sequence number
    (:func:`operator_profiler.attribution.correlation.find_ops`; for an nsys timeline
    :func:`operator_profiler.attribution.nvtx.kernel_layer_ranges`). A kernel no layer range claims takes the
    answer of its FX nodes (:func:`fx_membership` with ``fusion_map`` and the ``layers`` of ``layers.json`` on a
    Kineto timeline; ``fx_answers``, the same table, for an nsys timeline, carried over from the Kineto run).
    When ``layers`` lists layers but the timeline has no layer range (a whole-model compile), a kernel without
    an FX answer is ``unknown``, not outside the layers, when it belongs to the model: its launch lies in the
    model range (``opprof.model``) or its forward op does (a kernel of the harness's loss or optimizer lies
    outside and is ``outside_layers``); without model ranges every such kernel is ``unknown``.

    Returns:
        DataFrame aligned with ``kernels``: ``layer`` (instance label, see :func:`instance_labels`;
        None outside every layer), ``module`` (the module path), ``membership`` (one of :data:`MEMBERSHIPS`)
        and ``layers_spanned`` (list[str]: the instances a ``cross_layer`` kernel spans, with
        :data:`OUTSIDE_LAYERS` for FX nodes outside every layer; else empty).
    """
    from .attribution.correlation import find_ops

    n = len(kernels)
    layer_col = np.full(n, None, dtype=object)
    module_col = np.full(n, None, dtype=object)
    has_ranges = bool(len(ranges)) and bool(ranges["layer"].notna().any())
    layer_paths = [entry["path"] for entry in layers or []]
    whole_model = bool(layer_paths) and not has_ranges
    nsys = bool(n) and bool((kernels["source"] == "nsys").all())
    ops = find_ops(kernels, ranges) if n and not nsys and (has_ranges or fusion_map is not None or whole_model) \
        else None
    if n and has_ranges:
        labels = instance_labels(ranges)
        path_of = dict(zip(ranges["range_id"].astype(int), ranges["layer"]))
        if nsys:
            # NVTX ranges nest per (thread, domain), not per thread: path (b) answers the query.
            from .attribution.nvtx import kernel_layer_ranges

            rids = kernel_layer_ranges(kernels, ranges)
            layer_col[:] = [labels.get(int(r)) for r in rids]
            module_col[:] = [path_of.get(int(r)) if int(r) in labels else None for r in rids]
        else:
            layer_range = layer_range_of_ranges(ranges)
            range_ids = ops.range_ids
            for i in range(n):
                pos = ops.layer[i]
                rid = int(range_ids[pos]) if pos >= 0 else None
                if rid is not None and rid not in labels:
                    rid = None
                if rid is None and ops.forward[i] >= 0:
                    rid = layer_range.get(int(range_ids[ops.forward[i]]))
                if rid is not None:
                    layer_col[i] = labels[rid]
                    module_col[i] = path_of[rid]
    membership = np.where(pd.notna(layer_col), "layer_range", None).astype(object)
    spanned = np.empty(n, dtype=object)
    spanned.fill(NO_SPANS)  # one shared empty list (a million fresh ones took a second); entries are replaced, never mutated
    if fx_answers is None and fusion_map is not None and n and not nsys:
        fx_answers = fx_membership(kernels, ranges, fusion_map, layer_paths, ops)
    if fx_answers is not None and len(fx_answers):
        row_of = pd.Series(np.arange(n), index=kernels["kernel_id"].astype("int64").to_numpy())
        rows = row_of.reindex(fx_answers["kernel_id"].astype("int64").to_numpy()).to_numpy()
        for r, m, lab, mod, spans in zip(rows, fx_answers["membership"], fx_answers["layer"], fx_answers["module"],
                                         fx_answers["layers_spanned"]):
            if pd.isna(r) or membership[int(r)] is not None:
                continue  # a layer range's answer stands
            r = int(r)
            membership[r], layer_col[r], module_col[r], spanned[r] = m, lab, mod, list(spans)
    left = np.flatnonzero(pd.isna(membership))
    membership[left] = "outside_layers"
    if whole_model and len(left):
        in_model = _in_model(kernels, ranges, left, ops)
        membership[left[in_model]] = "unknown"
    return pd.DataFrame({"layer": pd.Series(layer_col, index=kernels.index, dtype=object),
                         "module": pd.Series(module_col, index=kernels.index, dtype=object),
                         "membership": pd.Series(membership, index=kernels.index, dtype=object),
                         "layers_spanned": pd.Series(spanned, index=kernels.index, dtype=object)})


def _in_model(kernels: pd.DataFrame, ranges: pd.DataFrame, rows: np.ndarray, ops=None) -> np.ndarray:
    """For kernel rows ``rows``: whether each belongs to the model (Kineto timeline): its launch lies inside a
    model range (:data:`operator_profiler.naming.MODEL_RANGE`), or its forward op does (a backward kernel).
    All True when the timeline has no model range (nothing tells model from harness code) or is an nsys one."""
    from .attribution.correlation import find_ops
    from .naming import MODEL_RANGE

    # a boolean per range (an object array of every range's name would hold one str object per range)
    is_model = (ranges["name"].astype(str) == MODEL_RANGE).to_numpy(dtype=bool) if len(ranges) else \
        np.zeros(0, dtype=bool)
    if not is_model.any() or (kernels["source"] == "nsys").all():
        return np.ones(len(rows), dtype=bool)
    ops = ops if ops is not None else find_ops(kernels, ranges)
    position = {int(r): i for i, r in enumerate(ranges["range_id"].astype("int64"))}
    under: dict[int, bool] = {}  # range position -> a model range is it or an ancestor
    parents = ranges["parent_id"].astype("Int64").to_numpy(dtype=object)

    def under_model(pos: int) -> bool:
        chain = []
        while pos >= 0 and pos not in under:
            chain.append(pos)
            parent = parents[pos]
            pos = position.get(int(parent), -1) if not pd.isna(parent) else -1
        found = under.get(pos, False) if pos >= 0 else False
        for p in reversed(chain):
            found = found or bool(is_model[p])
            under[p] = found
        return under[chain[0]] if chain else found

    out = np.zeros(len(rows), dtype=bool)
    for j, i in enumerate(rows):
        if any(is_model[position[r]] for r in ops.stack(int(i)) if r in position):
            out[j] = True
        elif ops.forward[i] >= 0:
            out[j] = under_model(int(ops.forward[i]))
    return out


def _class_name(module_class: str, signature: list) -> str:
    digest = hashlib.sha1(json.dumps(signature).encode()).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', module_class)}-{digest}"


def classify_layers(kernels: pd.DataFrame, ranges: pd.DataFrame, layers: list[dict], verify: bool = False,
                    fusion_map: pd.DataFrame | None = None, fx_answers: pd.DataFrame | None = None
                    ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, dict]]:
    """Group layer instances into classes.

    Args:
        kernels: timeline kernels (DESIGN.md §3).
        ranges: timeline ranges with the ``layer`` column.
        layers: ``layers.json`` of the capture (``[{"path", "class", "param_shapes"}]``).
        fusion_map, fx_answers: the FX-node membership of compiled kernels (:func:`kernel_layers`).

    Returns:
        ``(kernel_layers, instances, classes)``:
        ``kernel_layers``: kernel_id, layer (instance label or None), module (module path or None),
        layer_class, position (index of the kernel within its layer instance and iteration, or within
        the iteration's rest kernels), membership and layers_spanned (:func:`kernel_layers`);
        ``instances``: layer, module, module_class, layer_class, iteration, kernel_count, time_ns,
        representative;
        ``classes``: class name -> canonical dict (class, module_class, signature, instances,
        representative, kernel_count, replay_instances: the representative, and with ``verify`` a
        second instance when the class has one). No timestamps, so an unchanged class serializes
        identically.
    """
    module_class = {l["path"]: l["class"] for l in layers}
    assigned = kernel_layers(kernels, ranges, layers, fusion_map, fx_answers)
    kl, codes, labels, first_iteration = _instance_table(kernels, assigned)
    first_rows = np.flatnonzero(kl["iteration"].to_numpy() == first_iteration)
    signatures = _signatures(kernels, first_rows, codes, labels)
    classes, class_of = _classes(signatures, labels, codes, kl["module"].to_numpy(dtype=object), module_class,
                                 layers)
    kl["layer_class"] = pa.array(class_of, type=pa.string()).take(pa.array(codes)).to_pandas().array
    for entry in classes.values():
        # What ncu replays: the representative; with ``verify`` also a second instance, whose
        # counters are compared with the representative's (dedup.verify).
        entry["replay_instances"] = entry["instances"][: 2 if verify else 1]
    phases = pd.Series(kernel_phases(kernels, ranges)[first_rows], dtype=object)
    first_codes = pd.Series(codes[first_rows])
    first_phases = {labels[c]: Counter(p for p in phase if p is not None)
                    for c, phase in phases.groupby(first_codes, sort=False)} if len(first_rows) else {}
    spanned_first = assigned["layers_spanned"].to_numpy()[first_rows]
    crossing = np.fromiter(map(len, spanned_first), dtype=np.int64, count=len(spanned_first)) > 0
    boundary = Counter(lab for spans in spanned_first[crossing] for lab in spans)  # instance -> cross-layer kernels
    explain_splits(classes, layers, first_phases, boundary, generated_kernel_names(fusion_map))

    instance = np.asarray(labels, dtype=object)[codes] if len(codes) else np.empty(0, dtype=object)
    instances = (
        pd.DataFrame({"layer": instance, "iteration": kl["iteration"].to_numpy(),
                      "kernel_id": kl["kernel_id"].to_numpy(), "duration_ns": kernels["duration_ns"].to_numpy(),
                      "layer_class": kl["layer_class"].to_numpy()})
        .groupby(["layer", "iteration"], sort=False)
        .agg(kernel_count=("kernel_id", "size"), time_ns=("duration_ns", "sum"), layer_class=("layer_class", "first"))
        .reset_index()
    )
    module_of = _module_of_instance(labels, codes, kl["module"].to_numpy(dtype=object))
    instances["module"] = instances["layer"].map(module_of).where(instances["layer"] != REST_CLASS, None)
    instances["module_class"] = instances["module"].map(module_class)
    representatives = {c["representative"] for c in classes.values()}
    instances["representative"] = instances["layer"].map(lambda p: p in representatives)
    instances["time_ns"] = instances["time_ns"].astype("int64")
    return _kernel_table(kl, assigned), instances, classes


@bulk_memory()
def kernel_layer_classes(kernels: pd.DataFrame, ranges: pd.DataFrame, layers: list[dict],
                         fusion_map: pd.DataFrame | None = None, fx_answers: pd.DataFrame | None = None
                         ) -> pd.DataFrame:
    """The ``kernel_layers`` table of :func:`classify_layers` alone (what attribution reads), without
    what only the classify stage writes: the class files, the instances table, why classes split, and
    the signature of ``rest`` (on a trace without layer ranges, a list of every kernel of the first
    iteration). The same table, row for row."""
    module_class = {l["path"]: l["class"] for l in layers}
    assigned = kernel_layers(kernels, ranges, layers, fusion_map, fx_answers)
    kl, codes, labels, first_iteration = _instance_table(kernels, assigned)
    first_rows = np.flatnonzero((kl["iteration"].to_numpy() == first_iteration) & (kl["layer"].notna().to_numpy()))
    signatures = _signatures(kernels, first_rows, codes, labels)
    in_first = kl["iteration"].to_numpy() == first_iteration
    if REST_CLASS in labels and (codes[in_first] == labels.index(REST_CLASS)).any():
        # Its class name is fixed: no signature needed. (Like an instance, rest has a class only when it
        # has kernels in the first measured iteration.)
        signatures[REST_CLASS] = []
    _, class_of = _classes(signatures, labels, codes, kl["module"].to_numpy(dtype=object), module_class,
                           layers)
    kl["layer_class"] = pa.array(class_of, type=pa.string()).take(pa.array(codes)).to_pandas().array
    return _kernel_table(kl, assigned)


def _instance_shapes(label: str, layers_by_path: dict[str, dict]) -> str | None:
    """An instance's (``path`` or ``path#k``) parameter shapes and the input shapes of its call (layers.json),
    as one text; None when layers.json does not record the module."""
    layer = layers_by_path.get(label.partition("#")[0])
    if layer is None:
        return None
    call = _instance_call(label, {layer["path"]: layer.get("calls") or []})
    return json.dumps([layer.get("param_shapes"), (call or {}).get("input_shapes")], sort_keys=True)


def _classes(signatures: dict[str, list], labels: list, codes: np.ndarray, modules: np.ndarray,
             module_class: dict[str, str], layers: list[dict] | None = None
             ) -> tuple[dict[str, dict], np.ndarray]:
    """Instances with identical signatures and identical shapes (:func:`_instance_shapes` from ``layers``,
    layers.json) -> one class each; ``rest`` its own class. Returns the classes
    (class name -> canonical dict, without ``replay_instances``) and the class of each instance code
    (object array indexed by code; None for an instance without a signature: no kernel in the first
    measured iteration)."""
    classes: dict[str, dict] = {}
    instance_class: dict[str, str] = {}
    module_of = _module_of_instance(labels, codes, modules)
    layers_by_path = {l["path"]: l for l in layers or []}
    # In execution order (signatures were filled in kernel order): the representative of a class is
    # its first instance to run.
    for label in (p for p in signatures if p != REST_CLASS):
        mclass = module_class.get(module_of.get(label), "Layer")
        shapes = _instance_shapes(label, layers_by_path)
        # Kernels alike are not work alike: without grids (CPU kernels) or with grids that do not tell sizes
        # apart, layers of other widths (two ResNet stages) ran the same kernel names; counters measured on one
        # must never stand for the other, so their parameter and input shapes are part of the class.
        cls = _class_name(mclass, signatures[label] if shapes is None else [*signatures[label], ["shapes", shapes]])
        entry = classes.setdefault(
            cls,
            {"class": cls, "module_class": mclass, "signature": signatures[label],
             "instances": [], "representative": label, "kernel_count": len(signatures[label])},
        )
        entry["instances"].append(label)
        instance_class[label] = cls
    if REST_CLASS in signatures:
        classes[REST_CLASS] = {
            "class": REST_CLASS, "module_class": None, "signature": signatures[REST_CLASS],
            "instances": [REST_CLASS], "representative": REST_CLASS, "kernel_count": len(signatures[REST_CLASS]),
        }
        instance_class[REST_CLASS] = REST_CLASS
    return classes, np.array([instance_class.get(label) for label in labels], dtype=object)


def _module_of_instance(labels: list, codes: np.ndarray, modules: np.ndarray) -> dict:
    """instance label -> the module path of its last kernel."""
    if not len(codes):
        return {}
    last = len(codes) - 1 - np.unique(codes[::-1], return_index=True)[1]
    return {labels[c]: modules[i] for c, i in zip(np.unique(codes), last)}


def _kernel_table(kl: pd.DataFrame, assigned: pd.DataFrame) -> pd.DataFrame:
    kl["membership"] = assigned["membership"].to_numpy()
    kl["layers_spanned"] = assigned["layers_spanned"].to_numpy()
    return kl[["kernel_id", "layer", "module", "layer_class", "position", "membership", "layers_spanned"]]


def _instance_table(kernels: pd.DataFrame, assigned: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, list, int]:
    """Each kernel's instance (its layer label, or ``rest``) as an integer code, its iteration (-1 outside
    every iteration range) and its position within (instance, iteration), in kernel order.

    Returns ``(kl, codes, labels, first_iteration)``: ``kl`` has kernel_id, layer, module, iteration,
    position; ``labels[codes[i]]`` is kernel i's instance, labels in order of first appearance."""
    kl = pd.DataFrame({"kernel_id": kernels["kernel_id"], "layer": assigned["layer"], "module": assigned["module"]})
    codes, uniques = pd.factorize(assigned["layer"].to_numpy(dtype=object), use_na_sentinel=True)
    labels = [str(u) for u in uniques]
    rest = codes < 0
    if rest.any():
        codes = np.where(rest, len(labels), codes)
        labels.append(REST_CLASS)
    iteration = kernels["iteration"].fillna(-1).astype("int64").to_numpy()
    kl["iteration"] = iteration
    kl["position"] = _positions(codes, iteration)
    measured = iteration[iteration >= 0]
    # -1 marks kernels outside every iteration range; they never define a signature when a
    # measured iteration exists (otherwise one stray call would hide every layer).
    first_iteration = int(measured.min()) if len(measured) else -1
    return kl, codes, labels, first_iteration


def _positions(codes: np.ndarray, iteration: np.ndarray) -> np.ndarray:
    """The index of each kernel within its (instance code, iteration) group, in kernel order (int64)."""
    n = len(codes)
    if not n:
        return np.zeros(0, dtype=np.int64)
    _, iteration_codes = np.unique(iteration, return_inverse=True)
    key = codes.astype(np.int64) * (int(iteration_codes.max()) + 1) + iteration_codes
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64) - group_start
    return position


def _signatures(kernels: pd.DataFrame, rows: np.ndarray, codes: np.ndarray, labels: list) -> dict[str, list]:
    """instance -> its ordered ``[match_key, grid, block]`` entries over kernel ``rows`` (in kernel order),
    instances in order of their first kernel among ``rows``. Entries reference one Python string per
    distinct value (a trace without iteration ranges puts every kernel in the rest signature: a
    million kernels, a few hundred names)."""
    columns = []
    for column in ("match_key", "grid", "block"):
        value_codes, uniques = pd.factorize(kernels[column].iloc[rows], use_na_sentinel=False)
        values = list(uniques)
        if column != "match_key":  # grid and block as text, "" when unknown
            values = ["" if pd.isna(value) else str(value) for value in values]
        distinct = np.empty(len(values), dtype=object)
        distinct[:] = values
        columns.append(distinct[value_codes])
    entries = np.column_stack(columns) if len(rows) else np.empty((0, 3), dtype=object)
    row_codes = codes[rows]
    order = np.argsort(row_codes, kind="stable")
    instance_codes, first = np.unique(row_codes, return_index=True)
    bounds = np.searchsorted(row_codes[order], instance_codes)
    ends = np.r_[bounds[1:], len(rows)]
    signatures = {}
    for k in np.argsort(first, kind="stable"):
        signatures[labels[instance_codes[k]]] = entries[order[bounds[k]:ends[k]]].tolist()
    return signatures


#: Why one module class (same class and parameter shapes) fell into several layer classes (``split_reason``).
SPLIT_REASONS = {
    "input_needs_no_grad": "the input of some instances needs no gradient (the model's input, or computed without "
                           "grad), so autograd computes no input gradient in their backward and skips those kernels",
    "input_shapes_differ": "the instances receive inputs of different shapes, so their kernels (or their "
                           "configurations) differ",
    "compiled_boundary_differs": "a whole-model compile generated different kernels at the instances' boundaries: "
                                 "Inductor fused, and recomputed, code of a neighbouring layer or of the model's "
                                 "top level into cross-layer kernels (class rest) for some instances and not for "
                                 "others (it stores a residual value only every few layers), so their own kernel "
                                 "sequences differ; `compile_scope: layers` compiles every instance to the same code",
    "kernels_differ": "same module class, parameter shapes and inputs as far as recorded, different kernel "
                      "sequences; the cause is not known (e.g. a data-dependent branch or another dtype)",
}


def _instance_call(label: str, calls_of: dict[str, list]) -> dict | None:
    """The probe's record (``layers.json`` ``calls``) of instance ``path`` or ``path#k``: its k-th call."""
    path, _, k = label.partition("#")
    calls = calls_of.get(path) or []
    index = int(k) if k.isdigit() else 0
    return calls[index] if index < len(calls) else None


def _values(entry: dict, calls_of: dict[str, list], key: str) -> set:
    """The distinct ``key`` values the probe recorded for a class's instances (``None`` when one is unknown)."""
    out = set()
    for label in entry["instances"]:
        call = _instance_call(label, calls_of)
        value = None if call is None else call.get(key)
        out.add(json.dumps(value) if isinstance(value, list) else value)
    return out


def _kernel_difference(a: dict, b: dict, phases: dict[str, Counter]) -> str:
    """``N kernels per instance against M in <b>``, with the per-phase counts where phases are known and the
    kernel names one has more often than the other (a few)."""
    text = f"{a['kernel_count']} kernels per instance against {b['kernel_count']} in {b['class']}"
    pa, pb = phases.get(a["representative"], Counter()), phases.get(b["representative"], Counter())
    differing = [p for p in sorted(set(pa) | set(pb)) if pa[p] != pb[p]]
    if differing:
        text += " (" + ", ".join(f"{p} {pa[p]} vs {pb[p]}" for p in differing) + ")"
    na, nb = Counter(k[0] for k in a["signature"]), Counter(k[0] for k in b["signature"])
    more, fewer = sorted((na - nb).items()), sorted((nb - na).items())
    parts = []
    if more:
        parts.append("only here: " + ", ".join(f"{name} x{n}" for name, n in more[:3]) + (" ..." if len(more) > 3 else ""))
    if fewer:
        parts.append("only there: " + ", ".join(f"{name} x{n}" for name, n in fewer[:3])
                     + (" ..." if len(fewer) > 3 else ""))
    if not parts:
        parts.append("the same kernels in another order or with other launch configurations")
    return text + "; " + "; ".join(parts)


def explain_splits(classes: dict[str, dict], layers: list[dict], phases: dict[str, Counter],
                   boundary: Counter | None = None, generated: set[str] | frozenset = frozenset()) -> None:
    """Say why identical layers fell into several classes (in place): every layer class gets ``split_from``
    (the other classes of its module class and parameter shapes, ``[]`` when none), ``split_reason`` (a key of
    :data:`SPLIT_REASONS`, or None when not split) and ``split_detail`` (one sentence: which instances, the
    kernel counts per instance and per phase against the largest class, and the kernel names that differ).

    The reason comes from the capture's probe of each layer call (``layers.json`` ``calls``:
    ``input_requires_grad``, ``input_shapes``; :func:`operator_profiler.capture.workloads.probe_layer_inputs`), checked in
    that order; then ``compiled_boundary_differs`` when cross-layer kernels touch the instances of the two classes
    (``boundary``: instance -> cross-layer kernels of the first measured iteration whose ``layers_spanned`` list
    it) and every kernel name that differs is a generated one (``generated``:
    :func:`generated_kernel_names`);
    else ``kernels_differ``. ``phases``: instance -> its kernels per train-step phase in the first measured
    iteration. Classes are not merged: counters are broadcast by kernel position, which needs identical kernel
    sequences.
    """
    boundary = boundary or Counter()
    info = {l["path"]: l for l in layers}
    calls_of = {l["path"]: l.get("calls") or [] for l in layers}
    groups: dict[tuple, list[dict]] = {}
    for name, entry in classes.items():
        if name == REST_CLASS:
            continue
        entry.update(split_from=[], split_reason=None, split_detail=None)
        path = entry["representative"].partition("#")[0]
        shapes = json.dumps(info.get(path, {}).get("param_shapes"), sort_keys=True)
        groups.setdefault((entry["module_class"], shapes), []).append(entry)
    for group in groups.values():
        if len(group) < 2:
            continue
        largest = max(group, key=lambda e: len(e["instances"]))  # ties: the first to run
        for entry in group:
            other = largest if entry is not largest else next(e for e in group if e is not largest)
            grads = [_values(e, calls_of, "input_requires_grad") for e in (entry, other)]
            shapes = [_values(e, calls_of, "input_shapes") for e in (entry, other)]
            who = ", ".join(entry["instances"][:4]) + (" ..." if len(entry["instances"]) > 4 else "")
            if all(len(g) == 1 and None not in g for g in grads) and grads[0] != grads[1]:
                reason = "input_needs_no_grad"
                needs = "needs no gradient" if grads[0] == {False} else "needs a gradient"
                why = f"the input of {who} {needs}, that of {other['class']}'s instances does not" if grads[0] == {True} \
                    else f"the input of {who} {needs} (that of {other['class']}'s instances does)"
            elif None not in shapes[0] | shapes[1] and shapes[0] != shapes[1]:
                reason = "input_shapes_differ"
                why = f"{who} receive inputs of shapes {' or '.join(sorted(shapes[0]))}, {other['class']}'s instances " \
                      f"{' or '.join(sorted(shapes[1]))}"
            elif _boundary_differs(entry, other, boundary, generated):
                reason = "compiled_boundary_differs"
                touched = {lab: boundary[lab] for lab in entry["instances"] + other["instances"]}
                why = (f"{who}: same module class and parameter shapes as {other['class']}; Inductor fused code across "
                       "their boundaries differently (cross-layer kernels touching each instance: "
                       + ", ".join(f"{lab} {n}" for lab, n in touched.items()) + ")")
            else:
                reason = "kernels_differ"
                why = f"{who}: same module class and parameter shapes as {other['class']}, other kernels"
            entry["split_from"] = sorted(e["class"] for e in group if e is not entry)
            entry["split_reason"] = reason
            entry["split_detail"] = f"{why}: {_kernel_difference(entry, other, phases)}"


def generated_kernel_names(fusion_map: pd.DataFrame | None) -> frozenset[str]:
    """The names a kernel Inductor generated can have in a timeline (fusion-map ``kernel``, ``profiler_name``,
    ``gpu_symbol`` of its non-extern, non-fallback call sites); empty without a fusion map."""
    if fusion_map is None or fusion_map.empty:
        return frozenset()
    own = fusion_map[~fusion_map["kind"].isin(("extern", "fallback"))]
    return frozenset(str(v) for c in ("kernel", "profiler_name", "gpu_symbol") if c in own
                     for v in own[c].dropna() if str(v))


def _boundary_differs(a: dict, b: dict, boundary: Counter, generated: set[str] | frozenset) -> bool:
    """Whether two classes of one module class differ as a whole-model compile makes them differ: cross-layer kernels
    touch their instances (Inductor fused across their boundaries), and each kernel name one has more often than
    the other is a kernel Inductor generated (a library kernel that differs has another cause). The first instance
    of a stack differs even where every instance is touched alike: only its input comes from outside the layers."""
    if not any(boundary[lab] for e in (a, b) for lab in e["instances"]):
        return False
    na, nb = Counter(k[0] for k in a["signature"]), Counter(k[0] for k in b["signature"])
    differing = set((na - nb) + (nb - na))
    return bool(differing) and all(str(name) in generated for name in differing)


def canonical_json(obj: dict) -> str:
    """Sorted keys, fixed separators, trailing newline: byte-identical for equal content."""
    return json.dumps(obj, sort_keys=True, indent=1) + "\n"


def write_canonical_files(entries: dict[str, dict], out_dir: Path) -> None:
    """One ``<name>.json`` (:func:`canonical_json`) per entry in ``out_dir`` (created; files of other names
    removed). A file whose content is unchanged is not rewritten: its mtime stays, so Snakemake re-runs
    nothing that depends on it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.json"):
        if stale.stem not in entries:
            stale.unlink()
    for name, entry in entries.items():
        target = out_dir / f"{name}.json"
        text = canonical_json(entry)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def write_classes(classes: dict[str, dict], out_dir: Path) -> None:
    """One ``<class>.json`` per class in ``out_dir`` (:func:`write_canonical_files`)."""
    write_canonical_files(classes, out_dir)
