"""Path (a): kernel -> launch call -> the profiler ops enclosing the launch on its thread.

For GPU Kineto traces the kernel's launch is found by CUPTI correlation id (done by the timeline
reader, which fills ``launch_tid``/``launch_start_ns``/``launch_end_ns``); on a CPU trace a kernel is its
own launch. The operator is the innermost dispatcher op (``aten::...``) of the stack of ``cpu_op``
ranges that enclose the launch interval on the launch thread (docs/formats.md#kineto-external-id,
the recommended algorithm). Backward kernels get ``forward_operator`` through the Kineto
``Sequence number`` of their autograd node (formats.md#kineto-backward-thread). Where no op encloses the launch, the innermost
``user_annotation`` around it (``record_function``) is kept for the last-resort ``user_annotation``
path of :mod:`.merge` (DESIGN.md §3).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..naming import NVTX_DOMAIN
from ..timeline.model import DISPATCHER_OP, external_id_mode
from .row_groups import path_codes

COMPILED_GRAPH_PREFIX = "## Call CompiledFxGraph"
# user_annotation ranges that never name a kernel's operator (the user_annotation path): our harness's
# iteration/layer ranges ("opprof.iteration:0", "opprof.layer:h.0"), torch.profiler's schedule steps
# ("ProfilerStep#12") and Inductor's compiled-graph regions (the fusion map's business).
NOT_AN_OPERATOR_ANNOTATION = re.compile(
    rf"^(?:{re.escape(NVTX_DOMAIN)}\.|ProfilerStep#\d+$|{re.escape(COMPILED_GRAPH_PREFIX)}|## .* ##$)")


@dataclass
class OpStack:
    """What path (a) found for one kernel."""

    stack: list[int] = field(default_factory=list)  # range ids, outermost first
    operator: str | None = None
    operator_range_id: int | None = None
    # "dispatcher_op" (aten::mm, c10d::allreduce_) or "cpu_op" (no dispatcher op encloses the launch:
    # the innermost profiler op, e.g. a custom autograd Function or Inductor's CPU-side kernel event)
    operator_kind: str | None = None
    # kernel "External id" vs the ops of the stack (op_id traces only): "agrees" / "disagrees"
    external_id_check: str | None = None
    # the innermost user_annotation around the launch that may name the operator (range id; see find_ops)
    annotation_range_id: int | None = None
    forward_operator: str | None = None
    forward_range_id: int | None = None
    compiled_region: int | None = None  # range id of the enclosing "## Call CompiledFxGraph" range
    reason: str | None = None


class RangeNames(Sequence):
    """The ranges' names by position, held as int32 codes into the distinct names: a list of one str object
    per range would cost ~75 bytes a range (hundreds of MB for millions of ops). ``names[i]`` is the name;
    :meth:`take` many at once."""

    def __init__(self, names: pd.Series):
        codes, distinct = pd.factorize(names, use_na_sentinel=False)
        self.codes = codes.astype(np.int32)
        self.distinct = list(distinct)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.distinct[c] for c in self.codes[i].tolist()]
        return self.distinct[self.codes[i]]

    def __len__(self) -> int:
        return len(self.codes)

    def test(self, dtype, test) -> np.ndarray:
        """``test`` (elementwise: a Series of names -> a boolean array) of every range's name, run once per
        distinct name (a Series of ``dtype``, the column's) and spread by the codes."""
        if not len(self.distinct):
            return np.zeros(len(self.codes), dtype=bool)
        return np.asarray(test(pd.Series(self.distinct, dtype=dtype)), dtype=bool)[self.codes]

    def take(self, positions: np.ndarray) -> np.ndarray:
        """Object array of the names at ``positions`` (None where a position is -1)."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.full(len(positions), None, dtype=object)
        found = positions >= 0
        if found.any():
            out[found] = np.array(self.distinct, dtype=object)[self.codes[positions[found]]]
        return out


def _is_kind(kind: pd.Series, value: str) -> np.ndarray:
    """Per row, whether ``kind`` (a range kind column; null is no kind) is ``value``: ``kind.astype(str) == value``,
    read from a categorical's codes without building a string per row."""
    if isinstance(kind.dtype, pd.CategoricalDtype):
        return (kind == value).to_numpy(dtype=bool)
    return (kind.astype(str) == value).to_numpy(dtype=bool)


class _ThreadRanges:
    """The ranges of each (pid, tid) in pre-order, for "which ranges enclose [t0, t1]" queries.

    Complete events on one thread nest (the timeline reader's ``parent_id`` guarantees that a parent
    contains its child), so the innermost range enclosing ``t0`` is an ancestor-or-self of the last
    range starting at or before ``t0``: a binary search and a walk up the parents answer the query
    in O(log n + depth), without building interval trees.
    """

    def __init__(self, ranges: pd.DataFrame):
        # Arrays indexed by range id (ids are row numbers 0..n-1 in our timelines): dicts of a few
        # million ints would cost hundreds of MB. Only these columns are read (no copy of the table).
        ids = ranges["range_id"].astype("int64").to_numpy()
        starts = ranges["start_ns"].astype("int64").to_numpy()
        ends = ranges["end_ns"].astype("Int64").fillna(-1).astype("int64").to_numpy()
        size = int(ids.max()) + 1 if len(ids) else 0
        self.start = np.zeros(size, dtype=np.int64)
        self.end = np.full(size, -1, dtype=np.int64)  # unclosed or unknown: encloses nothing
        self.parent = np.full(size, -1, dtype=np.int64)
        self.position = np.full(size, -1, dtype=np.int64)
        self.start[ids] = starts
        self.end[ids] = ends
        self.parent[ids] = ranges["parent_id"].astype("Int64").fillna(-1).astype("int64").to_numpy()
        self.position[ids] = np.arange(len(ids), dtype=np.int64)
        self.threads: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # Pre-order (the timeline reader numbers ranges parents-first). A child recorded as starting
        # slightly before its parent (clock skew, docs/field-cases.md C17) is searched at its parent's start:
        # the running maximum keeps the search keys sorted and the child after its parent.
        closed = np.flatnonzero(ranges["end_ns"].notna().to_numpy())
        pids = ranges["pid"].astype("int64").to_numpy()[closed]
        tids = ranges["tid"].astype("int64").to_numpy()[closed]
        order = np.lexsort((ids[closed], tids, pids))
        pids, tids, rows = pids[order], tids[order], closed[order]
        cuts = np.flatnonzero((pids[1:] != pids[:-1]) | (tids[1:] != tids[:-1])) + 1
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(rows)].tolist()):
            if lo < hi:
                group = rows[lo:hi]
                self.threads[(int(pids[lo]), int(tids[lo]))] = (np.maximum.accumulate(starts[group]), ids[group])

    def enclosing(self, pid: int, tid: int, t0: int, t1: int) -> list[int]:
        """Range ids enclosing [t0, t1] on the thread, outermost first."""
        thread = self.threads.get((pid, tid))
        if thread is None:
            return []
        starts, ids = thread
        pos = int(np.searchsorted(starts, t0, side="right")) - 1
        return self.ancestors(int(ids[pos]), t0, t1) if pos >= 0 else []

    def ancestors(self, rid: int | None, t0: int, t1: int) -> list[int]:
        """``rid`` and its ancestors that enclose [t0, t1], outermost first.

        Containment is checked at every level: a child that overran its parent (integer-µs
        traces, see the timeline reader's nesting) can have ancestors that ended before ``t0``.
        """
        stack = []
        start, end, parent = self.start, self.end, self.parent
        while rid is not None and rid >= 0:
            if start[rid] <= t0 and end[rid] >= t1:
                stack.append(int(rid))
            rid = int(parent[rid])
        return stack[::-1]


def _forward_ops_by_seq(ranges: pd.DataFrame) -> pd.DataFrame:
    """``pid, seq, range_id``: per (pid, seq), the innermost forward op carrying that sequence number."""
    fwd = ranges[ranges["seq"].notna() & (ranges["fwd_thread_id"].fillna(0) == 0)]
    fwd = fwd[~fwd["name"].str.contains("Backward", regex=False)]
    fwd = fwd.sort_values(["depth"], kind="stable")
    # The deepest op with the seq (the one that created the autograd node, as fwdbwd flows mark it);
    # among equally deep ones the last in the table.
    out = pd.DataFrame({"pid": fwd["pid"].astype("int64").to_numpy(), "seq": fwd["seq"].astype("int64").to_numpy(),
                        "range_id": fwd["range_id"].astype("int64").to_numpy()})
    return out.drop_duplicates(["pid", "seq"], keep="last")


def _name_paths(parent: np.ndarray, names: RangeNames) -> tuple[np.ndarray, list[str]]:
    """For every range (by position), an id of the list of names from its outermost ancestor down to it
    (equal lists, equal ids), and each id's list as JSON text (``json.dumps`` of the list).

    Built level by level: a range's list is its parent's plus its own name, so each distinct list is
    written once however many op instances share it. ``parent``: parent positions (-1: a root).
    """
    name_code = names.codes
    literals = [json.dumps(name) for name in names.distinct]
    # Ids are numbered level by level (path_codes), so a parent's list is written before its children's.
    path = path_codes(parent, name_code, np.arange(len(parent)))
    texts: list[str] = []
    for r in np.unique(path, return_index=True)[1].tolist():  # one range per list, in id order
        prefix = "[" if parent[r] < 0 else texts[path[parent[r]]][:-1] + ", "
        texts.append(prefix + literals[name_code[r]] + "]")
    return path, texts


@dataclass
class OpTable:
    """Path (a) for all kernels at once, as arrays aligned with the kernels table (row ``i``).

    Range references are *positions* in the ranges table (``-1``: none); ``range_ids`` maps them to
    ``range_id``. ``operator_kind``/``reason``/``external_id_check`` are object arrays (None where empty).
    """

    kernel_id: np.ndarray
    innermost: np.ndarray  # innermost range enclosing the launch
    operator: np.ndarray  # range of the operator (dispatcher op, else innermost other cpu_op)
    operator_kind: np.ndarray
    compiled_region: np.ndarray
    forward: np.ndarray  # forward op of the innermost backward node
    layer: np.ndarray  # innermost enclosing range whose ``layer`` is set
    exact: np.ndarray  # every ancestor of ``innermost`` encloses the launch (no overrun child)
    external_id_check: np.ndarray
    # where the check disagrees: the kernel's External id and the name of the op of the launch's
    # process carrying it (None when no range carries it); -1 / None elsewhere
    external_id: np.ndarray
    external_id_op: np.ndarray
    annotation: np.ndarray  # innermost user_annotation that may name the operator (NOT_AN_OPERATOR_ANNOTATION)
    reason: np.ndarray
    range_ids: np.ndarray
    names: RangeNames
    t0: np.ndarray
    t1: np.ndarray
    threads: "_ThreadRanges"
    parent: np.ndarray  # parent position of each range (-1: a root)

    def stack(self, i: int) -> list[int]:
        """Range ids enclosing kernel row ``i``'s launch, outermost first."""
        if self.innermost[i] < 0:
            return []
        return self.threads.ancestors(int(self.range_ids[self.innermost[i]]), int(self.t0[i]), int(self.t1[i]))

    def stack_json(self, i: int, cache: dict) -> str:
        """``stack(i)`` as a JSON list of range names (cached per innermost range when exact)."""
        inner = int(self.innermost[i])
        if inner < 0:
            return "[]"
        if self.exact[i]:
            text = cache.get(inner)
            if text is None:
                text = cache[inner] = json.dumps([self.names[self._pos(r)] for r in self.stack(i)])
            return text
        return json.dumps([self.names[self._pos(r)] for r in self.stack(i)])

    def stack_json_column(self) -> tuple[np.ndarray, list[str]]:
        """:meth:`stack_json` of every kernel row at once: an index into the returned list of JSON texts
        (one per distinct list of names), or -1 for a row whose stack is not its innermost range's whole
        ancestry (not ``exact``: :meth:`stack_json` of that row)."""
        texts = ["[]"]
        at = np.zeros(len(self.innermost), dtype=np.int64)
        inside = self.innermost >= 0
        if inside.any():
            path, named = _name_paths(self.parent, self.names)
            texts += named
            at[inside] = path[self.innermost[inside]] + 1
        at[inside & ~self.exact] = -1
        return at, texts

    def _pos(self, range_id: int) -> int:
        return int(self.threads.position[range_id])


def find_ops(kernels: pd.DataFrame, ranges: pd.DataFrame) -> OpTable:
    """Run path (a) for every kernel, vectorized (one binary search per kernel, one climb per nesting
    level for all kernels at once).

    Args:
        kernels: timeline kernels (kernel_id, pid, launch_tid, launch_start_ns, launch_end_ns,
            correlation_id; optional external_id, and range_id for CPU kernels).
        ranges: timeline ranges (range_id, pid, tid, start_ns, end_ns, parent_id, name, kind, seq,
            fwd_thread_id, layer; optional external_id, forward_range_id).

    The operator is the innermost dispatcher op (``aten::addmm``) of the stack, else the innermost
    ``cpu_op`` (a custom autograd ``Function`` node, Inductor's CPU-side ``triton_*`` event,
    ``CompiledFunction`` around a CUDA graph replay; never the kernel's own range, never above the
    compiled-graph region around it), flagged by ``operator_kind``. A backward kernel's forward op
    comes from the ``fwdbwd`` flow of its innermost autograd node when the trace has flows, else from
    the node's ``Sequence number`` (docs/formats.md#kineto-backward-thread). Where the trace's ``External id``
    is an op id (``external_id_mode == "op_id"``, formats.md#kineto-external-id) it is checked against the stack, never used
    to pick the op; where it disagrees, ``external_id`` and ``external_id_op`` (the op of the launch's
    process carrying that id) say so. ``annotation``: the innermost ``user_annotation`` range
    around the launch (``record_function``, e.g. ``Optimizer.step#FusedAdam.step``) that is not one of
    :data:`NOT_AN_OPERATOR_ANNOTATION` and not outside the kernel's compiled-graph region: the
    operator of last resort (path ``user_annotation``, DESIGN.md §3). Containment is checked at every
    level (an integer-µs child can overrun its parent, so an ancestor may end before the launch).

    Returns:
        :class:`OpTable`. ``reason``: ``null_correlation`` (correlation id missing or <= 0, docs/field-cases.md
        C05), ``no_launch_record`` (the launch is not in the trace window: an orphan, or a dangling
        id), ``no_enclosing_operator`` (no profiler op encloses the launch).
    """
    n = len(kernels)
    m = len(ranges)
    range_ids = ranges["range_id"].astype("int64").to_numpy()
    position = pd.Series(np.arange(m, dtype=np.int64), index=range_ids)
    r_start = ranges["start_ns"].astype("int64").to_numpy()
    r_end = ranges["end_ns"].astype("Int64").fillna(-1).astype("int64").to_numpy()  # never closed: encloses nothing
    parent_ids = ranges["parent_id"].astype("Int64").fillna(-1).astype("int64").to_numpy()
    r_parent = np.where(parent_ids >= 0, position.reindex(parent_ids).fillna(-1).to_numpy(dtype=np.int64), -1)
    name_s = ranges["name"].astype(str)
    names = RangeNames(name_s)
    is_cpu_op = _is_kind(ranges["kind"], "cpu_op")
    is_dispatcher = is_cpu_op & names.test(name_s.dtype, lambda s: s.str.match(DISPATCHER_OP).to_numpy(dtype=bool))
    is_region = names.test(name_s.dtype, lambda s: s.str.startswith(COMPILED_GRAPH_PREFIX).to_numpy(dtype=bool))
    is_annotation = (_is_kind(ranges["kind"], "user_annotation")
                     & ~names.test(name_s.dtype, lambda s: s.str.match(NOT_AN_OPERATOR_ANNOTATION).to_numpy(dtype=bool)))
    is_layer = ranges["layer"].notna().to_numpy() if "layer" in ranges else np.zeros(m, dtype=bool)
    flow_fwd = (position.reindex(ranges["forward_range_id"].astype("Int64").fillna(-1).astype("int64"))
                .fillna(-1).to_numpy(dtype=np.int64) if "forward_range_id" in ranges else np.full(m, -1))
    seq = ranges["seq"].astype("Int64")
    is_bwd_node = (seq.notna() & (ranges["fwd_thread_id"].astype("Int64") == 1).fillna(False)).to_numpy(dtype=bool)
    is_bwd_node |= flow_fwd >= 0
    r_ext = (ranges["external_id"].astype("Int64").fillna(-1).astype("int64").to_numpy()
             if "external_id" in ranges else np.full(m, -1))
    threads = _ThreadRanges(ranges.reset_index(drop=True))

    launch_tid = kernels["launch_tid"].astype("Int64")
    launch_start = kernels["launch_start_ns"].astype("Int64")
    has_launch = (launch_tid.notna() & launch_start.notna()).to_numpy()
    t0 = launch_start.fillna(0).astype("int64").to_numpy()
    t1 = kernels["launch_end_ns"].astype("Int64").fillna(0).astype("int64").to_numpy()
    pids = kernels["pid"].astype("Int64").fillna(-1).astype("int64").to_numpy()
    tids = launch_tid.fillna(-1).astype("int64").to_numpy()
    own = (position.reindex(kernels["range_id"].astype("Int64").fillna(-1).astype("int64")).fillna(-1)
           .to_numpy(dtype=np.int64) if "range_id" in kernels else np.full(n, -1))

    # The last range starting at or before the launch on its thread (pre-order, running-max starts),
    # or the kernel's own range (a CPU kernel is a range itself: a time search could pick a
    # zero-length sibling with the same timestamp).
    candidate = np.full(n, -1, dtype=np.int64)
    searched = has_launch & (own < 0)
    if searched.any() and m:
        keys = pd.DataFrame({"pid": pids[searched], "tid": tids[searched], "row": np.flatnonzero(searched)})
        for (pid, tid), group in keys.groupby(["pid", "tid"], sort=False):
            thread = threads.threads.get((int(pid), int(tid)))
            if thread is None:
                continue
            starts, ids = thread
            rows = group["row"].to_numpy()
            pos = np.searchsorted(starts, t0[rows], side="right") - 1
            ok = pos >= 0
            candidate[rows[ok]] = position.reindex(ids[pos[ok]]).to_numpy(dtype=np.int64)
    candidate = np.where(has_launch & (own >= 0), own, candidate)

    innermost = np.full(n, -1, dtype=np.int64)
    operator = np.full(n, -1, dtype=np.int64)
    fallback = np.full(n, -1, dtype=np.int64)
    region = np.full(n, -1, dtype=np.int64)
    backward_node = np.full(n, -1, dtype=np.int64)
    layer = np.full(n, -1, dtype=np.int64)
    annotation = np.full(n, -1, dtype=np.int64)
    blocked = np.zeros(n, dtype=bool)  # a compiled-graph region lies between the launch and this level
    enclosing_count = np.zeros(n, dtype=np.int64)
    levels = np.zeros(n, dtype=np.int64)
    check_external = external_id_mode(kernels) == "op_id"
    k_ext = (kernels["external_id"].astype("Int64").fillna(-1).astype("int64").to_numpy()
             if "external_id" in kernels else np.full(n, -1))
    ext_agrees = np.zeros(n, dtype=bool)
    cur = candidate.copy()
    active = np.flatnonzero(cur >= 0)
    while len(active):
        r = cur[active]
        enc = (r_start[r] <= t0[active]) & (r_end[r] >= t1[active])
        rows, rr = active[enc], r[enc]
        enclosing_count[rows] += 1
        innermost[rows[innermost[rows] < 0]] = rr[innermost[rows] < 0]
        set_region = is_region[rr] & (region[rows] < 0)
        region[rows[set_region]] = rr[set_region]
        first = operator[rows] < 0
        hit = first & is_dispatcher[rr]
        operator[rows[hit]] = rr[hit]
        blocked[rows[is_region[rr]]] = True
        fb = (fallback[rows] < 0) & is_cpu_op[rr] & (rr != own[rows]) & ~blocked[rows]
        fallback[rows[fb]] = rr[fb]
        ann = (annotation[rows] < 0) & is_annotation[rr] & ~blocked[rows]
        annotation[rows[ann]] = rr[ann]
        bw = (backward_node[rows] < 0) & is_bwd_node[rr]
        backward_node[rows[bw]] = rr[bw]
        lay = (layer[rows] < 0) & is_layer[rr]
        layer[rows[lay]] = rr[lay]
        if check_external:
            ext_agrees[rows] |= (r_ext[rr] == k_ext[rows]) & (k_ext[rows] >= 0)
        levels[active] += 1
        cur[active] = r_parent[r]
        active = active[cur[active] >= 0]
    # exact: every ancestor of the innermost range encloses the launch (the common case)
    depth_of = np.append(ranges["depth"].astype("Int64").fillna(0).astype("int64").to_numpy(), 0)
    exact = (innermost >= 0) & (enclosing_count == depth_of[innermost] + 1)  # -1 reads the appended 0

    kind = np.full(n, None, dtype=object)
    kind[operator >= 0] = "dispatcher_op"
    use_fallback = (operator < 0) & (fallback >= 0)
    operator = np.where(use_fallback, fallback, operator)
    kind[use_fallback] = "cpu_op"

    forward = np.full(n, -1, dtype=np.int64)
    has_node = backward_node >= 0
    if has_node.any():
        node = backward_node[has_node]
        by_flow = flow_fwd[node]
        forward_by_seq = _forward_ops_by_seq(ranges.reset_index(drop=True))
        node_seq = seq.fillna(-1).astype("int64").to_numpy()[node]
        wanted = pd.DataFrame({"pid": pids[has_node], "seq": node_seq})
        found = wanted.merge(forward_by_seq, on=["pid", "seq"], how="left")["range_id"]
        by_seq = position.reindex(found.fillna(-1).astype("int64")).fillna(-1).to_numpy(dtype=np.int64, copy=True)
        by_seq[node_seq < 0] = -1
        forward[has_node] = np.where(by_flow >= 0, by_flow, by_seq)

    reason = np.full(n, None, dtype=object)
    corr = kernels["correlation_id"].astype("Int64")
    null_corr = (corr.isna() | (corr.fillna(0) <= 0)).to_numpy()
    reason[~has_launch & null_corr] = "null_correlation"
    reason[~has_launch & ~null_corr] = "no_launch_record"
    reason[has_launch & (operator < 0)] = "no_enclosing_operator"
    external_check = np.full(n, None, dtype=object)
    disagreeing_id = np.full(n, -1, dtype=np.int64)
    disagreeing_op = np.full(n, None, dtype=object)
    if check_external:
        checked = (k_ext >= 0) & (innermost >= 0)
        external_check[checked & ext_agrees] = "agrees"
        external_check[checked & ~ext_agrees] = "disagrees"
        rows = np.flatnonzero(checked & ~ext_agrees)
        if len(rows):
            disagreeing_id[rows] = k_ext[rows]
            # The op carrying that id in the launch's process (ids are per process); the first if several.
            carriers = pd.DataFrame({"pid": ranges["pid"].astype("int64").to_numpy(), "ext": r_ext,
                                     "name": names.take(np.arange(m))})
            carriers = carriers[carriers["ext"] >= 0].drop_duplicates(["pid", "ext"])
            wanted = pd.DataFrame({"pid": pids[rows], "ext": k_ext[rows]})
            found = wanted.merge(carriers, on=["pid", "ext"], how="left")["name"]
            disagreeing_op[rows] = np.where(found.isna(), None, found.astype(object))
    return OpTable(kernel_id=kernels["kernel_id"].astype("int64").to_numpy(), innermost=innermost,
                   operator=operator, operator_kind=kind, compiled_region=region, forward=forward, layer=layer,
                   exact=exact, external_id_check=external_check, external_id=disagreeing_id,
                   external_id_op=disagreeing_op, annotation=annotation, reason=reason, range_ids=range_ids,
                   names=names, t0=t0, t1=t1, threads=threads, parent=r_parent)


class _LazyStacks(Mapping):
    """kernel_id -> :class:`OpStack`, built on access from an :class:`OpTable`."""

    def __init__(self, table: OpTable):
        self.table = table
        self.row = {int(k): i for i, k in enumerate(table.kernel_id)}

    def __getitem__(self, kernel_id: int) -> OpStack:
        t, i = self.table, self.row[int(kernel_id)]
        rid = lambda pos: None if pos < 0 else int(t.range_ids[pos])  # noqa: E731
        op, fwd = int(t.operator[i]), int(t.forward[i])
        return OpStack(
            stack=t.stack(i), operator=None if op < 0 else t.names[op], operator_range_id=rid(op),
            operator_kind=t.operator_kind[i], external_id_check=t.external_id_check[i],
            forward_operator=None if fwd < 0 else t.names[fwd], forward_range_id=rid(fwd),
            compiled_region=rid(int(t.compiled_region[i])), annotation_range_id=rid(int(t.annotation[i])),
            reason=t.reason[i],
        )

    def __iter__(self):
        return iter(self.row)

    def __len__(self) -> int:
        return len(self.row)


def enclosing_ops(kernels: pd.DataFrame, ranges: pd.DataFrame) -> Mapping[int, OpStack]:
    """Path (a) per kernel as ``kernel_id -> OpStack`` (built lazily from :func:`find_ops`, whose
    docstring gives the rules and reasons)."""
    return _LazyStacks(find_ops(kernels, ranges))
