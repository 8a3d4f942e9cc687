"""Path (a): kernel -> launch call -> the profiler ops enclosing the launch on its thread.

For GPU Kineto traces the kernel's launch is found by CUPTI correlation id (done by the timeline
reader, which fills ``launch_tid``/``launch_start_ns``/``launch_end_ns``); on a CPU trace a kernel is its
own launch. The operator is the innermost dispatcher op (``aten::...``) of the stack of ``cpu_op``
ranges that enclose the launch interval on the launch thread (``../shared/docs/kineto-and-inductor.md``
§1.6, recommended algorithm). Backward kernels get ``forward_operator`` through the Kineto
``Sequence number`` of their autograd node (§1.7).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..timeline.kineto import DISPATCHER_OP, external_id_mode

COMPILED_GRAPH_PREFIX = "## Call CompiledFxGraph"


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
    forward_operator: str | None = None
    forward_range_id: int | None = None
    compiled_region: int | None = None  # range id of the enclosing "## Call CompiledFxGraph" range
    reason: str | None = None


class _ThreadRanges:
    """The ranges of each (pid, tid) in pre-order, for "which ranges enclose [t0, t1]" queries.

    Complete events on one thread nest (the timeline reader's ``parent_id`` guarantees that a parent
    contains its child), so the innermost range enclosing ``t0`` is an ancestor-or-self of the last
    range starting at or before ``t0``: a binary search and a walk up the parents answer the query
    in O(log n + depth), without building interval trees.
    """

    def __init__(self, ranges: pd.DataFrame):
        closed = ranges[ranges["end_ns"].notna()]
        ids = closed["range_id"].astype("int64").tolist()
        self.start = dict(zip(ids, closed["start_ns"].astype("int64").tolist()))
        self.end = dict(zip(ids, closed["end_ns"].astype("int64").tolist()))
        parents = closed["parent_id"].astype("Int64").fillna(-1).astype("int64").tolist()
        self.parent = {r: (p if p >= 0 else None) for r, p in zip(ids, parents)}
        self.threads: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # Pre-order (the timeline reader numbers ranges parents-first). A child recorded as starting
        # slightly before its parent (clock skew, cases.md C17) is searched at its parent's start:
        # the running maximum keeps the search keys sorted and the child after its parent.
        ordered = closed.sort_values(["pid", "tid", "range_id"], kind="stable")
        for (pid, tid), group in ordered.groupby(["pid", "tid"], sort=False):
            self.threads[(int(pid), int(tid))] = (
                np.maximum.accumulate(group["start_ns"].to_numpy(dtype=np.int64)),
                group["range_id"].to_numpy(dtype=np.int64),
            )

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
        while rid is not None:
            if self.start[rid] <= t0 and self.end[rid] >= t1:
                stack.append(rid)
            rid = self.parent.get(rid)
        return stack[::-1]


def _forward_ops_by_seq(ranges: pd.DataFrame) -> dict[tuple[int, int], int]:
    """(pid, seq) -> range id of the innermost forward op carrying that sequence number."""
    fwd = ranges[ranges["seq"].notna() & (ranges["fwd_thread_id"].fillna(0) == 0)]
    fwd = fwd[~fwd["name"].str.contains("Backward", regex=False)]
    fwd = fwd.sort_values(["depth"], kind="stable")
    # Last write wins: the deepest op with the seq (the one that created the autograd node,
    # as fwdbwd flows mark it).
    return {(int(p), int(s)): int(r) for p, s, r in zip(fwd["pid"], fwd["seq"], fwd["range_id"])}


def enclosing_ops(kernels: pd.DataFrame, ranges: pd.DataFrame) -> dict[int, OpStack]:
    """Run path (a) for every kernel.

    Args:
        kernels: timeline kernels (needs pid, launch_tid, launch_start_ns, launch_end_ns).
        ranges: timeline ranges (range_id, pid, tid, start_ns, end_ns, name, kind, depth, seq,
            fwd_thread_id).

    The operator is the innermost dispatcher op (``aten::addmm``) of the stack, else the innermost
    ``cpu_op`` (a custom autograd ``Function`` node, Inductor's CPU-side ``triton_*`` event,
    ``CompiledFunction`` around a CUDA graph replay), flagged by ``operator_kind``. A backward
    kernel's ``forward_operator`` comes from the ``fwdbwd`` flow of its autograd node when the
    trace has flows, else from the node's ``Sequence number`` (kineto-and-inductor.md §1.7). Where
    the trace's ``External id`` is an op id (``external_id_mode == "op_id"``, §1.6) it is checked
    against the stack, never used to pick the op.

    Returns:
        kernel_id -> :class:`OpStack`. ``reason``: ``null_correlation`` (correlation id missing or
        <= 0, cases.md C05), ``no_launch_record`` (the launch is not in the trace window: an orphan,
        or a dangling id), ``no_enclosing_operator`` (no profiler op encloses the launch).
    """
    check_external = external_id_mode(kernels) == "op_id"
    range_external = ranges.set_index("range_id")["external_id"].to_dict() if "external_id" in ranges else {}
    flow_forward = (ranges.set_index("range_id")["forward_range_id"].dropna().astype("int64").to_dict()
                    if "forward_range_id" in ranges else {})
    # Plain dicts built from lists: per-element access to Arrow-backed columns is slow.
    range_ids = ranges["range_id"].astype("int64").tolist()
    names = dict(zip(range_ids, ranges["name"].astype(str).tolist()))
    kinds = dict(zip(range_ids, ranges["kind"].astype(str).tolist()))
    seqs = dict(zip(range_ids, ranges["seq"].astype("Int64").astype(object).where(ranges["seq"].notna(), None)))
    fwd_tid = dict(zip(range_ids, ranges["fwd_thread_id"].astype("Int64").fillna(-1).astype("int64").tolist()))
    threads = _ThreadRanges(ranges.reset_index(drop=True))
    forward_by_seq = _forward_ops_by_seq(ranges.reset_index(drop=True))

    own_range = kernels["range_id"] if "range_id" in kernels else None
    own_range_of = dict(zip(kernels["kernel_id"].astype(int), own_range)) if own_range is not None else {}
    result: dict[int, OpStack] = {}
    wanted = [c for c in ("kernel_id", "pid", "launch_tid", "launch_start_ns", "launch_end_ns", "correlation_id",
                          "external_id") if c in kernels]
    for k in kernels[wanted].itertuples(index=False):
        found = OpStack()
        result[int(k.kernel_id)] = found
        if pd.isna(k.launch_tid) or pd.isna(k.launch_start_ns):
            corr = k.correlation_id
            found.reason = "null_correlation" if pd.isna(corr) or int(corr) <= 0 else "no_launch_record"
            continue
        t0, t1 = int(k.launch_start_ns), int(k.launch_end_ns)
        own = own_range_of.get(int(k.kernel_id)) if own_range is not None else None
        own = None if own is None or pd.isna(own) else int(own)
        if own is not None:
            # A CPU kernel is a range itself: start from it, not from a time search, which could
            # pick a zero-length sibling with the same timestamp.
            hits = threads.ancestors(own, t0, t1)
        else:
            hits = threads.enclosing(int(k.pid), int(k.launch_tid), t0, t1)
        found.stack = hits
        for rid in reversed(hits):
            if kinds[rid] == "cpu_op" and DISPATCHER_OP.match(names[rid]):
                found.operator, found.operator_range_id, found.operator_kind = names[rid], rid, "dispatcher_op"
                break
        else:
            # Not the kernel's own range (a CPU kernel naming itself says nothing) and not outside
            # the compiled-graph region around it (CompiledFunction names no operator).
            for rid in reversed(hits):
                if names[rid].startswith(COMPILED_GRAPH_PREFIX):
                    break
                if kinds[rid] == "cpu_op" and rid != own:
                    found.operator, found.operator_range_id, found.operator_kind = names[rid], rid, "cpu_op"
                    break
        ext = getattr(k, "external_id", None)
        if check_external and ext is not None and not pd.isna(ext) and hits:
            found.external_id_check = (
                "agrees" if any(range_external.get(r) == int(ext) for r in hits) else "disagrees")
        for rid in reversed(hits):
            if names[rid].startswith(COMPILED_GRAPH_PREFIX):
                found.compiled_region = rid
                break
        for rid in reversed(hits):  # innermost autograd node of a backward pass
            if rid in flow_forward:
                fwd = flow_forward[rid]
                found.forward_operator, found.forward_range_id = names[fwd], fwd
                break
            if seqs[rid] is not None and fwd_tid[rid] == 1:
                fwd = forward_by_seq.get((int(k.pid), int(seqs[rid])))
                if fwd is not None:
                    found.forward_operator, found.forward_range_id = names[fwd], fwd
                break
        if found.operator is None:
            found.reason = "no_enclosing_operator"
    return result
