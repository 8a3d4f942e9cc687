"""Attribution path (c): the TorchInductor fusion map.

TorchInductor writes, per compiled FX graph, a debug directory (``TORCH_COMPILE_DEBUG=1``) whose ``output_code.py``
holds the generated kernels and a ``call()`` function that launches them in order.  This module turns every call
site of ``call()`` into one row saying which kernel runs, what name a profiler timeline shows for it, and which
ATen operators / FX nodes it was fused from.  A timeline region ``## Call CompiledFxGraph <key> ##`` is then mapped
to its graph by :func:`match_region` (the i-th kernel of the region is call site i); a timeline without such
regions (nsys) is joined by kernel name and call-site order with :func:`attribute_by_name`.

Format facts are from ``docs/formats.md#inductor-debug-artifacts`` (measured on torch 2.13 CPU artifacts and an
Oct-2024 CUDA debug dir): its sections on the directory layout, ``output_code.py`` anatomy and comment dialects, kernel
names, kernels in the Kineto trace and the provenance JSON.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..naming import MODULE_PATHS_FORMAT, MODULE_PATHS_JSON
from ..errors import InductorArtifactError

__all__ = [
    "ATTRIBUTE_BY_NAME_COLUMNS",
    "BY_NAME_REASONS",
    "FUSION_MAP_COLUMNS",
    "InductorArtifactError",
    "attribute_by_name",
    "find_graph_dirs",
    "fitting_graphs",
    "graph_kind",
    "is_generic_triton_name",
    "load_fusion_map",
    "match_region",
    "normalize_kernel_name",
    "parse_output_code",
    "torch_trace_graph_ids",
]

OUTPUT_CODE = "output_code.py"
PROVENANCE_JSON = "inductor_provenance_tracking_node_mappings.json"
FX_GRAPH_FILES = ("fx_graph_readable.py", "fx_graph_transformed.py")

FUSION_MAP_COLUMNS = [
    "graph",
    "call_index",
    "kernel",
    "kind",
    "profiler_name",
    "gpu_symbol",
    "debug_handle",
    "fused_ops",
    "source_nodes",
    "post_grad_nodes",
    "module_stack",
    "origin",
    "listed_not_computed",
    "compile_id",
    "cache_key",
    "module_paths",
    "module_paths_scope",
]


# Ops that only re-describe memory; a fused kernel's label skips them unless nothing else is left.
# (Ops that copy data, such as cat, clone, _to_copy and contiguous, are work and stay in the label.)
VIEW_OPS = frozenset(
    "aten::" + op
    for op in (
        "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "split", "split_with_sizes",
        "squeeze", "unsqueeze", "as_strided", "slice", "select", "alias", "detach", "unbind",
    )
)


# --- regular expressions (formats: docs/formats.md#inductor-debug-artifacts) ----------------------------------------

# `name = async_compile.<backend>(` at module level: a generated kernel definition.
_KERNEL_DEF_RE = re.compile(r"^(\w+)\s*=\s*async_compile\.(\w+)\(", re.M)
# First positional argument of async_compile.triton(...): the compiled (GPU) function name, "triton_" when
# unique_kernel_names=False (formats.md#inductor-kernel-names).
_TRITON_SYMBOL_RE = re.compile(r"async_compile\.triton\(\s*(?:kernel_name\s*=\s*)?['\"](\w+)['\"]")
_INDUCTOR_META_NAME_RE = re.compile(r"['\"]kernel_name['\"]\s*:\s*['\"](\w+)['\"]")
# cpp kernels with cpp.enable_kernel_profile: RAIIAtenRecordFunctionHandle record_...("graph_0_cpp_...", nullptr)
_RAII_RE = re.compile(r"RAIIAtenRecordFunctionHandle\s+\w+\s*\(\s*\"([^\"]+)\"")
_PARTITION_CALL_RE = re.compile(r"^\s*\(?[\w\s,]*\)?\s*=\s*self\.partitions\[(\d+)\]\(")
# `# Topologically Sorted Source Nodes: [...], Original ATen: [...]`, `# Unsorted Source Nodes: ...` and the
# pre-PR #126698 `# Source Nodes: [...], Original ATen: [...]`.
_SOURCE_NODES_RE = re.compile(
    r"^#\s*(?:(?:Topologically Sorted|Unsorted)\s+)?Source Nodes:\s*\[(.*?)\],\s*Original ATen:\s*\[(.*?)\]\s*$"
)
# `#   mask => convert_element_type` (2.13/Oct-2024 "Source node to ATen node mapping") and the pre-PR #126698
# `# add => add, mul` lines: a source node and the post-grad FX nodes it became.
_NODE_MAPPING_RE = re.compile(r"^#\s*(\w+)\s*=>\s*(\w+(?:\s*,\s*\w+)*)\s*$")
_DEBUG_HANDLE_RE = re.compile(r"^#\s*\[Provenance debug handles\]\s*(\S+):(\d+)\s*$")
_ASSIGN = r"(?:\w+(?:\s*,\s*\w+)*\s*,?\s*=\s*)?"  # optional `bufN = ` / `buf1, buf2 = ` in front of a call
_EXTERN_CALL_RE = re.compile(rf"^{_ASSIGN}(extern_kernels\.(\w+))\(")
_OPS_CALL_RE = re.compile(rf"^{_ASSIGN}(torch\.ops\.(\w+)\.(\w+)\.\w+)\(")
_ATEN_CALL_RE = re.compile(rf"^{_ASSIGN}(aten\.(\w+)(?:\.\w+)?)\(")  # old wrappers: `aten = torch.ops.aten`
_NAME_CALL_RE = re.compile(rf"^{_ASSIGN}(\w+)(?:\.run)?\(")
# ATen op names anywhere in the generated / FX files: `aten.native_layer_norm_backward.default`, `aten.view`.
_ATEN_NAME_RE = re.compile(r"\baten(?:\.|::)([A-Za-z_]\w*)")
# FX graph node line: `name: "f32[2, 16]" = torch.ops.aten.add.Tensor(...)` (type annotation optional).
_FX_NODE_RE = re.compile(r"^\s*(\w+)(?:\s*:\s*\"[^\"]*\")?\s*=\s*torch\.ops\.(\w+)\.(\w+)\.\w+\(", re.M)
# Descriptive kernel names: cpp_fused_<ops>_<n>, triton_<poi|red|per|tem|for|spl|unk>_fused_<ops>_<n> (formats.md#inductor-kernel-names).
_FUSED_NAME_RE = re.compile(r"^(?:cpp|triton_[a-z]+)_fused_(.+?)(?:_\d+)?$")
# Triton 2.x compiled symbols carry a specialisation suffix after the name: `triton__0d1d2d` (generic `triton_`
# + `_0d1d2d`), `..._0_0d1d2de`, `...13d14` (last group without a letter); formats.md#inductor-kernel-names, docs/field-cases.md C20.  At least one
# `<digits><letters>` group is required, so a kernel index such as `_0` is never taken for a suffix.
_TRITON_SIGNATURE_SUFFIX_RE = re.compile(r"_(?:\d+[cde]+)+\d*$")
GENERIC_TRITON_SYMBOL = "triton_"
# FX graph file (fx_graph_readable.py) summary comment above a group of nodes (torch/fx/graph.py
# `_ParsedStackTrace.get_summary_str`): `# File: <file>:<line> in <fn>, code: <code>`; nodes without a stack
# trace follow `# No stacktrace found for following nodes`.
_FX_FILE_COMMENT_RE = re.compile(r"^\s*#\s*File:\s*(.+?)\s*$")
_FX_NO_STACK_RE = re.compile(r"^\s*#\s*No stacktrace found")
_FX_ASSIGN_RE = re.compile(r"^\s+(\w+)(?:\s*:\s*\"[^\"]*\")?\s*=\s*\S")
# A node's line: `name: "type" = <call>(args);  a = b = None` (the `;` part frees names, not arguments).
_FX_CALL_LINE_RE = re.compile(r"^\s+(\w+)(?:\s*:\s*\"[^\"]*\")?\s*=\s*[\w.]+\((.*?)\)(?:;.*)?$")
_IDENTIFIER_RE = re.compile(r"\b[A-Za-z_]\w*\b")


@dataclass(frozen=True)
class _KernelDef:
    kind: str  # "cpp" | "triton" | "extern"
    profiler_name: str
    gpu_symbol: str | None


# --- public API -----------------------------------------------------------------------------------------------------


def find_graph_dirs(root: Path) -> list[Path]:
    """Return every directory at or below ``root`` that contains an ``output_code.py``, sorted by path.

    Such a directory is one compiled FX graph's Inductor debug dir, named
    ``<model>__<aot_id>_<forward|backward|inference>_<nth_graph>.<n>`` (docs/formats.md#inductor-directory-layout;
    :func:`graph_kind`).
    A missing ``root`` yields ``[]``; nothing is raised.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted({p.parent for p in root.rglob(OUTPUT_CODE) if p.is_file()})


def parse_output_code(graph_dir: Path, provenance: Path | Mapping | None = None,
                      module_paths: Mapping | None = None) -> pd.DataFrame:
    """Parse one Inductor debug dir into one row per kernel call site of ``call()``.

    Columns (see :data:`FUSION_MAP_COLUMNS`):

    * ``graph`` (str): the directory name, e.g. ``model__0_forward_1.0``.
    * ``call_index`` (int64): 0-based order of the kernel call in ``call()``.
    * ``kernel`` (str): the name as called: ``cpp_fused_native_layer_norm_0``, ``triton_poi_fused_mul_2``,
      ``extern_kernels.addmm``, ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default``.
    * ``kind`` (str): ``cpp`` | ``triton`` | ``extern`` | ``fallback`` (``torch.ops.<ns>.<op>.<overload>`` or the
      old ``aten.<op>`` form).  Kernels of other ``async_compile`` backends are reported as ``extern``.
    * ``profiler_name`` (str): the name a profiler timeline shows for the call (formats.md#inductor-kernels-in-kineto): cpp -> the
      ``RAIIAtenRecordFunctionHandle`` string of the kernel source (``graph_<id>_<kernel>``; ``graph_0_<kernel>``
      when the kernel was built without ``cpp.enable_kernel_profile``); triton -> ``inductor_meta['kernel_name']``
      (the CPU-side record function), else the kernel name; ``extern_kernels.X`` -> ``aten::X``;
      ``torch.ops.<ns>.X.<overload>`` -> ``<ns>::X``.
    * ``gpu_symbol`` (str or null): triton only: the compiled function name, ``triton_`` for dirs generated with
      ``unique_kernel_names=False``, else the kernel name.
    * ``debug_handle`` (Int64, nullable): ``N`` of the ``# [Provenance debug handles] <kernel>:N`` comment
      above the call (used only when it names the called kernel).
    * ``fused_ops`` (list[str]): sorted unique ``ns::op`` names (``aten::native_layer_norm``).
    * ``source_nodes`` (list[str]): pre-grad (Dynamo) FX node names, e.g. ``layer_norm``.
    * ``post_grad_nodes`` (list[str]): post-grad FX node names (provenance JSON only, else empty).
    * ``module_stack`` (list[str]): the user source lines the call site's nodes were traced from, as the
      ``# File: <file>:<line> in <fn>, code: <code>`` comments of ``fx_graph_readable.py`` (falling back to
      ``fx_graph_transformed.py``) state them, without the ``File: `` prefix, e.g.
      ``/tmp/gen/gen_inductor_cpu.py:39 in forward, code: q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)``;
      unique, in graph order.  Each is the innermost user frame (the ``forward`` line of the module that
      produced the nodes; torch prints only that frame, ``torch/fx/graph.py`` ``_parse_stack_trace``) -- torch
      2.13 debug dirs carry no ``nn_module_stack``, so this is the module information they hold.  The nodes
      looked up are, by precedence: ``post_grad_nodes``; the right-hand sides of the call site's
      ``# <source node> => <post-grad nodes>`` mapping lines (or of the kernel definition's header comment when
      its Source Nodes equal the call site's, formats.md#inductor-output-code); the ``source_nodes`` names themselves (backward graphs
      name their source nodes after post-grad nodes).  Empty when no FX graph file or no node is found.
    * ``module_paths`` (list[str]): the module paths of the call site's FX nodes, sorted and unique, from the
      ``opprof_module_paths.json`` the capture wrote beside ``output_code.py``
      (:mod:`operator_profiler.capture.fx_module_paths`: ``transformer.h.3.ln_1``; ``blocks.0#1`` for a module's
      second call; ``""`` for the compiled frame module's own code, the model's top level). The nodes looked up
      are: ``post_grad_nodes``; else the post-grad nodes that file records for the call's
      ``<kernel>:<debug handle>`` (Inductor's provenance map, which torch writes to a file for forward graphs
      only); else the mapping lines' post-grad nodes; else the post-grad nodes under the Source Nodes names.
      Nodes of ops that only re-describe memory (:data:`VIEW_OPS`: the ``view`` of another module's output the
      kernel reads) are left out unless the call site has no other node. Empty when there is no such file, no node, or one node whose module is
      unknown (then nothing says the kernel's layer). For a debug dir captured outside the workflow the record
      comes from its TORCH_TRACE log (``module_paths``, :func:`trace_module_paths`); there an entry can read
      ``"A|B"``: a node lying, in execution order, between nodes of modules A and B
      (:func:`operator_profiler.attribution.torch_trace.node_entries`).
    * ``module_paths_scope`` (str or null): that file's ``scope``: ``model`` (the compiled frame is the model's
      forward: each path names one module instance, so layer membership can be read from it), ``frame`` (a
      submodule's frame, e.g. regional compilation: paths relative to that module, valid for every instance it
      ran for, never used for membership), null (no file, or the frame was not identified).
    * ``listed_not_computed`` (list[str]): ops the generated kernel's comment / name lists but that an
      extern/fallback call of the same graph computes (rule: :func:`_split_listed_not_computed`); they are not
      in ``fused_ops`` and so never in the operator label.  Empty for extern/fallback rows.
    * ``compile_id``, ``cache_key`` (str or null): the graph's Dynamo compile id (``0/1``) and FX graph cache key
      (the ``<key>`` of ``## Call CompiledFxGraph <key> ##``); null here, filled by :func:`load_fusion_map` from a
      TORCH_TRACE log.
    * ``origin`` (str): what the row's attribution rests on, by precedence:
      ``provenance_json`` -- ``cppCodeToPost["<kernel>:<handle>"]`` (key from the debug-handle comment) gives
      ``post_grad_nodes`` and, through ``postToPre``, ``source_nodes`` (formats.md#inductor-provenance); ``source_nodes_comment`` -- the call
      site's ``[Topologically Sorted |Unsorted ]Source Nodes: [...], Original ATen: [...]`` comment (formats.md#inductor-output-code);
      ``kernel_name`` -- neither: ``fused_ops`` are the ops encoded in the kernel name (formats.md#inductor-kernel-names), split greedily, longest
      match first, on the ATen op names occurring in ``output_code.py`` / ``fx_graph_readable.py`` /
      ``fx_graph_transformed.py``; pieces not in that vocabulary are kept verbatim (no ``ns::`` prefix); for an
      extern/fallback call it is the called op itself.

    ``fused_ops`` are always *original* (pre-decomposition) ATen ops, as in Inductor's ``Original ATen`` comments
    and kernel names (``aten::native_layer_norm``, ``aten::gelu``; never the decomposed ``var_mean``/``erf``):
    from the comment when there is one, else from the kernel name -- except for extern/fallback calls with
    provenance, whose ops are the targets of their post-grad nodes in ``fx_graph_readable.py`` (falling back to
    ``fx_graph_transformed.py``), e.g. just ``aten::addmm`` where the comment also lists the ops of absorbed
    input views (``aten::native_layer_norm, aten::t, aten::view``).  Source nodes not given by the provenance
    JSON are taken from the comment.

    A comment belongs to the next kernel call below it (other lines such as ``stream0 = get_raw_stream(0)`` may
    come in between) and is consumed by it, so a reused kernel gets each call site's own comment (formats.md#inductor-output-code).

    ``provenance``: path to (or the parsed dict of) an ``inductor_provenance_tracking_node_mappings.json``;
    default: that file in ``graph_dir`` when present (torch 2.13 writes it for forward graphs only, formats.md#inductor-provenance).

    ``module_paths``: a record shaped like ``opprof_module_paths.json`` (``scope``, ``post_grad``,
    ``source_nodes``), used when ``graph_dir`` has no such file: :func:`trace_module_paths`, derived from a
    TORCH_TRACE log (:func:`load_fusion_map` passes it for debug dirs captured outside the workflow).

    Raises :class:`InductorArtifactError` when ``output_code.py`` is missing, unreadable, or has no
    ``def call(``, or when the provenance JSON is not valid JSON.
    """
    graph_dir = Path(graph_dir)
    code_path = graph_dir / OUTPUT_CODE
    text = _read_text(code_path, what="Inductor output_code.py")
    body = _call_body(text, code_path)
    kernels = _kernel_defs(text)
    headers = _header_comments(text)
    fx_ops, vocab_text = _fx_node_ops(graph_dir)
    frames, frame_order = _fx_node_frames(graph_dir)
    paths = _module_paths_record(graph_dir)
    if module_paths is not None and not (graph_dir / MODULE_PATHS_JSON).is_file():
        paths = {"scope": module_paths.get("scope"), "post_grad": dict(module_paths.get("post_grad") or {}),
                 "source_nodes": dict(module_paths.get("source_nodes") or {}),
                 "kernel_nodes": dict(module_paths.get("kernel_nodes") or {})}
    constants = _fx_constant_nodes(graph_dir) if paths["post_grad"] else frozenset()
    vocab = _aten_vocabulary(text + "\n" + vocab_text)
    prov = _load_provenance(graph_dir, provenance)
    cpp_to_post = prov.get("cppCodeToPost") or {}
    post_to_pre = prov.get("postToPre") or {}

    rows: list[dict] = []
    comment: tuple[list[str], list[str]] | None = None  # (source nodes, fused ops) waiting for its call
    mapping: list[str] = []  # post-grad nodes of the waiting comment's `a => b, c` lines
    handle: tuple[str, int] | None = None
    for raw in body:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if m := _SOURCE_NODES_RE.match(line):
                comment = (_split_list(m.group(1)), sorted({_op_name(x) for x in _split_list(m.group(2))}))
                mapping = []
            elif m := _DEBUG_HANDLE_RE.match(line):
                handle = (m.group(1), int(m.group(2)))
            elif comment is not None and (m := _NODE_MAPPING_RE.match(line)):
                mapping.extend(_split_list(m.group(2)))
            continue
        call = _match_call(line, kernels)
        if call is None:
            continue
        kernel, kdef = call
        debug_handle = handle[1] if handle is not None and handle[0] == kernel else None
        src_nodes, fused, origin = [], [], "kernel_name"
        if comment is not None:
            src_nodes, fused = comment
            origin = "source_nodes_comment"
        post_nodes = list(cpp_to_post.get(f"{kernel}:{debug_handle}", [])) if debug_handle is not None else []
        if post_nodes:
            origin = "provenance_json"
            src_nodes = _unique(p for n in post_nodes for p in post_to_pre.get(n, [])) or src_nodes
            if kdef.kind in ("extern", "fallback"):  # not decomposed: the nodes' own targets are exact
                fused = sorted({fx_ops[n] for n in post_nodes if n in fx_ops}) or fused
            elif comment is None:
                fused = []
        if not fused:
            fused = _ops_from_name(kernel, kdef, vocab)
        header = headers.get(kernel)
        if not mapping and header is not None and comment is not None and header[0] == comment[0]:
            mapping = header[1]
        lookup = post_nodes or mapping or list(src_nodes)
        if not fused and kdef.kind not in ("extern", "fallback"):
            # Neither the comment nor the name lists an op (`cpp_fused_0`: nodes without `original_aten`):
            # the targets of the call site's FX nodes, post-grad ops (decomposed), are the ops known.
            fused = sorted({fx_ops[n] for n in lookup if n in fx_ops})
            if fused:
                origin = "fx_nodes"
        module_stack = sorted({frames[n] for n in lookup if frames.get(n)}, key=frame_order.__getitem__)
        recorded = paths["kernel_nodes"].get(f"{kernel}:{debug_handle}") if debug_handle is not None else None
        module_paths = _call_site_module_paths(post_nodes or recorded or mapping or [
            p for n in src_nodes for p in (paths["source_nodes"].get(n) or [f"?{n}"])], paths["post_grad"], fx_ops,
            constants)
        rows.append(
            {
                "graph": graph_dir.name,
                "call_index": len(rows),
                "kernel": kernel,
                "kind": kdef.kind,
                "profiler_name": kdef.profiler_name,
                "gpu_symbol": kdef.gpu_symbol,
                "debug_handle": debug_handle,
                "fused_ops": fused,
                "source_nodes": list(src_nodes),
                "post_grad_nodes": post_nodes,
                "module_stack": module_stack,
                "origin": origin,
                "listed_not_computed": [],
                "compile_id": None,
                "cache_key": None,
                "module_paths": module_paths,
                "module_paths_scope": paths["scope"],
            }
        )
        comment = handle = None
        mapping = []
    if not rows:
        return _empty_fusion_map()
    _split_listed_not_computed(rows)
    return pd.DataFrame(rows, columns=FUSION_MAP_COLUMNS).astype({"call_index": "int64", "debug_handle": "Int64"})


def _split_listed_not_computed(rows: list[dict]) -> None:
    """Move the ops a generated kernel lists but that an extern/fallback call of the same graph runs to
    ``listed_not_computed`` (in place).

    Inductor's ``Original ATen`` comment and descriptive kernel name list the original ATen op of every FX node
    whose origins the kernel carries, including nodes whose real work is done by a separate library call: the
    layout copy ``cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_transpose_view_2`` feeding the
    fallback ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward``, or a Triton kernel listing
    ``aten.mm`` beside ``extern_kernels.mm``.  Rule: op ``O`` of a ``triton``/``cpp`` call site moves when some
    ``extern``/``fallback`` call site of the same graph runs ``O`` itself (its ``profiler_name``, e.g.
    ``extern_kernels.mm`` -> ``aten::mm``) and the two sites share a source node, or either has none (no comment:
    nothing tells the two instances of ``O`` apart).  A kernel whose source nodes are disjoint from every such
    call's keeps ``O``: it computes its own instance (the bias add of an unfused ``addmm`` of another layer).
    """
    externs = [(r["profiler_name"], set(r["source_nodes"])) for r in rows
               if r["kind"] in ("extern", "fallback") and "::" in r["profiler_name"]]
    if not externs:
        return
    for r in rows:
        if r["kind"] not in ("triton", "cpp"):
            continue
        own = set(r["source_nodes"])
        moved = [op for op in r["fused_ops"]
                 if any(op == ext_op and (not own or not ext_nodes or own & ext_nodes) for ext_op, ext_nodes in externs)]
        if moved:
            r["fused_ops"] = [op for op in r["fused_ops"] if op not in moved]
            r["listed_not_computed"] = moved


def load_fusion_map(root: Path) -> pd.DataFrame:
    """Concatenate :func:`parse_output_code` over :func:`find_graph_dirs` ``(root)``.

    Same columns as :func:`parse_output_code`; rows ordered by graph directory path, then ``call_index``;
    ``compile_id``/``cache_key`` filled from a TORCH_TRACE log under ``root`` when there is one
    (:func:`torch_trace_graph_ids`).  Returns an empty DataFrame with those columns when no debug dir is found.
    Raises
    :class:`InductorArtifactError` for a malformed ``output_code.py`` (docs/formats.md#inductor-output-code).
    """
    from .torch_trace import infer_layers, read_frames

    dirs = find_graph_dirs(root)
    ids = torch_trace_graph_ids(root, dirs)
    # debug dirs captured outside the workflow have no opprof_module_paths.json: their forward graphs' module
    # paths come from the TORCH_TRACE log, where there is one (TORCH_COMPILE_DEBUG=1 writes it)
    without = [d for d in dirs if not (d / MODULE_PATHS_JSON).is_file()]
    compiled = read_frames(root) if without and ids else {}
    parsed = []
    for d in dirs:
        derived = None
        frame = compiled.get(ids.get(d.name, (None, None))[0]) if d in without else None
        if frame is not None and graph_kind(d.name) in ("forward", "inference"):
            derived = trace_module_paths(frame, _load_provenance(d, None))
        parsed.append(parse_output_code(d, module_paths=derived))
    parsed = [f for f in parsed if not f.empty]
    if not parsed:
        return _empty_fusion_map()
    fusion = pd.concat(parsed, ignore_index=True)
    if ids:
        fusion["compile_id"] = fusion["graph"].map(lambda g: ids.get(g, (None, None))[0])
        fusion["cache_key"] = fusion["graph"].map(lambda g: ids.get(g, (None, None))[1])
    fusion.attrs["layers"] = infer_layers(compiled.values())
    return fusion


def trace_module_paths(frame, provenance: Mapping) -> dict:
    """The module-path record of a forward (or inference) graph dir captured outside the workflow, from its
    compiled frame as a TORCH_TRACE log states it (:class:`operator_profiler.attribution.torch_trace.Frame`) and
    the dir's provenance JSON: each post-grad node takes the entry (:func:`.torch_trace.node_entries`) of the
    pre-grad nodes it was made from (``postToPre``; None when they differ), each pre-grad node name of a Source
    Nodes comment its post-grad nodes (``preToPost``) or, without provenance, its own entry. Shaped like
    ``opprof_module_paths.json`` (``scope``, ``post_grad``, ``source_nodes``, ``kernel_nodes``) for
    :func:`parse_output_code`. A backward graph's Source Nodes name backward nodes, which no pre-grad node
    is: never pass its dir this record."""
    from .torch_trace import node_entries

    entries = node_entries(frame)
    post: dict[str, str | None] = {}
    for node, pres in (provenance.get("postToPre") or {}).items():
        found = {entries.get(str(p)) for p in pres} if isinstance(pres, list) and pres else {None}
        post[str(node)] = next(iter(found)) if len(found) == 1 else None
    source_nodes: dict[str, list[str]] = {str(pre): [str(n) for n in nodes]
                                          for pre, nodes in (provenance.get("preToPost") or {}).items()
                                          if isinstance(nodes, list)}
    for pre, entry in entries.items():
        key = f"<pre-grad>{pre}"
        post[key] = entry
        source_nodes.setdefault(pre, [key])
    return {"scope": frame.scope, "post_grad": post, "source_nodes": source_nodes, "kernel_nodes": {}}


TORCH_TRACE_GLOB = "dedicated_log_torch_trace_*.log"
# A TORCH_TRACE record: glog prefix, then the metadata JSON on one line; its payload follows on lines starting
# with a tab (torch/_logging/_internal.py TorchLogsFormatter).
_TRACE_RECORD_RE = re.compile(r"^[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] (\{.*\})\s*$")
_GRAPH_DIR_RE = re.compile(r"^(?P<model>.*)__(?P<aot_id>\d+)_(?P<kind>forward|backward|inference)_(?P<nth>\d+)\.(?P<n>\d+)$")


def graph_kind(graph: str) -> str | None:
    """``forward`` | ``backward`` | ``inference`` from a debug dir name
    ``<model>__<aot_id>_<forward|backward|inference>_<nth_graph>.<n>`` (torch 2.13
    ``_functorch/_aot_autograd/logging_utils.get_aot_graph_name`` plus ``DebugContext``'s counter); ``None`` for
    other names.  The first number is AOTAutograd's process-wide compilation counter, *not* the Dynamo compile id
    (``Torch-Compiled Region: <frame>/<n>``): only a TORCH_TRACE log links the two (:func:`torch_trace_graph_ids`).
    """
    m = _GRAPH_DIR_RE.match(str(graph))
    return m.group("kind") if m else None


def torch_trace_graph_ids(root: Path, graph_dirs: Sequence[Path]) -> dict[str, tuple[str | None, str | None]]:
    """Graph dir name -> (Dynamo compile id, FX graph cache key), from the TORCH_TRACE logs under ``root``.

    ``TORCH_COMPILE_DEBUG=1`` (or ``TORCH_TRACE=<dir>``) writes ``dedicated_log_torch_trace_*.log`` (in
    ``torch_compile_debug/tlparse/``).  Two of its records are used (torch 2.13): the ``inductor_output_code``
    artifact, whose metadata carries ``frame_id``/``frame_compile_id`` (and ``compiled_autograd_id``) and
    ``has_payload`` = the MD5 of the payload, which is the text of the graph's ``output_code.py`` -- so a debug
    dir is found by the MD5 of its ``output_code.py``; and the ``inductor_compile`` chromium event (``ph: E``)
    whose args hold ``compile_id``, ``is_backward`` and ``key``, the key the profiler prints in
    ``## Call CompiledFxGraph <key> ##``.  The key of a graph is that of its compile id and direction
    (``backward`` dirs: ``is_backward`` true), when exactly one such event exists.

    Returns ``{}`` without a log; graphs the logs do not mention, or whose code several compiles produced
    (the MD5 then names several compile ids; torch's first line ``# AOT ID: ['<aot_id>_<kind>']`` normally
    keeps them apart), are left out.  Unreadable or malformed
    records are skipped (the log is optional evidence; without it graphs are told apart by their kernels).
    """
    import hashlib

    by_md5: dict[str, set[str]] = {}
    keys: dict[tuple[str, bool], set[str]] = {}
    for log in sorted(Path(root).rglob(TORCH_TRACE_GLOB)) if Path(root).is_dir() else []:
        try:
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines):
            m = _TRACE_RECORD_RE.match(line)
            if m is None:
                continue
            try:
                meta = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if "inductor_output_code" in meta and meta.get("has_payload") and "frame_id" in meta:
                cid = f"{meta['frame_id']}/{meta.get('frame_compile_id')}"
                if meta.get("compiled_autograd_id") is not None:
                    cid = f"!{meta['compiled_autograd_id']}/{cid}"
                by_md5.setdefault(str(meta["has_payload"]), set()).add(cid)
            elif "chromium_event" in meta and meta.get("has_payload"):
                payload = []
                for nxt in lines[i + 1:]:
                    if not nxt.startswith("\t"):
                        break
                    payload.append(nxt[1:])
                try:
                    event = json.loads("\n".join(payload))
                except json.JSONDecodeError:
                    continue
                if not isinstance(event, dict):
                    continue
                args = event.get("args") if isinstance(event.get("args"), dict) else {}
                if event.get("name") == "inductor_compile" and event.get("ph") == "E" and args.get("key") \
                        and args.get("compile_id") is not None and args.get("is_backward") is not None:
                    keys.setdefault((str(args["compile_id"]), bool(args["is_backward"])), set()).add(str(args["key"]))
    if not by_md5:
        return {}
    out: dict[str, tuple[str | None, str | None]] = {}
    for d in graph_dirs:
        try:
            digest = hashlib.md5((Path(d) / OUTPUT_CODE).read_bytes(), usedforsecurity=False).hexdigest()
        except OSError:
            continue
        cids = by_md5.get(digest, set())
        if len(cids) != 1:  # not in the log, or the same code from several compiles: unknown
            continue
        cid = next(iter(cids))
        found = keys.get((cid, graph_kind(Path(d).name) == "backward"), set())
        out[Path(d).name] = (cid, next(iter(found)) if len(found) == 1 else None)
    return out


def match_region(profiler_names: Sequence[str], fusion_map: pd.DataFrame) -> tuple[str, list[int]] | None:
    """Find the compiled graph whose kernel sequence equals the kernels seen inside one timeline region.

    ``profiler_names``: in order, the names of the kernels shown inside one ``## Call CompiledFxGraph <key> ##``
    region (cpu_ops ``graph_0_cpp_fused_*``, ``aten::addmm``, Triton record functions ...; formats.md#inductor-kernels-in-kineto).  A name matches
    call site i when it equals that row's ``profiler_name`` or its ``gpu_symbol`` (generic GPU names such as
    ``triton_``, also with the Triton 2.0 specialisation suffix ``triton__0d1d2d``; formats.md#inductor-kernel-names).
    Names are compared after :func:`normalize_kernel_name` (a Triton 2.x signature suffix such as
    ``_0d1d2de`` is dropped, docs/field-cases.md C20).

    Several graphs (forward and backward, one per recompilation; each numbers its kernels from 0 again, so the
    same kernel name can occur in several graphs) may match one region.  The graph with the most *descriptive*
    matches (name equal to ``profiler_name``, not only to a generic ``gpu_symbol``) wins; among equally good
    graphs the first in sorted graph order is returned when they all have the same call sites
    (``kernel``, ``fused_ops``, ``source_nodes``, ``module_stack``, ``listed_not_computed`` per position: a
    recompilation of the same code), and ``None`` when they differ (e.g. ``["triton_", "triton_"]`` fits two
    different two-kernel graphs: guessing would attribute wrong ops; :func:`fitting_graphs` lists them).

    Returns ``(graph, [call_index, ...])`` (one index per name), or ``None`` when no graph -- or more than one
    different graph -- matches.
    """
    best = fitting_graphs(profiler_names, fusion_map)
    if not best or graphs_differ(fusion_map, best):
        return None
    rows = fusion_map[fusion_map["graph"] == best[0]].sort_values("call_index")
    return best[0], [int(i) for i in rows["call_index"]]


def fitting_graphs(profiler_names: Sequence[str], fusion_map: pd.DataFrame, graphs=None,
                   generated_only: bool = False) -> list[str]:
    """The graphs whose call sites fit ``profiler_names`` position by position (the rules of
    :func:`match_region`), keeping only those with the most descriptive matches; sorted by graph name.

    ``graphs``: restrict the search to these graph names (None: all).  ``generated_only``: compare the names with
    the graph's generated (``triton``/``cpp``) call sites only, in call order -- for a CUDA-graph replay or a
    wrapper range, where an extern call shows no name of its own (its cuBLAS/cuDNN kernels are library names).
    """
    names = list(profiler_names)
    if fusion_map is None or fusion_map.empty:
        return []
    frame = fusion_map if graphs is None else fusion_map[fusion_map["graph"].isin(list(graphs))]
    if generated_only:
        frame = frame[frame["kind"].isin(["triton", "cpp"])]
    best: list[str] = []
    best_score = -1
    for graph, rows in sorted(frame.groupby("graph", sort=False), key=lambda kv: str(kv[0])):
        if len(rows) != len(names):
            continue
        rows = rows.sort_values("call_index")
        ok = all(
            _name_matches(n, prof, sym) or (generated_only and normalize_kernel_name(n) == kernel)
            for n, prof, sym, kernel in zip(names, rows["profiler_name"], rows["gpu_symbol"], rows["kernel"],
                                            strict=True)
        )
        if not ok:
            continue
        score = sum(normalize_kernel_name(n) in (prof, kernel)
                    for n, prof, kernel in zip(names, rows["profiler_name"], rows["kernel"]))
        if score > best_score:
            best, best_score = [str(graph)], score
        elif score == best_score:
            best.append(str(graph))
    return best


def graphs_differ(fusion_map: pd.DataFrame, graphs: Sequence[str], ops_only: bool = False) -> bool:
    """Whether the call sites of ``graphs`` differ (kernel, ops, source nodes, module stack, listed-not-computed
    ops, position by position); identical graphs are recompilations of the same code: any of them is the answer.
    ``ops_only``: compare only what the operator label depends on (kernel, ``fused_ops``,
    ``listed_not_computed``): graphs equal in that sense differ in FX nodes only."""
    content = (lambda r: (r["kernel"], *_ops_content(r))) if ops_only else _content
    signatures = {tuple(content(r) for r in fusion_map[fusion_map["graph"] == g].sort_values("call_index")
                        .to_dict("records")) for g in graphs}
    return len(signatures) > 1


def normalize_kernel_name(name: str) -> str:
    """A profiler kernel name as ``output_code.py`` spells it: a Triton 2.x specialisation suffix is removed.

    ``triton_poi_fused_add_cos_0_0d1d2de`` -> ``triton_poi_fused_add_cos_0``; ``triton__0d1d2d`` and
    ``triton__0d1d2d3d4d5d6d7d8d9d10d11d12d13d14`` -> ``triton_`` (the generic symbol); the suffix is ``_``
    followed by one or more ``<digits><c|d|e...>`` groups and optionally bare digits, so a kernel index
    (``triton_poi_fused_add_cos_0``) is never stripped.  Only names starting with ``triton`` are changed.
    Source: docs/formats.md#inductor-kernel-names; docs/field-cases.md C20 (triton-lang/triton#1386, pytorch/pytorch#120478).
    """
    if not name.startswith("triton"):
        return name
    return _TRITON_SIGNATURE_SUFFIX_RE.sub("", name)


def is_generic_triton_name(name: str) -> bool:
    """Whether a device kernel name is the generic ``triton_`` of ``unique_kernel_names=False`` (torch <= 2.5),
    also with a Triton 2.x signature suffix (``triton__0d1d2d``), which names no particular kernel (formats.md#inductor-kernel-names)."""
    return normalize_kernel_name(name) == GENERIC_TRITON_SYMBOL


ATTRIBUTE_BY_NAME_COLUMNS = [
    "kernel_id",
    "graph",
    "call_index",
    "kernel",
    "fused_ops",
    "source_nodes",
    "module_stack",
    "match",
    "reason",
    "listed_not_computed",
    "source_nodes_ambiguous",
    "candidates",
    "module_paths",
    "module_paths_scope",
]

BY_NAME_REASONS = {
    "no_fusion_map": "the fusion map is empty",
    "ambiguous_generic_kernel_name": "the device name is the generic `triton_` (torch <= 2.5, "
    "unique_kernel_names=False; also `triton__0d1d2d`-style) and no CPU-side event names the kernel",
    "kernel_name_in_several_call_sites": "the name belongs to call sites with different operators (fused ops) "
    "and the launch order does not decide between them (several graphs, a launch count per iteration that is "
    "not a multiple of the call-site count, or a window that may start mid-iteration); `candidates` lists them",
    "not_in_fusion_map": "an Inductor-generated name (triton_*/cpp_*) that no call site of the fusion map has",
    "extern_kernel_name_unknown": "not an Inductor-generated name: library kernels of extern calls "
    "(cuBLAS/cuDNN for extern_kernels.mm/addmm/convolution) and eager kernels; left to the other paths",
}

_INDUCTOR_NAME_RE = re.compile(r"^(?:triton_|(?:graph_\d+_)?cpp_)")


def attribute_by_name(kernels: pd.DataFrame, fusion_map: pd.DataFrame) -> pd.DataFrame:
    """Join kernels to fusion-map call sites by name, without a compiled-graph region (nsys timelines).

    An nsys capture has no ``## Call CompiledFxGraph`` ranges (unless emit_nvtx was on), so
    :func:`match_region` cannot be used; the device kernel name alone must find its call site.

    ``kernels``: at least ``kernel_id, name, pid, iteration, start_ns`` (timeline KERNELS table,
    ``operator_profiler.tables``); ``match_key`` is used instead of ``name`` when present (the mangled name,
    identical for unmangled Triton symbols), ``launch_start_ns`` (launch order) before ``start_ns`` when present.
    ``fusion_map``: :func:`load_fusion_map` output.

    A name (after :func:`normalize_kernel_name`, which drops a Triton 2.x ``_0d1d2de`` suffix, docs/field-cases.md C20)
    matches a generated call site (kind ``triton``/``cpp``) whose ``kernel``, ``profiler_name`` or non-generic
    ``gpu_symbol`` equals it.  Extern/fallback call sites are never matched by name: the cuBLAS/cuDNN kernel
    an ``extern_kernels.mm`` launches has a library name (docs/formats.md#inductor-output-code), so those kernels are
    left to the correlation/NVTX paths.  When a name has several call sites (a reused kernel), the launch
    order decides only where it is known to start at the beginning of a ``call()`` (formats.md#inductor-output-code):

    * in a measured ``iteration`` (a complete iteration of our harness), the j-th launch of the name is call
      site ``j mod n`` of its ``n`` call sites when the count is a multiple of ``n``;
    * elsewhere (no iteration ranges, or kernels outside them: the capture window may start mid-iteration),
      the launches of the graph's generated kernels in the process are aligned with the graph's call order:
      only when exactly one starting offset fits the whole sequence does it place the launches.  A graph whose
      other kernels fix no offset (e.g. its only generated kernel is the reused one) is not placed.

    Both need every graph holding the name to have the same sequence of its call sites (one graph, or
    recompilations of the same code); the alignment also needs the graph's names to belong to it alone.  Where
    the order cannot decide: the call sites' common answer when they agree on the operator (``fused_ops``,
    ``listed_not_computed``): ``match = same_operator``, ``source_nodes``/``module_stack`` empty unless equal
    at every candidate, ``source_nodes_ambiguous`` true, ``candidates`` the ``graph:call_index`` list; otherwise
    unattributed (``kernel_name_in_several_call_sites``, same ``candidates``).  Never one site picked silently.

    Returns one row per kernel, columns :data:`ATTRIBUTE_BY_NAME_COLUMNS`:

    * ``kernel_id`` (int64); ``graph`` (str, null when unattributed or when identical call sites of several
      graphs fit); ``call_index`` (Int64, same nulls, and null when the call site is undecided); ``kernel``
      (str, the output_code name, null when unattributed); ``fused_ops``, ``source_nodes``, ``module_stack``,
      ``listed_not_computed`` (list[str], empty when unattributed);
    * ``match`` (str or null): ``unique_call_site`` (the name has one call site), ``call_site_order`` (chosen by
      launch position), ``identical_call_sites`` (several call sites, all with the same ops, source nodes and
      module stack, so the answer does not depend on which), ``same_operator`` (see above);
    * ``reason`` (str or null): for unattributed kernels, one of :data:`BY_NAME_REASONS`;
    * ``source_nodes_ambiguous`` (bool); ``candidates`` (list[str]: ``graph:call_index`` of the call sites that
      could not be told apart; empty otherwise);
    * ``module_paths`` (list[str]), ``module_paths_scope`` (str or null): the call site's (see
      :func:`parse_output_code`); empty / null when unattributed, and ``module_paths`` empty where the candidate
      sites' differ.

    Rows with the same answer share their list objects: copy before mutating one.  Cost: vectorised grouping
    plus one alignment per (process, window, graph) that needs it -- about 1-2 s per million kernels.

    Raises ``KeyError`` when a required column is missing.
    """
    if kernels.empty:
        return _by_name_frame(pd.DataFrame({"kernel_id": pd.Series(dtype="int64")}), [])
    key_col = "match_key" if "match_key" in kernels else "name"
    order = kernels["launch_start_ns"].fillna(kernels["start_ns"]) if "launch_start_ns" in kernels else kernels["start_ns"]
    raw = kernels[key_col].fillna(kernels["name"]).astype(str)
    frame = pd.DataFrame({
        "kernel_id": kernels["kernel_id"].astype("int64").to_numpy(),
        "key": raw.map({n: normalize_kernel_name(n) for n in raw.unique()}).to_numpy(),
        "pid": kernels["pid"].to_numpy(),
        "iteration": pd.array(kernels["iteration"], dtype="Int64").fillna(-1).to_numpy(dtype="int64"),
        "order": pd.array(order, dtype="Int64").fillna(0).to_numpy(dtype="int64"),
    }).sort_values(["pid", "order", "kernel_id"], kind="stable").reset_index(drop=True)
    groups = frame.groupby(["pid", "iteration", "key"], sort=False)
    position = groups.cumcount().to_numpy(dtype="int64")
    count = groups["key"].transform("size").to_numpy(dtype="int64")
    iteration = frame["iteration"].to_numpy()

    index = _name_index(fusion_map)
    empty_map = fusion_map is None or fusion_map.empty
    phases = _Phases(frame, fusion_map, index)
    answers: list[dict] = []
    memo: dict = {}

    def answer(tag, value: dict) -> int:
        """Index of the answer ``tag`` (one list entry per distinct answer: rows share it)."""
        if tag not in memo:
            memo[tag] = len(answers)
            answers.append(value)
        return memo[tag]

    codes = np.full(len(frame), -1, dtype=np.int64)
    key_codes, key_names = pd.factorize(frame["key"].to_numpy())
    for kc, rows in pd.Series(np.arange(len(frame))).groupby(key_codes).indices.items():
        key = key_names[kc]
        sites = index.get(key)
        if empty_map:
            codes[rows] = answer("no_fusion_map", {"reason": "no_fusion_map"})
            continue
        if sites is None:
            why = ("ambiguous_generic_kernel_name" if key == GENERIC_TRITON_SYMBOL else
                   "not_in_fusion_map" if _INDUCTOR_NAME_RE.match(key) else "extern_kernel_name_unknown")
            codes[rows] = answer(why, {"reason": why})
            continue
        plan = _plan_sites(sites)
        if plan[0] == "fixed":
            codes[rows] = answer((key, "fixed"), plan[1])
            continue
        _, graph, site_rows, undecided = plan
        n = len(site_rows)
        complete = (iteration[rows] >= 0) & (count[rows] % n == 0)
        slot = position[rows] % n
        for p in range(n):
            chosen = rows[complete & (slot == p)]
            if chosen.size:
                codes[chosen] = answer((key, p), _site_row(site_rows[p], "call_site_order", graph is not None))
        rest = rows[~complete]
        if not rest.size:
            continue
        placed = phases.call_index(rest, graph) if graph is not None else np.full(rest.size, -1)
        by_index = {int(r["call_index"]): i for i, r in enumerate(site_rows)}
        for call_index in np.unique(placed[placed >= 0]):
            p = by_index.get(int(call_index))
            if p is not None:
                codes[rest[placed == call_index]] = answer((key, p), _site_row(site_rows[p], "call_site_order", True))
            else:  # the alignment put a launch of this name on another kernel's call site: do not trust it
                placed[placed == call_index] = -1
        left = rest[placed < 0]
        if left.size:
            codes[left] = answer((key, "undecided"), undecided)
    frame["answer"] = codes
    return _by_name_frame(frame[["kernel_id", "answer"]], answers)


def _name_index(fusion_map: pd.DataFrame | None) -> dict[str, dict[str, list[dict]]]:
    """name -> graph -> that graph's generated call sites answering to the name, in call order."""
    index: dict[str, dict[str, list[dict]]] = {}
    if fusion_map is None or fusion_map.empty:
        return index
    rows = fusion_map[fusion_map["kind"].isin(["triton", "cpp"])].sort_values(["graph", "call_index"])
    for r in rows.to_dict("records"):
        for n in _visible_names(r, with_generic_rows=True):
            index.setdefault(n, {}).setdefault(str(r["graph"]), []).append(r)
    return index


def _list(r: Mapping, column: str) -> tuple:
    """A list cell of a fusion-map row as a tuple; empty when the column is absent (maps written before it)."""
    value = r.get(column)
    return tuple(value) if isinstance(value, (list, tuple, np.ndarray)) else ()


def _content(r: Mapping) -> tuple:
    """What an answer taken from call site ``r`` says: kernel, ops, source nodes, module stack, ops not computed."""
    return (r["kernel"], _list(r, "fused_ops"), _list(r, "source_nodes"), _list(r, "module_stack"),
            _list(r, "listed_not_computed"), _list(r, "module_paths"))


def _ops_content(r: Mapping) -> tuple:
    """The operator part of an answer: the label depends on these only."""
    return (_list(r, "fused_ops"), _list(r, "listed_not_computed"))


def _visible_names(r: Mapping, with_generic_rows: bool = False) -> set[str]:
    """The names a timeline can show for generated call site ``r``: kernel, profiler name, non-generic GPU symbol.

    A Triton site compiled under the generic symbol ``triton_`` shows only that on the device; with
    ``with_generic_rows`` False such a site has no visible name (it cannot be told from other generic kernels).
    """
    sym = r.get("gpu_symbol")
    generic = isinstance(sym, str) and is_generic_triton_name(sym)
    if generic and not with_generic_rows:
        return set()
    names = {r["kernel"], r["profiler_name"]}
    if isinstance(sym, str) and not generic:
        names.add(sym)
    return {n for n in names if isinstance(n, str) and n}


def _plan_sites(sites: Mapping[str, list[dict]]) -> tuple:
    """How the launches of one name are answered.

    ``("fixed", answer)``: the same answer for every launch (one call site; identical call sites; or several
    graphs whose sequences differ, which no launch position can decide).  ``("positional", graph, site_rows,
    undecided)``: launch position picks ``site_rows[i]``; ``graph`` is None when several identical graphs hold
    them (no place is reported); ``undecided`` is the answer where the position cannot decide.
    """
    graphs = sorted(sites)
    all_rows = [r for g in graphs for r in sites[g]]
    sequences = {tuple(_content(r) for r in sites[g]) for g in graphs}
    one_graph = len(graphs) == 1
    if len(sequences) > 1:
        return "fixed", _undecided(all_rows, graphs)
    rows = sites[graphs[0]]
    if len(rows) == 1:
        return "fixed", _site_row(rows[0], "unique_call_site" if one_graph else "identical_call_sites", one_graph)
    if len({_content(r) for r in rows}) == 1 and not one_graph:
        return "fixed", _site_row(rows[0], "identical_call_sites", False)
    return "positional", graphs[0] if one_graph else None, rows, _undecided(all_rows, graphs)


def _undecided(rows: list[dict], graphs: list[str]) -> dict:
    """The answer for a launch whose call site is one of ``rows`` (see :func:`attribute_by_name`)."""
    candidates = [f"{r['graph']}:{int(r['call_index'])}" for r in rows]
    if len({_content(r) for r in rows}) == 1:
        return _site_row(rows[0], "identical_call_sites", False)
    if len({_ops_content(r) for r in rows}) > 1:
        return {"reason": "kernel_name_in_several_call_sites", "candidates": candidates}
    first = rows[0]
    same_nodes = len({(_list(r, "source_nodes"), _list(r, "module_stack"), _list(r, "module_paths"))
                      for r in rows}) == 1
    return {
        "graph": graphs[0] if len(graphs) == 1 else None,
        "kernel": first["kernel"] if len({r["kernel"] for r in rows}) == 1 else None,
        "fused_ops": list(_list(first, "fused_ops")),
        "listed_not_computed": list(_list(first, "listed_not_computed")),
        "source_nodes": list(_list(first, "source_nodes")) if same_nodes else [],
        "module_stack": list(_list(first, "module_stack")) if same_nodes else [],
        "module_paths": list(_list(first, "module_paths")) if same_nodes else [],
        "source_nodes_ambiguous": not same_nodes,
        "candidates": candidates,
        "match": "same_operator",
    }


class _Phases:
    """Place launches on call sites by aligning a window's launch order with a graph's call order.

    For one process and iteration group (``iteration`` -1: outside any measured iteration) and one graph G,
    the launches whose names belong to G's generated call sites, in launch order, must read as consecutive
    call sites of G's ``call()`` repeated: ``S[j]`` is call site ``C[(o + j) mod m]`` for one offset ``o``.
    Only an offset that is the single one fitting the whole sequence places them.  Skipped (nothing placed)
    when any of G's names also belongs to another graph (their launches would mix into the sequence).
    """

    def __init__(self, frame: pd.DataFrame, fusion_map: pd.DataFrame | None, index: Mapping):
        self.frame = frame
        self.keys = frame["key"].to_numpy()
        self.index = index
        self.fusion_map = fusion_map
        self._groups: tuple[np.ndarray, dict] | None = None  # built on first use: most timelines never need it
        self.cycles: dict[str, tuple[list[set[str]], list[int]] | None] = {}
        self.placed: dict[str, np.ndarray] = {}  # graph -> call index per frame row (-1: not placed)
        self.aligned: set[tuple[int, str]] = set()

    @property
    def group_of(self) -> np.ndarray:
        return self._grouping()[0]

    @property
    def rows_of_group(self) -> dict:
        return self._grouping()[1]

    def _grouping(self) -> tuple[np.ndarray, dict]:
        if self._groups is None:
            pid = pd.array(self.frame["pid"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
            # iteration is >= -1 (null -> -1) and below 2**31; pids below 2**31 (Linux: 2**22)
            codes = pd.factorize(pid * (1 << 32) + self.frame["iteration"].to_numpy(dtype=np.int64) + 1)[0]
            self._groups = codes, pd.Series(np.arange(len(codes))).groupby(codes).indices
        return self._groups

    def _cycle(self, graph: str) -> tuple[list[set[str]], list[int]] | None:
        if graph not in self.cycles:
            rows = self.fusion_map[(self.fusion_map["graph"] == graph)
                                   & self.fusion_map["kind"].isin(["triton", "cpp"])].sort_values("call_index")
            names, call_indexes = [], []
            for r in rows.to_dict("records"):
                visible = _visible_names(r)
                if visible:
                    names.append(visible)
                    call_indexes.append(int(r["call_index"]))
            exclusive = all(set(self.index.get(n, {})) == {graph} for vis in names for n in vis)
            self.cycles[graph] = (names, call_indexes) if names and exclusive else None
        return self.cycles[graph]

    def call_index(self, rows: np.ndarray, graph: str) -> np.ndarray:
        """Call index for each frame row (-1 where the alignment does not place it)."""
        cycle = self._cycle(graph)
        if cycle is None:
            return np.full(len(rows), -1, dtype=np.int64)
        placed = self.placed.get(graph)
        if placed is None:
            placed = self.placed[graph] = np.full(len(self.keys), -1, dtype=np.int64)
        for group in np.unique(self.group_of[rows]):
            if (int(group), graph) not in self.aligned:
                self.aligned.add((int(group), graph))
                self._align(int(group), cycle, placed)
        return placed[rows]

    def _align(self, group: int, cycle: tuple[list[set[str]], list[int]], placed: np.ndarray) -> None:
        names, call_indexes = cycle
        m = len(names)
        known = set().union(*names)
        rows = self.rows_of_group[group]
        rows = rows[np.isin(self.keys[rows], list(known))]
        if not rows.size:
            return
        keys, key_idx = np.unique(self.keys[rows], return_inverse=True)
        fits = np.array([[k in vis for vis in names] for k in keys], dtype=bool)  # key x call position
        steps = np.arange(rows.size)
        offsets = [o for o in np.flatnonzero(fits[key_idx[0]]) if fits[key_idx, (o + steps) % m].all()]
        if len(offsets) == 1:
            placed[rows] = np.asarray(call_indexes, dtype=np.int64)[(offsets[0] + steps) % m]


def _site_row(r: Mapping, match: str, with_place: bool) -> dict:
    return {
        "graph": str(r["graph"]) if with_place else None,
        "call_index": int(r["call_index"]) if with_place else None,
        "kernel": r["kernel"],
        "fused_ops": list(_list(r, "fused_ops")),
        "source_nodes": list(_list(r, "source_nodes")),
        "module_stack": list(_list(r, "module_stack")),
        "listed_not_computed": list(_list(r, "listed_not_computed")),
        "module_paths": list(_list(r, "module_paths")),
        "module_paths_scope": r.get("module_paths_scope"),
        "match": match,
    }


def _by_name_frame(frame: pd.DataFrame, answers: list[dict]) -> pd.DataFrame:
    """``frame``: kernel_id, answer (index into ``answers``) -> the ATTRIBUTE_BY_NAME_COLUMNS table, by kernel_id."""
    frame = frame.sort_values("kernel_id", kind="stable").reset_index(drop=True)
    codes = frame["answer"].to_numpy(dtype=np.int64) if "answer" in frame else np.zeros(0, dtype=np.int64)
    full = [{"graph": None, "call_index": None, "kernel": None, "fused_ops": [], "source_nodes": [],
             "module_stack": [], "match": None, "reason": None, "listed_not_computed": [],
             "source_nodes_ambiguous": False, "candidates": [], "module_paths": [], "module_paths_scope": None,
             **a} for a in answers]
    out = pd.DataFrame({"kernel_id": frame["kernel_id"].astype("int64")})
    for col in ATTRIBUTE_BY_NAME_COLUMNS[1:]:
        values = np.empty(len(full), dtype=object)
        for i, a in enumerate(full):
            values[i] = a[col]
        if col == "call_index":
            out[col] = pd.array(values[codes], dtype="Int64")
        elif col == "source_nodes_ambiguous":
            out[col] = values[codes].astype(bool)
        else:
            # rows with the same answer share one list object (1M kernels: copies would cost seconds)
            out[col] = pd.Series(values[codes], dtype=object)
    return out


# --- helpers --------------------------------------------------------------------------------------------------------


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InductorArtifactError(
            f"{what} not found: {path}. Point at a TorchInductor debug dir (TORCH_COMPILE_DEBUG=1 writes "
            "torch_compile_debug/run_*/torchinductor/<graph>/output_code.py)."
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InductorArtifactError(
            f"cannot read {what} {path}: {exc}. Regenerate the Inductor debug dir or remove it from the input."
        ) from exc


def _call_body(text: str, path: Path) -> list[str]:
    """Lines of ``call()`` (module-level ``def call(args)`` or ``Runner.call(self, args)`` in 2.13), with each
    graph-partition launch ``(...) = self.partitions[N](partitionN_args)`` replaced by the body of ``partition_N``
    (``config.graph_partition``), so kernels stay in execution order."""
    body = _function_body(text, "call")
    if body is None:
        raise InductorArtifactError(
            f"{path}: no `def call(` found, so this is not a complete TorchInductor output_code.py "
            "(truncated, cpp_wrapper/AOTInductor output, or an unsupported version). Regenerate it with "
            "TORCH_COMPILE_DEBUG=1 (trace.output_code=True) or remove this directory from the input."
        )
    out: list[str] = []
    for line in body:
        m = _PARTITION_CALL_RE.match(line)
        part = _function_body(text, f"partition_{m.group(1)}") if m else None
        out.extend(part if part is not None else [line])
    return out


def _function_body(text: str, name: str) -> list[str] | None:
    m = re.search(rf"^([ \t]*)def {name}\(", text, re.M)
    if m is None:
        return None
    indent = len(m.group(1))
    body = []
    for line in text[m.end():].splitlines()[1:]:  # [0] is the rest of the `def` line
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return body


def _kernel_defs(text: str) -> dict[str, _KernelDef]:
    starts = list(_KERNEL_DEF_RE.finditer(text))
    out: dict[str, _KernelDef] = {}
    for i, m in enumerate(starts):
        name, backend = m.group(1), m.group(2)
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        seg = text[m.start():end]
        if backend == "triton":
            sym = _TRITON_SYMBOL_RE.search(seg)
            meta = _INDUCTOR_META_NAME_RE.search(seg)
            out[name] = _KernelDef("triton", meta.group(1) if meta else name, sym.group(1) if sym else name)
        elif backend.startswith("cpp"):
            raii = _RAII_RE.search(seg)
            out[name] = _KernelDef("cpp", raii.group(1) if raii else f"graph_0_{name}", None)
        else:  # cuda/rocm/halide templates etc.: no documented profiler name, report the kernel name
            out[name] = _KernelDef("extern", name, None)
    return out


def _match_call(line: str, kernels: Mapping[str, _KernelDef]) -> tuple[str, _KernelDef] | None:
    if m := _EXTERN_CALL_RE.match(line):
        return m.group(1), _KernelDef("extern", f"aten::{m.group(2)}", None)
    if m := _OPS_CALL_RE.match(line):
        return m.group(1), _KernelDef("fallback", f"{m.group(2)}::{m.group(3)}", None)
    if m := _ATEN_CALL_RE.match(line):
        return m.group(1), _KernelDef("fallback", f"aten::{m.group(2)}", None)
    if (m := _NAME_CALL_RE.match(line)) and m.group(1) in kernels:
        return m.group(1), kernels[m.group(1)]
    return None


def _header_comments(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """Kernel name -> (Source Nodes, post-grad nodes of the ``a => b`` lines) of the comment block right above
    its module-level definition (describes the kernel's first instance only, formats.md#inductor-output-code)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _KERNEL_DEF_RE.match(line)
        if m is None:
            continue
        j = i - 1
        block: list[str] = []
        while j >= 0 and lines[j].lstrip().startswith("#"):
            block.insert(0, lines[j].strip())
            j -= 1
        src, post = None, []
        for c in block:
            if sm := _SOURCE_NODES_RE.match(c):
                src, post = _split_list(sm.group(1)), []
            elif src is not None and (mm := _NODE_MAPPING_RE.match(c)):
                post.extend(_split_list(mm.group(2)))
        if src is not None:
            out[m.group(1)] = (src, post)
    return out


def _fx_node_frames(graph_dir: Path) -> tuple[dict[str, str | None], dict[str, int]]:
    """Post-grad node name -> its ``# File:`` summary (``None`` under ``# No stacktrace found``), and each
    summary's first position in the file, from ``fx_graph_readable.py`` (names missing there: from
    ``fx_graph_transformed.py``).  torch prints a summary only when it changes, so it holds for every node
    below it until the next one (``torch/fx/graph.py`` ``_format_nodes``)."""
    frames: dict[str, str | None] = {}
    order: dict[str, int] = {}
    for fname in FX_GRAPH_FILES:  # readable first; transformed only adds names
        p = graph_dir / fname
        if not p.is_file():
            continue
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue  # optional input: without it module_stack stays empty
        current: str | None = None
        for line in lines:
            if m := _FX_FILE_COMMENT_RE.match(line):
                current = m.group(1)
                order.setdefault(current, len(order))
            elif _FX_NO_STACK_RE.match(line):
                current = None
            elif (m := _FX_ASSIGN_RE.match(line)) and m.group(1) not in frames:
                frames[m.group(1)] = current
    return frames, order


def _fx_constant_nodes(graph_dir: Path) -> frozenset[str]:
    """Post-grad nodes whose value depends on no graph input (``iota``, ``full`` and what is computed from them
    alone: a causal mask), from ``fx_graph_transformed.py`` (else ``fx_graph_readable.py``). Such a node is
    computed once and shared by every layer that uses it when the graph's common subexpressions are merged (a
    training graph: layer 0's mask in every layer's softmax), so it says nothing about a kernel's layer."""
    for fname in reversed(FX_GRAPH_FILES):
        p = graph_dir / fname
        try:
            lines = p.read_text(encoding="utf-8").splitlines() if p.is_file() else None
        except (OSError, UnicodeDecodeError):
            lines = None
        if lines is None:
            continue
        constant: dict[str, bool] = {}
        for line in lines:
            m = _FX_CALL_LINE_RE.match(line)
            if m is None:
                continue
            # An argument that is no earlier node is a graph input (a placeholder) or a literal/keyword; only
            # graph inputs make a value data-dependent, and they are the identifiers not assigned in the body
            # that also are no Python/torch literal: treat every unknown identifier as an input but the literals.
            names = [t for t in _IDENTIFIER_RE.findall(m.group(2)) if t not in _FX_LITERAL_WORDS]
            constant[m.group(1)] = all(constant.get(t, False) for t in names)
        return frozenset(n for n, c in constant.items() if c)
    return frozenset()


# Words in an FX call's arguments that are no node or graph input (``dtype = torch.int64, device = device(type=
# 'cpu'), layout = torch.strided``; keyword names; literals).
_FX_LITERAL_WORDS = frozenset(
    "torch device type cpu cuda xpu mps meta dtype layout strided pin_memory requires_grad start step end True "
    "False None inf nan memory_format contiguous_format preserve_format channels_last sparse_coo int8 int16 int32 "
    "int64 uint8 bool float16 bfloat16 float32 float64 complex64 complex128 fill_value value".split())


def _call_site_module_paths(nodes: Sequence[str], post_grad: Mapping, fx_ops: Mapping[str, str],
                            constants: frozenset[str] = frozenset()) -> list[str]:
    """Sorted unique module paths of a call site's post-grad FX ``nodes`` (``post_grad``: node -> path). Nodes
    whose op only re-describes memory (:data:`VIEW_OPS`, e.g. the ``view`` of another module's ``addmm``
    output that a kernel reads) and nodes of a value that depends on no input (``constants``:
    :func:`_fx_constant_nodes`) do not count unless the call site has nothing else: reading a tensor is not
    computing it, and a shared constant belongs to no layer. Empty when no node, or one counted node has no known
    path (or is not in the record)."""
    counted = ([n for n in nodes if fx_ops.get(n) not in VIEW_OPS and n not in constants]
               or [n for n in nodes if fx_ops.get(n) not in VIEW_OPS] or list(nodes))
    found = [post_grad.get(n) for n in counted]
    return sorted(set(found)) if found and all(isinstance(p, str) for p in found) else []


def _module_paths_record(graph_dir: Path) -> dict:
    """``opprof_module_paths.json`` of a graph dir (:mod:`operator_profiler.capture.fx_module_paths`) as
    ``{"scope", "pre_grad", "post_grad"}``; empty maps and scope None without the file.

    Raises :class:`InductorArtifactError` when the file is there but unreadable or not of that format.
    """
    path = graph_dir / MODULE_PATHS_JSON
    if not path.is_file():
        return {"scope": None, "post_grad": {}, "source_nodes": {}, "kernel_nodes": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InductorArtifactError(f"{path}: unreadable ({exc}); the capture (torch.profiler run) writes it with its "
                                    "Inductor debug output: re-run the capture, or delete the file (the fusion map "
                                    "then has no module paths)") from None
    if not isinstance(data, dict) or data.get("format") != MODULE_PATHS_FORMAT or not all(
            isinstance(data.get(k), dict) for k in ("post_grad", "source_nodes")):
        raise InductorArtifactError(f"{path}: not an {MODULE_PATHS_FORMAT} record (format "
                                    f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r}); "
                                    "re-run the capture with this version")
    scope = data.get("scope")
    kernel_nodes = data.get("kernel_nodes")
    return {"scope": scope if scope in ("model", "frame") else None, "post_grad": data["post_grad"],
            "source_nodes": data["source_nodes"], "kernel_nodes": kernel_nodes if isinstance(kernel_nodes, dict) else {}}


def _fx_node_ops(graph_dir: Path) -> tuple[dict[str, str], str]:
    """Post-grad node name -> ``ns::op`` from the FX graph files, and their concatenated text (for the vocabulary).

    ``fx_graph_readable.py`` wins over ``fx_graph_transformed.py`` for names in both, so a node keeps its
    pre-pass target (``view`` rather than the post-grad pass's ``reshape``), as in the Original ATen comments.
    """
    ops: dict[str, str] = {}
    texts = []
    for fname in reversed(FX_GRAPH_FILES):  # transformed first, readable overrides
        p = graph_dir / fname
        if not p.is_file():
            continue
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # optional input: without it only the vocabulary / provenance ops are poorer
        texts.append(t)
        ops.update({m.group(1): f"{m.group(2)}::{m.group(3)}" for m in _FX_NODE_RE.finditer(t)})
    return ops, "\n".join(texts)


@functools.lru_cache(maxsize=1)
def _registered_aten_ops() -> frozenset[str]:
    """ATen operator names registered in the installed torch.

    Kernel names are built from the *pre-decomposition* ATen ops (``descriptive_names =
    "original_aten"``, docs/formats.md#inductor-kernel-names), which often do not occur in the post-grad graph
    text (``masked_fill``, ``tril``, ``ones`` decompose away), so the graph files alone are not a
    sufficient vocabulary.
    """
    try:
        import torch
    except ImportError:  # parsing artifacts without torch: the graph-file vocabulary only
        return frozenset()
    names = torch._C._dispatch_get_all_op_names()
    return frozenset(n[len("aten::"):].split(".")[0] for n in names if n.startswith("aten::"))


def _aten_vocabulary(text: str) -> list[str]:
    """ATen op names in ``text`` and in torch's registry, longest first (greedy tokenisation)."""
    return sorted(set(_ATEN_NAME_RE.findall(text)) | _registered_aten_ops(), key=lambda s: (-len(s), s))


def _ops_from_name(kernel: str, kdef: _KernelDef, vocab: Sequence[str]) -> list[str]:
    """The ops a kernel's name encodes (formats.md#inductor-kernel-names). A name without a fused-op part (``cpp_fused_0``,
    ``triton_poi_fused_0``: Inductor names a kernel so when its nodes carry no ``original_aten``) encodes none,
    and pieces that are only digits (FX node suffixes of ``descriptive_names="inductor_node"`` names,
    ``add_1``) are never ops: an operator is never named ``0``."""
    if kdef.kind in ("extern", "fallback"):
        return [kdef.profiler_name] if "::" in kdef.profiler_name else []
    m = _FUSED_NAME_RE.match(kernel)
    if not m:
        return []
    return sorted({op for op in _tokenise(m.group(1), vocab) if not op.replace("_", "").isdigit()})


def _tokenise(fused: str, vocab: Sequence[str]) -> list[str]:
    """Split ``add_native_layer_norm_view`` into ``aten::`` ops, longest vocabulary match first.

    The name is ``"_".join(ops)``, so a match must end at ``_`` or at the end.  Unmatched ``_``-separated pieces are
    joined and kept verbatim (no ``aten::`` prefix) so that nothing is dropped.
    """
    out: list[str] = []
    leftover: list[str] = []
    i, n = 0, len(fused)
    while i < n:
        for word in vocab:
            j = i + len(word)
            if fused.startswith(word, i) and (j == n or fused[j] == "_"):
                if leftover:
                    out.append("_".join(leftover))
                    leftover = []
                out.append(f"aten::{word}")
                i = j + 1
                break
        else:
            # no op starts here: take one piece (a leading "_" belongs to the piece, as in `_to_copy`)
            j = fused.find("_", i + 1)
            j = n if j < 0 else j
            leftover.append(fused[i:j])
            i = j + 1
    if leftover:
        out.append("_".join(leftover))
    return out


def _load_provenance(graph_dir: Path, provenance: Path | Mapping | None) -> Mapping:
    if isinstance(provenance, Mapping):
        return provenance
    path = Path(provenance) if provenance is not None else graph_dir / PROVENANCE_JSON
    if provenance is None and not path.is_file():
        return {}
    text = _read_text(path, what="provenance JSON")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InductorArtifactError(
            f"{path}: not valid JSON ({exc}); expected torch's inductor_provenance_tracking_node_mappings.json "
            "(keys preToPost/postToPre/cppCodeToPost/postToCppCode). Regenerate it or delete the file."
        ) from exc
    if not isinstance(data, Mapping):
        raise InductorArtifactError(
            f"{path}: expected a JSON object with cppCodeToPost/postToPre, got {type(data).__name__}; "
            "pass torch's inductor_provenance_tracking_node_mappings.json."
        )
    return data


def _split_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _op_name(dotted: str) -> str:
    """``aten.native_layer_norm`` -> ``aten::native_layer_norm``."""
    ns, _, op = dotted.partition(".")
    return f"{ns}::{op}" if op else dotted


def _unique(items) -> list[str]:
    return list(dict.fromkeys(items))


def _name_matches(name: str, profiler_name: str, gpu_symbol) -> bool:
    if name == profiler_name:
        return True
    name = normalize_kernel_name(name)
    return name == profiler_name or (isinstance(gpu_symbol, str) and name == gpu_symbol)


def _empty_fusion_map() -> pd.DataFrame:
    dtypes = {"call_index": "int64", "debug_handle": "Int64", "fused_ops": object, "source_nodes": object,
              "post_grad_nodes": object, "module_stack": object, "listed_not_computed": object,
              "compile_id": object, "cache_key": object, "module_paths": object, "module_paths_scope": object}
    return pd.DataFrame({c: pd.Series(dtype=dtypes.get(c, "str")) for c in FUSION_MAP_COLUMNS})
