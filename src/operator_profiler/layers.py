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
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from .timeline.kineto import iteration_at, kernel_phases

REST_CLASS = "rest"
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


def kernel_layers(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """The layer instance each kernel belongs to.

    A forward kernel belongs to the innermost layer range enclosing its launch on the launching
    thread (a layer module called inside another layer takes its own kernels; the outer layer keeps
    the rest). A backward kernel (launched by an autograd node, outside every layer range) belongs to
    the layer of the forward op that created its node, found through the autograd sequence number
    (:func:`operator_profiler.attribution.correlation.find_ops`; for an nsys timeline
    :func:`operator_profiler.attribution.nvtx.kernel_layer_ranges`).

    Returns:
        DataFrame aligned with ``kernels``: ``layer`` (instance label, see :func:`instance_labels`;
        None outside every layer) and ``module`` (the module path).
    """
    from .attribution.correlation import find_ops

    out = pd.DataFrame({"layer": None, "module": None}, index=kernels.index, dtype=object)
    if kernels.empty or not ranges["layer"].notna().any():
        return out
    labels = instance_labels(ranges)
    path_of = dict(zip(ranges["range_id"].astype(int), ranges["layer"]))
    if (kernels["source"] == "nsys").all():
        # NVTX ranges nest per (thread, domain), not per thread: path (b) answers the query.
        from .attribution.nvtx import kernel_layer_ranges

        rids = kernel_layer_ranges(kernels, ranges)
        out["layer"] = [labels.get(int(r)) for r in rids]
        out["module"] = [path_of.get(int(r)) for r in rids]
        return out
    layer_range = layer_range_of_ranges(ranges)
    ops = find_ops(kernels, ranges)
    range_ids = ops.range_ids
    layer_col, module_col = out["layer"].to_numpy(dtype=object).copy(), out["module"].to_numpy(dtype=object).copy()
    for i in range(len(kernels)):
        pos = ops.layer[i]
        rid = int(range_ids[pos]) if pos >= 0 else None
        if rid is not None and rid not in labels:
            rid = None
        if rid is None and ops.forward[i] >= 0:
            rid = layer_range.get(int(range_ids[ops.forward[i]]))
        if rid is not None:
            layer_col[i] = labels[rid]
            module_col[i] = path_of[rid]
    out["layer"] = pd.Series(layer_col, index=out.index, dtype=object)
    out["module"] = pd.Series(module_col, index=out.index, dtype=object)
    return out


def _class_name(module_class: str, signature: list) -> str:
    digest = hashlib.sha1(json.dumps(signature).encode()).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', module_class)}-{digest}"


def classify_layers(kernels: pd.DataFrame, ranges: pd.DataFrame, layers: list[dict], verify: bool = False
                    ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, dict]]:
    """Group layer instances into classes.

    Args:
        kernels: timeline kernels (DESIGN.md §3).
        ranges: timeline ranges with the ``layer`` column.
        layers: ``layers.json`` of the capture (``[{"path", "class", "param_shapes"}]``).

    Returns:
        ``(kernel_layers, instances, classes)``:
        ``kernel_layers``: kernel_id, layer (instance label or None), module (module path or None),
        layer_class, position (index of the kernel within its layer instance and iteration, or within
        the iteration's rest kernels);
        ``instances``: layer, module, module_class, layer_class, iteration, kernel_count, time_ns,
        representative;
        ``classes``: class name -> canonical dict (class, module_class, signature, instances,
        representative, kernel_count, replay_instances: the representative, and with ``verify`` a
        second instance when the class has one). No timestamps, so an unchanged class serializes
        identically.
    """
    module_class = {l["path"]: l["class"] for l in layers}
    assigned = kernel_layers(kernels, ranges)
    kl = pd.DataFrame({"kernel_id": kernels["kernel_id"], "layer": assigned["layer"], "module": assigned["module"]})
    kl["iteration"] = kernels["iteration"].fillna(-1).astype("int64").to_numpy()
    # .array keeps Arrow-backed strings as they are (to_numpy would make one Python str per kernel).
    kl["match_key"] = kernels["match_key"].array
    kl["grid"] = kernels["grid"].astype("str").fillna("").array
    kl["block"] = kernels["block"].astype("str").fillna("").array
    kl["duration_ns"] = kernels["duration_ns"].to_numpy()
    kl["phase"] = kernel_phases(kernels, ranges)
    kl["instance"] = kl["layer"].fillna(REST_CLASS)
    kl["position"] = kl.groupby(["instance", "iteration"]).cumcount().astype("int64")
    # -1 marks kernels outside every iteration range; they never define a signature when a
    # measured iteration exists (otherwise one stray call would hide every layer).
    measured = kl.loc[kl["iteration"] >= 0, "iteration"]
    first_iteration = int(measured.min()) if len(measured) else -1

    # Signatures of the first measured iteration.
    signatures: dict[str, list] = {}
    first = kl[kl["iteration"] == first_iteration]
    # Entries reference one Python string per distinct value (a trace without iteration ranges puts
    # every kernel in the rest signature: a million kernels, a few hundred names).
    parts = [pd.factorize(first[c]) for c in ("match_key", "grid", "block")]
    coded = pd.DataFrame({"instance": first["instance"].to_numpy(), "a": parts[0][0], "b": parts[1][0], "c": parts[2][0]})
    labels = [np.array(list(uniques), dtype=object) for _, uniques in parts]
    for instance, group in coded.groupby("instance", sort=False):
        columns = (labels[i][group[c].to_numpy()].tolist() for i, c in enumerate("abc"))
        signatures[instance] = list(map(list, zip(*columns)))

    classes: dict[str, dict] = {}
    instance_class: dict[str, str] = {}
    module_of = dict(zip(kl["instance"], kl["module"]))
    # In execution order (signatures were filled in kernel order): the representative of a class is
    # its first instance to run.
    for label in (p for p in signatures if p != REST_CLASS):
        mclass = module_class.get(module_of.get(label), "Layer")
        cls = _class_name(mclass, signatures[label])
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
    kl["layer_class"] = kl["instance"].map(instance_class)
    for entry in classes.values():
        # What ncu replays: the representative; with ``verify`` also a second instance, whose
        # counters are compared with the representative's (dedup.verify).
        entry["replay_instances"] = entry["instances"][: 2 if verify else 1]
    first_phases = {label: Counter(p for p in phase if p is not None)
                    for label, phase in first.groupby("instance", sort=False)["phase"]}
    explain_splits(classes, layers, first_phases)

    instances = (
        kl.groupby(["instance", "iteration"], sort=False)
        .agg(kernel_count=("kernel_id", "size"), time_ns=("duration_ns", "sum"), layer_class=("layer_class", "first"))
        .reset_index()
        .rename(columns={"instance": "layer"})
    )
    instances["module"] = instances["layer"].map(module_of).where(instances["layer"] != REST_CLASS, None)
    instances["module_class"] = instances["module"].map(module_class)
    instances["representative"] = instances["layer"].map(
        lambda p: p in {c["representative"] for c in classes.values()}
    )
    instances["time_ns"] = instances["time_ns"].astype("int64")
    kernel_table = kl[["kernel_id", "layer", "module", "layer_class", "position"]]
    return kernel_table, instances, classes


#: Why one module class (same class and parameter shapes) fell into several layer classes (``split_reason``).
SPLIT_REASONS = {
    "input_needs_no_grad": "the input of some instances needs no gradient (the model's input, or computed without "
                           "grad), so autograd computes no input gradient in their backward and skips those kernels",
    "input_shapes_differ": "the instances receive inputs of different shapes, so their kernels (or their "
                           "configurations) differ",
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


def explain_splits(classes: dict[str, dict], layers: list[dict], phases: dict[str, Counter]) -> None:
    """Say why identical layers fell into several classes (in place): every layer class gets ``split_from``
    (the other classes of its module class and parameter shapes, ``[]`` when none), ``split_reason`` (a key of
    :data:`SPLIT_REASONS`, or None when not split) and ``split_detail`` (one sentence: which instances, the
    kernel counts per instance and per phase against the largest class, and the kernel names that differ).

    The reason comes from the capture's probe of each layer call (``layers.json`` ``calls``:
    ``input_requires_grad``, ``input_shapes``; :func:`operator_profiler.workloads.probe_layer_inputs`), checked in
    that order; without it (a trace captured elsewhere) the reason is ``kernels_differ``. ``phases``: instance ->
    its kernels per train-step phase in the first measured iteration. Classes are not merged: counters are
    broadcast by kernel position, which needs identical kernel sequences.
    """
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
            else:
                reason = "kernels_differ"
                why = f"{who}: same module class and parameter shapes as {other['class']}, other kernels"
            entry["split_from"] = sorted(e["class"] for e in group if e is not entry)
            entry["split_reason"] = reason
            entry["split_detail"] = f"{why}: {_kernel_difference(entry, other, phases)}"


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
