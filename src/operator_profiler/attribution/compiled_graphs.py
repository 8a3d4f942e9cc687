"""Path (c) on a Kineto timeline: which compiled graph, and which of its call sites, each kernel ran as,
found from the profiler's CPU-side ranges around each compiled graph's call and the fusion map's call order.
Details: docs/modules.md#attribution-compiled-graphs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..timeline.model import DISPATCHER_OP, METADATA_OPS
from . import inductor
from .correlation import COMPILED_GRAPH_PREFIX, OpTable

COMPILED_REGION_PREFIX = "Torch-Compiled Region: "
FORWARD_WRAPPER = "CompiledFunction"
BACKWARD_WRAPPER = "CompiledFunctionBackward"
_GRAPH_LAUNCH_RE = re.compile(r"^cu(?:da)?GraphLaunch", re.IGNORECASE)

#: Reasons of path (c) on a Kineto timeline (evidence ``inductor.reason``; the kernel's ``reason`` when no
#: dispatcher op names it).
REASONS = {
    "no_fusion_map": "a compiled-graph region, but no fusion map was given",
    "fusion_map_mismatch": "the call's kernel sequence fits no graph of the fusion map (a map of another run or "
    "model, a graph missing from it, or a call cut by the capture window)",
    "ambiguous_compiled_graph": "several graphs of the fusion map with different call sites fit the call and "
    "nothing the trace records (cache key, compile id, direction) tells them apart; `candidates` lists them",
    "cuda_graph_replay_mismatch": "a CUDA-graph replay whose generated kernels fit no graph of the fusion map",
    "extern_call_not_placed": "a library kernel of a CUDA-graph replay between two generated kernels where the "
    "graph has no single extern/fallback call (zero or several): its call site is unknown",
}
#: Also ``ambiguous_generic_kernel_name`` (``inductor.BY_NAME_REASONS``) for a replay or wrapper call whose
#: generated kernels all show the generic ``triton_`` with no CPU-side event: only their count would pick the graph.


@dataclass
class FusionAnswers:
    """Path (c)'s result per kernel id.

    ``sites``: kernel id -> the call site it ran as: the fusion-map row's fields plus ``call_site`` (the kernel
    *is* the call, not work nested in it or a further library kernel of it), ``joined_by`` (``compiled_region``,
    ``cuda_graph_replay``, ``wrapper_range``, ``kernel_name:<match>``), ``source_nodes_ambiguous`` and
    ``candidates`` (by-name answers whose call site is undecided).  ``refusals``: kernel id -> ``reason`` (one of
    :data:`REASONS` or ``inductor.BY_NAME_REASONS``), ``candidates`` (graphs or ``graph:call_index``) and
    ``block`` (the fusion map knows the kernel: no lower-precedence path may name it instead).
    """

    sites: dict[int, dict] = field(default_factory=dict)
    refusals: dict[int, dict] = field(default_factory=dict)


@dataclass
class _Call:
    """One call of a compiled graph seen in the trace."""

    kind: str  # "region" | "replay" | "wrapper"
    members: list[int]  # kernel ids
    key: str | None = None
    compile_id: str | None = None
    direction: str | None = None  # "forward" | "backward" | None
    fits: list[str] = field(default_factory=list)


def resolve(kernels: pd.DataFrame, ranges: pd.DataFrame, ops: OpTable, fusion_map: pd.DataFrame) -> FusionAnswers:
    """Path (c) for every kernel of a Kineto timeline.

    Args:
        kernels, ranges: the timeline tables (DESIGN.md §3).
        ops: :func:`operator_profiler.attribution.correlation.find_ops` on them.
        fusion_map: :func:`operator_profiler.attribution.inductor.load_fusion_map` output (may be empty).
    """
    out = FusionAnswers()
    has_map = fusion_map is not None and len(fusion_map) > 0
    in_region = ops.compiled_region >= 0
    if not has_map:
        for i in np.flatnonzero(in_region):
            out.refusals[int(ops.kernel_id[i])] = {"reason": "no_fusion_map", "candidates": [], "block": False}
        return out
    names = ranges["name"].astype(str).tolist()
    kinds = ranges["kind"].astype(str).to_numpy()
    parent = _parent_positions(ranges)
    index = inductor._name_index(fusion_map)
    generic_sites = bool(fusion_map["gpu_symbol"].map(
        lambda s: isinstance(s, str) and inductor.is_generic_triton_name(s)).any())
    row_of = {int(k): i for i, k in enumerate(ops.kernel_id)}
    kernel_names = kernels["name"].astype(str).to_numpy()
    starts = kernels["start_ns"].astype("int64").to_numpy()
    api = kernels["launch_api"].astype(object).to_numpy() if "launch_api" in kernels else np.full(len(kernels), None)
    corr = kernels["correlation_id"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
    pids = kernels["pid"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
    replay = np.array([isinstance(a, str) and bool(_GRAPH_LAUNCH_RE.match(a)) for a in api], dtype=bool) & (corr >= 0)

    known_names = {n for n in set(kernel_names) | set(names) if _known(n, index, generic_sites)}

    def position(range_id: int) -> int:
        return int(ops.threads.position[range_id])

    def match_name(i: int) -> str:
        """The descriptive name of kernel row i: the CPU-side record function around its launch when the map
        knows that name (Python frames of ``with_stack`` traces may sit inside it), else its own name."""
        inner = int(ops.innermost[i])
        if inner < 0:
            return kernel_names[i]
        if names[inner] in known_names:
            return names[inner]
        if kinds[inner] == "python_function":
            for rid in reversed(ops.stack(i)):
                name = names[position(rid)]
                if name.startswith("##"):
                    break
                if name in known_names:
                    return name
        return kernel_names[i]

    # --- the calls: every kernel inside a region, every replayed kernel, and every other kernel the map knows ---
    calls: dict[tuple, _Call] = {}
    descriptive: dict[int, str] = {}
    inner = ops.innermost
    name_known = np.isin(kernel_names, list(known_names))
    inner_names = np.array([names[p] if p >= 0 else "" for p in inner], dtype=object)
    inner_known = (inner >= 0) & np.isin(inner_names, list(known_names))
    inner_python = (inner >= 0) & (kinds[np.maximum(inner, 0)] == "python_function") if len(kinds) else inner < -1
    for i in np.flatnonzero(replay | in_region | name_known | inner_known | inner_python):
        i = int(i)
        kid = int(ops.kernel_id[i])
        if replay[i]:
            ident = ("replay", int(pids[i]), int(corr[i]))
        elif in_region[i]:
            ident = ("region", int(ops.compiled_region[i]))
        else:
            name = match_name(i)
            if name not in known_names:
                continue
            descriptive[kid] = name
            wrapper = _innermost_wrapper(ops.stack(i), names, position)
            ident = ("wrapper", wrapper) if wrapper is not None else ("name", 0)
        call = calls.get(ident)
        if call is None:
            call = calls[ident] = _Call(kind=ident[0], members=[])
            if ident[0] != "name":
                _describe(call, i, ops, names, parent, position)
        call.members.append(kid)
    by_name = calls.pop(("name", 0), None)
    name_members = list(by_name.members) if by_name is not None else []
    # A region around a replay (reduce-overhead): the replay is the call; the region's other kernels are the
    # input copies of the CUDA-graph runtime, under their own ATen ops (path a).
    replayed_regions = {int(ops.compiled_region[i]) for i in np.flatnonzero(replay & in_region)}
    for region in replayed_regions:
        calls.pop(("region", region), None)

    # --- candidate graphs per call, then the graphs each call's kernels fit --------------------------------------
    graphs = _graph_table(fusion_map)
    sequences: dict[tuple, tuple[str, object]] = {}
    fit_cache: dict[tuple, list[str]] = {}

    def fitting(names_seen: list[str], candidates: list[str], generated_only: bool) -> list[str]:
        """inductor.fitting_graphs, once per distinct call (every iteration repeats the same calls)."""
        key = (tuple(names_seen), tuple(candidates), generated_only)
        if key not in fit_cache:
            fit_cache[key] = inductor.fitting_graphs(names_seen, fusion_map, candidates,
                                                     generated_only=generated_only) if names_seen else []
        return fit_cache[key]

    for ident, call in calls.items():
        rows = [row_of[k] for k in call.members]
        if call.kind == "replay" and not any(kernel_names[r] in known_names or match_name(r) in known_names
                                             for r in rows):
            continue  # a CUDA graph of eager code: the fusion map has nothing to say
        candidates = _candidates(graphs, call)
        rows.sort(key=lambda r: (int(starts[r]) if call.kind == "replay" else int(ops.t0[r]), int(ops.kernel_id[r])))
        if call.kind == "region":
            units = _call_units(rows, ops, call_region=ident[1], names=names, position=position,
                                kernel_names=kernel_names)
            call.fits = fitting([name for name, _ in units], candidates, False)
            sequences[ident] = ("units", units)
        else:
            gen = [r for r in rows if match_name(r) in known_names]
            call.fits = fitting([match_name(r) for r in gen], candidates, True)
            sequences[ident] = ("generated", (rows, gen))
    _pin_by_group(calls, fusion_map)

    # --- answers ---------------------------------------------------------------------------------------------------
    records = {str(g): rows.sort_values("call_index").to_dict("records") for g, rows in fusion_map.groupby("graph")}

    def records_of(graph: str) -> list[dict]:
        return records[str(graph)]
    resolved: dict[tuple[str, ...], tuple[str, list[dict]]] = {}  # fitting graphs -> ("sites" | "ambiguous", sites)
    for ident, call in calls.items():
        if ident not in sequences:
            continue
        mode, data = sequences[ident]
        fits = call.fits
        if fits and mode == "generated" and all(inductor.is_generic_triton_name(match_name(r)) for r in data[1]):
            # only generic `triton_` names and no CPU-side event: besides the count of generated kernels, only
            # where the library kernels sit can tell a graph (a library kernel needs an extern call in its gap)
            fits = [g for g in fits if _library_gaps_fit(data[0], set(data[1]), records_of(g))]
            if not fits or call.kind != "replay":
                for kid in call.members:
                    out.refusals[kid] = {"reason": "ambiguous_generic_kernel_name", "candidates": list(call.fits),
                                         "block": True}
                continue
        if not fits:
            if call.kind == "wrapper":  # a wrapper may hold several graphs' calls: fall back to names
                name_members += call.members
                continue
            why = "cuda_graph_replay_mismatch" if call.kind == "replay" else "fusion_map_mismatch"
            for kid in call.members:
                out.refusals[kid] = {"reason": why, "candidates": [], "block": True}
            continue
        if tuple(fits) not in resolved:
            resolved[tuple(fits)] = _sites_of(fits, records, fusion_map)
        outcome, sites = resolved[tuple(fits)]
        if outcome == "ambiguous":
            for kid in call.members:
                out.refusals[kid] = {"reason": "ambiguous_compiled_graph", "candidates": list(fits), "block": True}
            continue
        if mode == "units":
            for (_, rows), site in zip(data, sites):
                for n, r in enumerate(rows):
                    out.sites[int(ops.kernel_id[r])] = _answer(site, n == 0, "compiled_region")
            continue
        rows, gen = data
        generated = [s for s in sites if s["kind"] in ("triton", "cpp")]
        joined_by = "cuda_graph_replay" if call.kind == "replay" else "wrapper_range" if call.kind == "wrapper" \
            else "compiled_region"
        for r, site in zip(gen, generated):
            out.sites[int(ops.kernel_id[r])] = _answer(site, True, joined_by)
        if call.kind == "replay":
            _place_library_kernels(rows, set(gen), sites, ops, out)
    if name_members:
        _by_name(kernels, name_members, row_of, descriptive, fusion_map, out)
    return out


def _library_gaps_fit(rows: list[int], generated: set[int], sites: list[dict]) -> bool:
    """Whether a CUDA-graph replay's library kernels sit where the graph has extern/fallback calls: every gap
    between generated kernels (and before the first, after the last) that holds a library kernel must hold an
    extern call of the graph (an extern call may launch no kernel, a library kernel needs a call)."""
    kernel_gaps, count = [], 0
    for r in rows:
        if r in generated:
            kernel_gaps.append(count)
            count = 0
        else:
            count += 1
    kernel_gaps.append(count)
    call_gaps, externs = [], 0
    for s in sites:
        if s["kind"] in ("triton", "cpp"):
            call_gaps.append(externs)
            externs = 0
        else:
            externs += 1
    call_gaps.append(externs)
    return len(kernel_gaps) == len(call_gaps) and all(c > 0 for k, c in zip(kernel_gaps, call_gaps) if k > 0)


def _sites_of(fits: list[str], records: Mapping[str, list[dict]], fusion_map: pd.DataFrame) -> tuple[str, list[dict]]:
    """The call sites a call that fits ``fits`` ran: one graph's, or identical graphs' (any); graphs with the same
    kernels and ops but different FX nodes: their common sites (:func:`_common_site`); else ``("ambiguous", [])``."""
    if not inductor.graphs_differ(fusion_map, fits):
        return "sites", records[fits[0]]
    if inductor.graphs_differ(fusion_map, fits, ops_only=True):
        return "ambiguous", []
    return "sites", [_common_site(column) for column in zip(*(records[g] for g in fits))]


def _known(name: str, index: Mapping, generic_sites: bool) -> bool:
    """Whether the fusion map has a generated call site answering to ``name`` (or, for the generic ``triton_``,
    whether it has generic-symbol sites at all)."""
    key = inductor.normalize_kernel_name(name)
    return key in index or (generic_sites and key == inductor.GENERIC_TRITON_SYMBOL)


def _describe(call: _Call, i: int, ops: OpTable, names: list, parent: np.ndarray, position) -> None:
    """Key, compile id and direction of the call containing kernel row ``i``, from the ranges around its launch
    (for a backward call: the compile id around its forward ``CompiledFunction``, linked by the autograd
    sequence number or fwdbwd flow)."""
    stack = [names[position(r)] for r in ops.stack(i)]
    for name in reversed(stack):
        if name.startswith(COMPILED_GRAPH_PREFIX):
            key = name[len(COMPILED_GRAPH_PREFIX):].strip().strip("#").strip()
            call.key = key if key and key != "None" else None
            break
    if any(n == BACKWARD_WRAPPER or n.endswith(": " + BACKWARD_WRAPPER) for n in stack):
        call.direction = "backward"
        forward = int(ops.forward[i])
        outer = _ancestor_names(forward, names, parent) if forward >= 0 else []
        call.compile_id = next((n[len(COMPILED_REGION_PREFIX):] for n in reversed(outer)
                                if n.startswith(COMPILED_REGION_PREFIX)), None)
        return
    if FORWARD_WRAPPER in stack:
        call.direction = "forward"
    call.compile_id = next((n[len(COMPILED_REGION_PREFIX):] for n in reversed(stack)
                            if n.startswith(COMPILED_REGION_PREFIX)), None)


def _ancestor_names(pos: int, names: list, parent: np.ndarray) -> list[str]:
    out = []
    while pos >= 0:
        out.append(names[pos])
        pos = int(parent[pos])
    return out[::-1]


def _parent_positions(ranges: pd.DataFrame) -> np.ndarray:
    ids = ranges["range_id"].astype("int64").to_numpy()
    position = pd.Series(np.arange(len(ids), dtype=np.int64), index=ids)
    parents = ranges["parent_id"].astype("Int64").fillna(-1).astype("int64").to_numpy()
    return np.where(parents >= 0, position.reindex(parents).fillna(-1).to_numpy(dtype=np.int64), -1)


def _innermost_wrapper(stack: list[int], names: list, position) -> int | None:
    for rid in reversed(stack):
        name = names[position(rid)]
        if name in (FORWARD_WRAPPER, BACKWARD_WRAPPER) or name.startswith(COMPILED_REGION_PREFIX):
            return int(rid)
    return None


def _graph_table(fusion_map: pd.DataFrame) -> pd.DataFrame:
    """One row per graph: kind (from the dir name), compile_id, cache_key (null where unknown)."""
    per_graph = fusion_map.drop_duplicates("graph")
    return pd.DataFrame({
        "graph": per_graph["graph"].astype(str).to_numpy(),
        "kind": [inductor.graph_kind(g) for g in per_graph["graph"].astype(str)],
        "compile_id": per_graph["compile_id"].to_numpy() if "compile_id" in per_graph else None,
        "cache_key": per_graph["cache_key"].to_numpy() if "cache_key" in per_graph else None,
    })


def _candidates(graphs: pd.DataFrame, call: _Call) -> list[str]:
    """The graphs that call may have run, by direction, cache key and compile id (unknown values never exclude)."""
    kind = graphs["kind"]
    if call.direction == "backward":
        ok = kind.isna() | (kind == "backward")
    elif call.direction == "forward":
        ok = kind.isna() | (kind == "forward")
    else:
        ok = kind != "backward"
    if call.key is not None and graphs["cache_key"].notna().any():
        ok &= graphs["cache_key"].isna() | (graphs["cache_key"] == call.key)
    if call.compile_id is not None and graphs["compile_id"].notna().any():
        ok &= graphs["compile_id"].isna() | (graphs["compile_id"] == call.compile_id)
    return graphs.loc[ok.to_numpy(dtype=bool), "graph"].tolist()


def _pin_by_group(calls: Mapping[tuple, _Call], fusion_map: pd.DataFrame) -> None:
    """Calls that ran one graph narrow each other's candidates (in place).

    All calls with one cache key run one graph (the key identifies the compiled artifact), as do all calls of
    one compile id and direction: a graph must fit every such call whose sequence fits any graph (a call cut by
    the capture window fits none and is ignored here).  A graph pinned by one group (the only graph left)
    is then removed from the other groups of the same kind (different keys or compile ids are different
    compilations, each with its own debug dir), unless that would leave a group with none.
    """
    groups: dict[tuple, list[_Call]] = {}
    for call in calls.values():
        if call.key is not None:
            groups.setdefault(("key", call.key), []).append(call)
        elif call.compile_id is not None:
            groups.setdefault(("compile", call.compile_id, call.direction), []).append(call)
    pinned: dict[tuple, list[str]] = {}
    for ident, members in groups.items():
        fitting = [set(c.fits) for c in members if c.fits]
        common = set.intersection(*fitting) if fitting else set()
        if common:  # empty: the calls contradict each other; pin nothing
            pinned[ident] = sorted(common)
    for _ in range(len(pinned)):
        changed = False
        for ident, graphs in pinned.items():
            taken = {pinned[o][0] for o in pinned if o != ident and o[0] == ident[0] and len(pinned[o]) == 1}
            left = [g for g in graphs if g not in taken]
            if left and len(left) < len(graphs):
                pinned[ident], changed = left, True
        if not changed:
            break
    for ident, members in groups.items():
        if ident not in pinned:
            continue
        for call in members:
            narrowed = [g for g in call.fits if g in pinned[ident]]
            if narrowed:
                call.fits = narrowed


#: The record function of an Inductor C++ GEMM template's micro-kernel (max_autotune on the CPU), e.g.
#: ``graph_0_gemm_m32n32k16_kernel``: one call of the template in ``call()`` (a bmm's, over the batch) records it
#: once per micro-kernel call, so consecutive records of one such name with nothing between them are one call
#: site. (Two consecutive call sites of one template would then read as one: the sequence no longer fits the graph,
#: and its kernels are refused as fusion_map_mismatch, never given to the wrong call.)
CPU_TEMPLATE_RECORD = re.compile(r"^graph_\d+_gemm_\w+_kernel$")


def _call_units(rows: list[int], ops: OpTable, call_region: int, names: list, position,
                kernel_names: np.ndarray) -> list[tuple[str, list[int]]]:
    """Group a ``## Call CompiledFxGraph`` region's kernels (rows, in launch order) into the calls of its
    ``call()`` function.

    A call is either an ATen op called by the wrapper (an extern kernel such as ``extern_kernels.mm`` ->
    ``aten::mm``, or a fallback): every kernel launched inside the outermost dispatcher op below the region
    belongs to it, whatever the library kernel is called (cuBLAS on a GPU; on a CPU the op is the kernel itself
    and nested ops such as ``aten::copy_`` join it); or a generated kernel (Inductor C++ / Triton), one call per
    launch, named by the CPU-side record function when there is one (the descriptive name, where the GPU symbol
    may be a generic ``triton_``), else by the kernel's own name; the consecutive records of one C++ GEMM template
    call (:data:`CPU_TEMPLATE_RECORD`) are one call. Returns ``[(call name, kernel rows)]`` in launch order.
    """
    units: list[tuple[str, list[int]]] = []
    by_op: dict[int, list[int]] = {}
    for r in rows:
        stack = ops.stack(r)
        region_id = int(ops.range_ids[call_region])
        below = stack[stack.index(region_id) + 1:] if region_id in stack else []
        outer_op = next((rid for rid in below if DISPATCHER_OP.match(names[position(rid)])), None)
        if outer_op is not None:
            if outer_op in by_op:
                by_op[outer_op].append(r)
                continue
            by_op[outer_op] = [r]
            units.append((names[position(outer_op)], by_op[outer_op]))
            continue
        record = next((names[position(rid)] for rid in reversed(below) if not names[position(rid)].startswith("##")),
                      None)
        name = record or kernel_names[r]
        if units and units[-1][0] == name and CPU_TEMPLATE_RECORD.match(name):
            units[-1][1].append(r)  # the same template call's next record (see CPU_TEMPLATE_RECORD)
            continue
        units.append((name, [r]))
    # Metadata ops called by the wrapper itself (a reinterpretation that escaped its op in an
    # integer-µs trace) are not call sites of the generated code.
    return [(name, members) for name, members in units if name not in METADATA_OPS]


def _answer(site: Mapping, call_site: bool, joined_by: str) -> dict:
    return {"source_nodes_ambiguous": False, "candidates": [], **site, "call_index": int(site["call_index"]),
            "call_site": call_site, "joined_by": joined_by,
            "listed_not_computed": list(inductor._list(site, "listed_not_computed"))}


def _common_site(sites: tuple[dict, ...]) -> dict:
    """One call position of several candidate graphs that agree on its kernel and ops: their common answer,
    ``source_nodes``/``module_stack``/``module_paths`` kept only where all agree (else empty and
    ``source_nodes_ambiguous``),
    ``graph`` null, ``candidates`` the ``graph:call_index`` list."""
    first = dict(sites[0])
    same = len({(inductor._list(s, "source_nodes"), inductor._list(s, "module_stack"),
                 inductor._list(s, "module_paths")) for s in sites}) == 1
    first.update({
        "graph": None,
        "source_nodes": list(inductor._list(first, "source_nodes")) if same else [],
        "module_stack": list(inductor._list(first, "module_stack")) if same else [],
        "module_paths": list(inductor._list(first, "module_paths")) if same else [],
        "source_nodes_ambiguous": not same,
        "candidates": [f"{s['graph']}:{int(s['call_index'])}" for s in sites],
    })
    return first


def _place_library_kernels(rows: list[int], generated: set[int], sites: list[dict], ops: OpTable,
                           out: FusionAnswers) -> None:
    """The library kernels of a matched replay, by the gap between generated kernels they sit in: a gap of the
    graph's ``call()`` holding exactly one extern/fallback call owns them all (cuBLAS GEMM plus its split-K
    reduce); a gap with as many library kernels as ``extern_kernels`` calls gives one kernel to each, in order
    (each such call launches at least one kernel); a gap of several extern calls of one op (``aten::addmm``
    twice) otherwise gives them that op with the call and FX nodes undecided (a call may launch one kernel or
    several); any other gap leaves them unplaced (``extern_call_not_placed``)."""
    gaps: list[list[dict]] = [[]]
    for s in sites:
        if s["kind"] in ("triton", "cpp"):
            gaps.append([])
        else:
            gaps[-1].append(s)
    library: list[list[int]] = [[]]
    for r in rows:
        if r in generated:
            library.append([])
        else:
            library[-1].append(r)
    gap, first_in_gap = 0, True
    for r in rows:
        kid = int(ops.kernel_id[r])
        if r in generated:
            gap, first_in_gap = gap + 1, True
            continue
        externs = gaps[gap] if gap < len(gaps) else []
        mine = library[gap] if gap < len(library) else []
        if len(externs) > 1 and len(mine) == len(externs) and all(s["kind"] == "extern" for s in externs):
            # as many library kernels as extern_kernels calls, each of which launches at least one: one each
            out.sites[kid] = _answer(externs[mine.index(r)], True, "cuda_graph_replay")
        elif len(externs) == 1:
            out.sites[kid] = _answer(externs[0], first_in_gap, "cuda_graph_replay")
            first_in_gap = False
        elif len(externs) > 1 and len({tuple(sorted(inductor._list(s, "fused_ops"))) for s in externs}) == 1:
            # several extern calls of one op (two addmm in a row): which call launched which kernel is open,
            # the operator is not; the call position and, where they differ, the FX nodes stay undecided
            answer = _answer(_common_site(tuple(externs)), False, "cuda_graph_replay")
            out.sites[kid] = {**answer, "call_index": None, "call_site": False,
                              "candidates": [f"{s['graph']}:{int(s['call_index'])}" for s in externs],
                              "source_nodes_ambiguous": True}
        else:
            out.refusals[kid] = {"reason": "extern_call_not_placed", "block": True,
                                 "candidates": [c for s in externs for c in (s.get("candidates") or
                                                [f"{s['graph']}:{int(s['call_index'])}"])]}


def _by_name(kernels: pd.DataFrame, members: list[int], row_of: Mapping[int, int], descriptive: Mapping[int, str],
             fusion_map: pd.DataFrame, out: FusionAnswers) -> None:
    """Kernels outside any recognised call whose (CPU-side or own) name the fusion map knows: joined by name."""
    rows = [row_of[k] for k in members]
    subset = kernels.iloc[rows].copy()
    subset["match_key"] = [descriptive.get(int(k), n) for k, n in zip(subset["kernel_id"], subset["name"])]
    found = inductor.attribute_by_name(subset, fusion_map)
    # kind and origin of the answering call site(s): by (graph, call index), else by kernel (same for all its sites
    # in practice: one kernel is one backend; the origin is reported only where one site answers)
    place = {(str(g), int(c)): (k, o) for g, c, k, o in
             zip(fusion_map["graph"], fusion_map["call_index"], fusion_map["kind"], fusion_map["origin"])}
    kind_of = dict(zip(fusion_map["kernel"], fusion_map["kind"]))
    for r in found.to_dict("records"):
        kid = int(r["kernel_id"])
        if r["match"] is None:
            out.refusals[kid] = {"reason": r["reason"], "candidates": list(r["candidates"]), "block": True}
            continue
        call_index = None if pd.isna(r["call_index"]) else int(r["call_index"])
        kind, origin = place.get((str(r["graph"]), call_index), (kind_of.get(r["kernel"]), None))
        out.sites[kid] = {
            "graph": r["graph"], "call_index": call_index, "kernel": r["kernel"], "kind": kind,
            "fused_ops": list(r["fused_ops"]), "source_nodes": list(r["source_nodes"]),
            "module_stack": list(r["module_stack"]), "listed_not_computed": list(r["listed_not_computed"]),
            "module_paths": list(r["module_paths"]), "module_paths_scope": r["module_paths_scope"],
            "origin": origin, "call_site": True, "joined_by": f"kernel_name:{r['match']}",
            "source_nodes_ambiguous": bool(r["source_nodes_ambiguous"]), "candidates": list(r["candidates"]),
        }
