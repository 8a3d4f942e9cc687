"""One attribution record per kernel, merging the paths that had data.

Precedence for ``operator`` (documented in DESIGN.md §3): the correlation path (a) names the
operator when a dispatcher op encloses the launch; NVTX (b) comes next; a kernel that no ATen op
encloses but that the Inductor fusion map (c) places on a call site (:mod:`.compiled_graphs`) gets the
operator label of its fused ATen ops (a replayed library kernel: its extern call's op); one the map knows
but cannot place stays unattributed with the map's reason rather than take the profiler op around it. A
generated kernel whose call site lists no op (``cpp_fused_0``) is named by its kernel name (reason
``fusion_map_without_ops``: a partial answer), never ``0``. Last
of all, a kernel that no op names but a ``user_annotation`` range (``record_function``) encloses takes that
annotation's name (path ``user_annotation``). The fusion map always fills
``fused_ops``/``source_nodes``/``listed_not_computed`` when it has the kernel's call site.
``layer``/``layer_class`` come from the layer classification (backward
kernels belong to the layer of their forward op); ``module`` is the layer instance's module path.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pandas as pd

from ..heap import release_free_memory, bulk_memory
from . import compiled_graphs, inductor
from .inductor import VIEW_OPS
from .correlation import find_ops
from .row_groups import group_codes
from .transfer import align_runs



def fused_operator_label(fused_ops: list[str]) -> str | None:
    """``["aten::add", "aten::native_layer_norm", "aten::view"]`` -> ``"aten::add+aten::native_layer_norm"``."""
    if not fused_ops:
        return None
    compute = [op for op in fused_ops if op not in VIEW_OPS] or list(fused_ops)
    return "+".join(sorted(compute))


def site_operator(site: dict) -> str | None:
    """The operator a fusion-map call site names: the label of a generated kernel's fused ops
    (:func:`fused_operator_label`, ``listed_not_computed`` excluded); an extern/fallback call's own op
    (``extern_kernels.mm`` -> ``aten::mm``, its ``profiler_name``: the library kernels of a CUDA-graph replay)."""
    if site.get("kind") in ("extern", "fallback"):
        name = site.get("profiler_name")
        return name if isinstance(name, str) and "::" in name else fused_operator_label(list(site["fused_ops"]))
    return fused_operator_label(list(site["fused_ops"]))


def site_evidence(site: dict) -> dict:
    """The ``inductor`` entry of a kernel's evidence JSON for an answered call site."""
    out = {"graph": site.get("graph"), "call_index": site.get("call_index"), "kernel": site.get("kernel"),
           "kind": site.get("kind"), "fused_ops": list(site["fused_ops"]), "origin": site.get("origin"),
           "call_site": site.get("call_site", True), "joined_by": site.get("joined_by")}
    if site.get("listed_not_computed"):
        out["listed_not_computed"] = list(site["listed_not_computed"])
    if site.get("source_nodes_ambiguous"):
        out["source_nodes"] = "ambiguous"
    if site.get("candidates"):
        out["candidates"] = list(site["candidates"])
    return out


def _keep_fused_rows_apart(operator: np.ndarray, path: np.ndarray, fused_ops: np.ndarray,
                           dispatcher: np.ndarray, extern_calls: np.ndarray | None = None) -> None:
    """A fused kernel whose label dropped view ops and then equals an op that kernels also ran as a
    real call (a layout copy listing ``aten::view`` beside the op it feeds) is not a call of that op: it
    would merge into the op's row and inflate its calls. Such a kernel is labelled with all its ops, views
    included. A fused kernel of exactly the op (a compiled layer's layer norm beside the eager final one)
    *is* a call of it and keeps the plain label, as does a library kernel placed on an extern/fallback call
    site (``extern_calls``: a CUDA-graph replay's GEMM is a call of ``aten::mm``). In place."""
    called = set(operator[dispatcher])
    for i in np.flatnonzero(path == "inductor"):
        if operator[i] in called and not (extern_calls is not None and extern_calls[i]):
            operator[i] = "+".join(sorted(set(fused_ops[i])))


def _user_annotation_fallback(ops, path: np.ndarray) -> np.ndarray:
    """Rows that no path named but that lie in a user annotation which may name an operator
    (:func:`correlation.find_ops` ``annotation``), outside any compiled-graph region (whose kernels
    are the fusion map's to name): they take the annotation, with the lowest precedence (DESIGN.md §3)."""
    return (path == "unattributed") & (ops.annotation >= 0) & (ops.compiled_region < 0)


@bulk_memory()
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
        op instance, to count calls; the annotation's range for path ``user_annotation``),
        ``duration_ns`` and ``iteration``. Unattributed kernels have
        ``path == "unattributed"``, ``operator`` null and a machine-readable ``reason``.
    """
    fusion_map = fusion_map if fusion_map is not None else pd.DataFrame()
    release_free_memory()  # what the stages before left free (the peak of a big trace is reached below)
    ops = find_ops(kernels, ranges)
    release_free_memory()  # find_ops' per-range temporaries
    n = len(kernels)
    kernel_ids = ops.kernel_id
    fusion = compiled_graphs.resolve(kernels, ranges, ops, fusion_map)

    names = ops.names
    op_pos = ops.operator
    dispatcher = ops.operator_kind == "dispatcher_op"
    has_op = op_pos >= 0
    fallback_name = names.take(op_pos)
    operator = np.where(dispatcher, fallback_name, None)
    path = np.where(dispatcher, "correlation", "unattributed").astype(object)
    reason = np.where(dispatcher, None, ops.reason).astype(object)
    fused_col = np.empty(n, dtype=object)
    nodes_col = np.empty(n, dtype=object)
    lnc_col = np.empty(n, dtype=object)
    empty: list = []
    fused_col[:] = [empty] * n
    nodes_col[:] = [empty] * n
    lnc_col[:] = [empty] * n
    ambiguous_nodes = np.zeros(n, dtype=bool)
    extern_calls = np.zeros(n, dtype=bool)  # placed on an extern/fallback call site (replayed library kernels)
    without_ops = np.zeros(n, dtype=bool)  # a generated kernel the map places but lists no op for: its own name
    kernel_names = kernels.set_index(kernels["kernel_id"].astype("int64"))["name"].reindex(kernel_ids).to_numpy(
        dtype=object) if fusion.sites else np.empty(0, dtype=object)
    refused = np.zeros(n, dtype=bool)  # the fusion map knows the kernel but could not place it
    row_of = {int(k): i for i, k in enumerate(kernel_ids)} if fusion.sites or fusion.refusals else {}
    site_rows: dict[int, dict] = {}
    refusal_rows: dict[int, dict] = {}
    for kid, site in fusion.sites.items():
        i = row_of[kid]
        site_rows[i] = site
        fused_col[i], nodes_col[i] = list(site["fused_ops"]), list(site["source_nodes"])
        lnc_col[i] = list(site["listed_not_computed"])
        ambiguous_nodes[i] = site["source_nodes_ambiguous"]
        extern_calls[i] = site.get("kind") in ("extern", "fallback")
        if operator[i] is None:
            label = site_operator(site)
            if not label and site.get("kind") not in ("extern", "fallback"):
                # A generated kernel whose call site lists no op (`cpp_fused_0`): named by its kernel name.
                label = str(kernel_names[i])
                without_ops[i] = True
            operator[i] = label
            path[i] = "inductor" if label else "unattributed"
            reason[i] = None if label else "fusion_map_without_ops"
    for kid, refusal in fusion.refusals.items():
        i = row_of[kid]
        if refusal["block"]:
            refusal_rows[i] = refusal
            refused[i] = True
        if operator[i] is None and (refusal["block"] or not has_op[i]):
            reason[i] = refusal["reason"]
    _keep_fused_rows_apart(operator, path, fused_col, dispatcher, extern_calls)
    fallback = (operator == None) & has_op & ~dispatcher & ~refused  # noqa: E711 (object array)
    operator[fallback] = fallback_name[fallback]
    path[fallback] = "correlation"
    reason[fallback] = None
    reason[path != "unattributed"] = None
    # An operator named, FX nodes undecided (a reused kernel whose call site is unknown): a partial answer.
    reason[ambiguous_nodes & (path == "inductor")] = "source_nodes_ambiguous"
    # Named by its kernel name, not by ATen ops: a partial answer too.
    reason[without_ops & (path == "inductor")] = "fusion_map_without_ops"
    by_annotation = _user_annotation_fallback(ops, path) & ~refused
    annotation_name = names.take(ops.annotation)
    operator[by_annotation] = annotation_name[by_annotation]
    path[by_annotation] = "user_annotation"
    reason[by_annotation] = None
    op_range_pos = np.where(by_annotation, ops.annotation, op_pos)

    # Evidence JSON, keys sorted as json.dumps(sort_keys=True) writes them.
    corr = kernels["correlation_id"].astype("Int64").fillna(0).astype("int64").to_numpy()
    stack_at, stack_texts = ops.stack_json_column()
    stack_cache: dict = {}

    def evidence_of(i: int) -> str:
        parts = []
        if ops.reason[i] == "no_launch_record":
            parts.append(f'"correlation_id": {corr[i]}')
        if ops.external_id[i] >= 0:
            parts.append(f'"external_id": {int(ops.external_id[i])}')
        if ops.external_id_check[i] is not None:
            parts.append(f'"external_id_check": "{ops.external_id_check[i]}"')
        if ops.external_id[i] >= 0:  # disagrees: the op that id names (null: none in the trace)
            parts.append(f'"external_id_op": {json.dumps(ops.external_id_op[i])}')
        parts.append(f'"operator": {json.dumps(fallback_name[i])}')
        if ops.operator_kind[i] is not None:
            parts.append(f'"operator_kind": "{ops.operator_kind[i]}"')
        if ops.reason[i] is not None:
            parts.append(f'"reason": "{ops.reason[i]}"')
        stack = stack_texts[stack_at[i]] if stack_at[i] >= 0 else ops.stack_json(i, stack_cache)
        parts.append(f'"stack": {stack}')
        text = '{"correlation": {' + ", ".join(parts) + "}"
        site = site_rows.get(i)
        if site is not None:
            text += ', "inductor": ' + json.dumps(site_evidence(site), sort_keys=True)
        elif i in refusal_rows:
            text += ', "inductor": ' + json.dumps(
                {"reason": refusal_rows[i]["reason"], "candidates": refusal_rows[i]["candidates"]}, sort_keys=True)
        if by_annotation[i]:
            text += ', "user_annotation": ' + json.dumps({
                "operator": annotation_name[i], "range_id": int(ops.range_ids[ops.annotation[i]])}, sort_keys=True)
        return text + "}"

    # A row with nothing of its own (no correlation or External id in its text, no fusion-map site or
    # refusal, no annotation, a whole-ancestry stack) has the text of every such row with the same
    # operator, kind, reason, check and stack: each distinct text is written once (the op instances of
    # a trace share a few thousand).
    own_text = (ops.reason == "no_launch_record") | (ops.external_id >= 0) | by_annotation | (stack_at < 0)
    own_text[list(site_rows)] = True
    own_text[list(refusal_rows)] = True
    shared = np.flatnonzero(~own_text)
    codes = group_codes([fallback_name[shared], ops.operator_kind[shared], ops.reason[shared],
                          ops.external_id_check[shared], stack_at[shared]])
    texts = [evidence_of(i) for i in shared[np.unique(codes, return_index=True)[1]].tolist()]
    text_of = np.empty(n, dtype=np.int64)
    text_of[shared] = codes
    own_rows = np.flatnonzero(own_text)
    text_of[own_rows] = np.arange(len(texts), len(texts) + len(own_rows))
    texts += [evidence_of(i) for i in own_rows.tolist()]
    # Each distinct text is encoded once; the column is their Arrow take (a ``str`` column).
    evidence = pa.array(texts, type=pa.large_string()).take(pa.array(text_of)).to_pandas().array

    layers = kernel_layers.set_index(kernel_layers["kernel_id"].astype("int64"))
    module_column = "module" if "module" in kernel_layers else "layer"

    def pick(column: str) -> np.ndarray:
        values = layers[column].reindex(kernel_ids)
        return np.where(values.isna(), None, values.astype(object)).astype(object)

    forward = names.take(ops.forward)
    op_range_id = pd.arrays.IntegerArray(
        np.where(op_range_pos >= 0, ops.range_ids[np.maximum(op_range_pos, 0)] if len(ops.range_ids) else 0,
                 0).astype(np.int64), op_range_pos < 0)
    # Path (a)'s per-range arrays are done with: the table below is the peak of a big trace's attribution.
    del ops, names, fusion, texts, text_of, evidence_of, site_rows, refusal_rows
    release_free_memory()
    out = pd.DataFrame({
        "kernel_id": kernel_ids,
        "operator": operator,
        "forward_operator": forward,
        "module": pick(module_column),
        "layer": pick("layer"),
        "layer_class": pick("layer_class"),
        "path": path,
        "fused_ops": fused_col,
        "source_nodes": nodes_col,
        "listed_not_computed": lnc_col,
        "reason": reason,
        "evidence": evidence,
        "operator_range_id": op_range_id,
        "duration_ns": kernels["duration_ns"].astype("int64").to_numpy(),
        "iteration": pd.array(kernels["iteration"], dtype="Int64"),
        "name": kernels["name"].astype(str).array,  # shares the timeline's strings
        "valid_time": kernels["valid_time"].astype(bool).to_numpy() if "valid_time" in kernels else True,
    })
    return out


def _join_evidence(first: str, second: str) -> str:
    """Two evidence JSON objects with different top-level keys -> one object (no re-parse)."""
    if not second or second == "{}":
        return first
    if not first or first == "{}":
        return second
    return first[:-1] + ", " + second[1:]


def merge_kineto_run(primary: pd.DataFrame, kernels: pd.DataFrame, kineto_result: pd.DataFrame,
                     kineto_kernels: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Add paths (a) and (c) from a separate torch.profiler run of the same program to an nsys
    timeline's path (b) result (the ``capture_kineto`` run of DESIGN.md §2).

    The runs' kernels are paired by invocation order (:func:`operator_profiler.attribution.transfer.align_runs`).
    Precedence (DESIGN.md §3): where the Kineto run named an operator (correlation, or the fusion
    map for a generated kernel) it wins; otherwise NVTX's answer stays, and the Kineto run's
    ``user_annotation`` answer is taken only where NVTX had none. ``fused_ops``/``source_nodes``
    come from the fusion map; ``forward_operator`` from (a), else (b). Every kernel's evidence gets a
    ``correlation`` entry (``reason: no_partner_in_kineto_run`` when unpaired), so coverage by path
    counts it.

    Args:
        primary: :func:`operator_profiler.attribution.nvtx.attribute_nvtx` output on ``kernels``.
        kernels: the nsys timeline's kernels table.
        kineto_result: :func:`attribute` output on the Kineto run's timeline ``kineto_kernels``.

    Returns:
        ``(attribution, summary)``: the merged attribution (same columns as ``primary``) and the
        pairing summary (counts, ``keyed_by``, ``mismatched_iterations``).
    """
    pairs, summary = align_runs(kernels, kineto_kernels)
    src = kineto_result.set_index(kineto_result["kernel_id"].astype("int64"))
    out = primary.copy()
    row_of = pd.Series(np.arange(len(out)), index=out["kernel_id"].astype("int64"))
    rows = row_of.reindex(pairs["kernel_id"]).to_numpy()
    partner = src.loc[pairs["source_kernel_id"].to_numpy()]
    evidence = out["evidence"].astype(object).to_numpy().copy()
    paired = np.zeros(len(out), dtype=bool)
    paired[rows] = True
    kineto_evidence = [
        ev[:-1] + f', "kineto_kernel_id": {int(sk)}}}' if ev.endswith("}") else ev
        for ev, sk in zip(partner["evidence"], pairs["source_kernel_id"])
    ]
    for i, ev in zip(rows, kineto_evidence):
        evidence[i] = _join_evidence(evidence[i], ev)
    unpaired = '{"correlation": {"reason": "no_partner_in_kineto_run"}}'
    for i in np.flatnonzero(~paired):
        evidence[i] = _join_evidence(evidence[i], unpaired)
    out["evidence"] = evidence

    # A user annotation is the last resort: it names a kernel only where NVTX did not.
    partner_path = partner["path"].to_numpy()
    named = (partner_path != "unattributed") & (
        (partner_path != "user_annotation") | (out["path"].to_numpy()[rows] == "unattributed"))
    take = rows[named]
    chosen = partner[named]
    for column in ("operator", "path", "fused_ops", "source_nodes", "listed_not_computed"):
        values = out[column].astype(object).to_numpy().copy()
        values[take] = chosen[column].astype(object).to_numpy()
        out[column] = values
    # The fusion map's ops also on kernels whose operator stays NVTX's.
    fused = partner["fused_ops"].map(len).to_numpy() > 0
    fill = rows[fused & ~named]
    for column in ("fused_ops", "source_nodes", "listed_not_computed"):
        values = out[column].astype(object).to_numpy().copy()
        values[fill] = partner.loc[fused & ~named, column].astype(object).to_numpy() if fill.size else values[fill]
        out[column] = values
    forward = out["forward_operator"].astype(object).to_numpy().copy()
    kineto_forward = partner["forward_operator"].astype(object).to_numpy()
    has_forward = pd.notna(kineto_forward)
    forward[rows[has_forward]] = kineto_forward[has_forward]
    out["forward_operator"] = forward
    reason = out["reason"].astype(object).to_numpy().copy()
    # a named kernel's only reason is a partial answer of the Kineto run (source_nodes_ambiguous)
    reason[take] = chosen["reason"].astype(object).to_numpy()
    out["reason"] = reason
    # An op instance of the Kineto run (to count calls) must not collide with this timeline's range
    # ids: it is stored as -(its Kineto range id + 1).
    op_range = pd.array(out["operator_range_id"], dtype="Int64").copy()
    kineto_range = pd.array(chosen["operator_range_id"], dtype="Int64")
    op_range[take] = -(kineto_range + 1)
    out["operator_range_id"] = op_range
    summary["named_by_kineto_run"] = int(named.sum())
    return out, summary


def merge_fusion_by_name(primary: pd.DataFrame, kernels: pd.DataFrame, fusion_map: pd.DataFrame) -> pd.DataFrame:
    """Path (c) on a timeline without compiled-graph regions (an nsys capture): the fusion map is
    joined by kernel name and call-site order (:func:`operator_profiler.attribution.inductor.attribute_by_name`).

    A generated kernel (Triton / C++) found in the map gets the fused ops' label as its operator
    (path ``inductor``): the NVTX range around its launch is the compiled-graph wrapper, not an op.
    Every kernel the map knows gets ``fused_ops``/``source_nodes``/``listed_not_computed``; one whose call site
    is undecided but whose candidate sites agree on the ops keeps the operator with empty ``source_nodes`` and
    reason ``source_nodes_ambiguous`` (evidence ``inductor.source_nodes: "ambiguous"``, ``candidates``); a kernel
    with an Inductor name the map cannot place keeps its NVTX answer, with the map's reason in the evidence.
    """
    found = inductor.attribute_by_name(kernels, fusion_map)
    found = found.set_index(found["kernel_id"].astype("int64"))
    out = primary.copy()
    ids = out["kernel_id"].astype("int64").to_numpy()
    rows = found.reindex(ids)
    matched = rows["match"].notna().to_numpy()
    # Kernels that are not Inductor kernels at all (cuBLAS, eager ATen kernels) get no inductor evidence.
    has_reason = (rows["reason"].notna() & ~rows["reason"].isin(["extern_kernel_name_unknown", "no_fusion_map"])
                  ).to_numpy()
    operator = out["operator"].astype(object).to_numpy().copy()
    path = out["path"].astype(object).to_numpy().copy()
    reason = out["reason"].astype(object).to_numpy().copy()
    fused_col = out["fused_ops"].astype(object).to_numpy().copy()
    nodes_col = out["source_nodes"].astype(object).to_numpy().copy()
    lnc_col = np.empty(len(out), dtype=object)
    lnc_col[:] = out["listed_not_computed"].tolist() if "listed_not_computed" in out else [[]] * len(out)
    evidence = out["evidence"].astype(object).to_numpy().copy()
    kernels_by_id = kernels.set_index(kernels["kernel_id"].astype("int64"))
    for i in np.flatnonzero(matched | has_reason):
        row = rows.iloc[i]
        if matched[i]:
            fused = list(row["fused_ops"])
            site = {"graph": None if pd.isna(row["graph"]) else row["graph"],
                    "call_index": None if pd.isna(row["call_index"]) else int(row["call_index"]),
                    "kernel": row["kernel"], "fused_ops": fused, "source_nodes": list(row["source_nodes"]),
                    "module_stack": list(row["module_stack"]), "call_site": True,
                    "joined_by": f"kernel_name:{row['match']}"}
            if len(row["listed_not_computed"]):
                site["listed_not_computed"] = list(row["listed_not_computed"])
            if row["source_nodes_ambiguous"]:
                site["source_nodes"] = "ambiguous"
            if len(row["candidates"]):
                site["candidates"] = list(row["candidates"])
            fused_col[i], nodes_col[i] = fused, list(row["source_nodes"])
            lnc_col[i] = list(row["listed_not_computed"])
            label = fused_operator_label(fused)
            if label:  # only generated (Triton / C++) call sites are matched by name
                operator[i], path[i] = label, "inductor"
                reason[i] = "source_nodes_ambiguous" if row["source_nodes_ambiguous"] else None
            else:  # a generated kernel whose call site lists no op (`triton_poi_fused_0`): its kernel name
                operator[i], path[i], reason[i] = str(kernels_by_id.loc[ids[i], "name"]), "inductor", \
                    "fusion_map_without_ops"
        else:
            site = {"reason": row["reason"]}
            if len(row["candidates"]):
                site["candidates"] = list(row["candidates"])
        evidence[i] = _join_evidence(evidence[i], json.dumps({"inductor": site}, sort_keys=True, default=str))
    out["operator"], out["path"], out["reason"] = operator, path, reason
    out["fused_ops"], out["source_nodes"], out["evidence"] = fused_col, nodes_col, evidence
    out["listed_not_computed"] = lnc_col
    return out


# Path (c) refusals that say the map does not fit the trace (rather than that it fits several ways).
_FUSION_MISMATCH_REASONS = ("fusion_map_mismatch", "cuda_graph_replay_mismatch", "not_in_fusion_map")


def fusion_map_warning(result: pd.DataFrame, fusion: pd.DataFrame, timeline_dir) -> str | None:
    """One warning about what the fusion map could not place (None when it placed every kernel it could).

    "Is it from another run?" only when it placed no kernel and every refusal says the map does not fit
    (:data:`_FUSION_MISMATCH_REASONS`); otherwise the count per reason, the candidate graphs of
    ``ambiguous_compiled_graph``, and the kernels whose FX nodes stayed undecided (``source_nodes_ambiguous``).
    Reads the ``inductor`` entry of each kernel's evidence JSON (its keys are sorted, so an answered call site
    starts with ``call_index``).
    """
    evidence = result["evidence"].astype(str)
    matched = int(evidence.str.contains('"inductor": {"call_index"', regex=False).sum())
    refused = evidence.str.extract(r'"inductor": \{[^{}]*?"reason": "(\w+)"', expand=False)
    counts = refused.value_counts()
    ambiguous_nodes = int((result["reason"] == "source_nodes_ambiguous").sum())
    graphs = fusion["graph"].nunique()
    if not matched and set(counts.index) <= set(_FUSION_MISMATCH_REASONS):
        detail = ", ".join(f"{n} {why}" for why, n in counts.items())
        return (f"the fusion map ({len(fusion)} call sites of {graphs} graphs) matched no kernel of {timeline_dir}"
                f"{f' ({detail})' if detail else ''}: is it from another run or model?")
    if counts.empty and not ambiguous_nodes:
        return None
    parts = [f"{n} {why}" for why, n in counts.items()]
    if "ambiguous_compiled_graph" in counts:
        sets = evidence[refused == "ambiguous_compiled_graph"].str.extract(
            r'"candidates": \[([^\]]*)\]', expand=False).value_counts()
        parts[list(counts.index).index("ambiguous_compiled_graph")] += " (graphs " + "; ".join(
            s.replace('"', "") for s in sets.index[:3]) + (" ..." if len(sets) > 3 else "") + \
            ": pass the TORCH_TRACE log of the compile in the Inductor dir to tell them apart)"
    if ambiguous_nodes:
        parts.append(f"{ambiguous_nodes} with their operator but undecided FX nodes (source_nodes_ambiguous)")
    return f"the fusion map ({graphs} graphs) placed {matched} kernels of {timeline_dir}; not placed: {'; '.join(parts)}"
