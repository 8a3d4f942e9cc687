"""Work per kernel: each kernel gets the work of the call that ran it.

* A generated Inductor kernel (the fusion map's ``cpp``/``triton`` call site its attribution names) has the
  work of its own fused nodes and buffers (:mod:`.fused_kernels`).
* Any other kernel belongs to the *outermost* dispatcher op (``aten::linear``, not its ``aten::addmm``)
  around it: on a CPU trace the kernel's own op range and its ancestors, on a GPU trace the op enclosing its
  launch (``operator_range_id``) and its ancestors. That call's work (:mod:`.op_calls`, from its recorded
  shapes) is counted once, on the call's longest kernel whose operator computes (not a copy or view) and is
  not a composite op (aten::linear only decomposes into aten::addmm); the call's other kernels carry 0 with
  ``work_rule`` ``in_call`` (``work_kernels`` says how many kernels share the call). Counting at the
  outermost op never counts a nested op twice and keeps the ideal bytes those of what the user called.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..timeline.model import top_level_ops
from . import flop_rules
from .op_calls import call_work, is_composite

WORK_KERNEL_COLUMNS = ["kernel_id", "flops", "flops_formula", "bytes_read", "bytes_written", "bytes", "work_rule",
                       "dtype", "work_call", "work_kernels", "work_note"]


class _Calls:
    """The op ranges of one timeline: outermost dispatcher op of each range, names, recorded shapes."""

    def __init__(self, ranges: pd.DataFrame, prefix: str, shapes_ranges: pd.DataFrame | None = None):
        ranges = ranges.sort_values("range_id").reset_index(drop=True)
        if len(ranges) and not (ranges["range_id"].to_numpy() == np.arange(len(ranges))).all():
            raise ValueError("ranges.parquet range_id is not 0..n-1: not a timeline reader's table")
        self.top = top_level_ops(ranges)
        self.names = ranges["name"].to_numpy(dtype=object)
        self.notes: dict[int, str] = {}
        if shapes_ranges is not None:
            from .shapes_iteration import shapes_for_measured_calls

            shapes, self.notes = shapes_for_measured_calls(ranges, shapes_ranges)
            self.shapes = shapes.to_numpy(dtype=object)
        else:
            self.shapes = (ranges["input_shapes"].to_numpy(dtype=object) if "input_shapes" in ranges
                           else np.full(len(ranges), None, dtype=object))
        self.prefix = prefix

    def top_of(self, range_id: int) -> int:
        return int(self.top[range_id]) if 0 <= range_id < len(self.top) else -1


def kernel_work(kernels: pd.DataFrame, ranges: pd.DataFrame, fusion_map: pd.DataFrame | None,
                kineto_ranges: pd.DataFrame | None = None, shapes_ranges: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per kernel of ``kernels`` (attribution rows with ``duration_ns``, ``operator_range_id``,
    ``evidence``, plus the timeline's ``range_id`` on CPU traces): :data:`WORK_KERNEL_COLUMNS`.
    ``fusion_map``: with the ``work_*`` columns of :func:`.fused_kernels.with_fused_work`.
    ``kineto_ranges``: with an nsys timeline, the separate torch.profiler run's ranges, which a negative
    ``operator_range_id`` (``-(kineto range id + 1)``, set by the attribution) points into.
    ``shapes_ranges``: the ranges of the capture's shapes iteration, for calls recorded without shapes
    (:mod:`.shapes_iteration`).

    FLOPs and bytes are per kernel execution (one row of the timeline), null where unknown (``work_note``
    says why)."""
    sides = {"": _Calls(ranges, "", shapes_ranges)}
    if kineto_ranges is not None:
        sides["k"] = _Calls(kineto_ranges, "k")
    n = len(kernels)
    fused = _fused_rows(kernels, fusion_map)
    own = (pd.array(kernels["range_id"], dtype="Int64") if "range_id" in kernels
           else pd.array([None] * n, dtype="Int64"))
    op_range = pd.array(kernels["operator_range_id"], dtype="Int64")
    call_of: list[tuple[str, int] | None] = []
    for r_own, r_op in zip(own, op_range):
        r = r_op if pd.isna(r_own) else r_own
        if pd.isna(r):
            call_of.append(None)
            continue
        side, rid = ("k", -int(r) - 1) if r < 0 else ("", int(r))
        top = sides[side].top_of(rid) if side in sides else -1
        call_of.append((side, top) if top >= 0 else None)

    out = {c: [None] * n for c in WORK_KERNEL_COLUMNS}
    out["kernel_id"] = kernels["kernel_id"].to_numpy()
    out["work_kernels"] = [1] * n
    duration = kernels["duration_ns"].to_numpy(dtype=np.int64)
    operators = kernels["operator"].to_numpy(dtype=object) if "operator" in kernels else np.full(n, None)
    computes = np.array([not flop_rules.is_data_only(op) for op in operators], dtype=bool)
    # calls: the longest kernel (see below) that computes (not a copy or view: aten::addmm, not the copy_ of its bias) and is
    # not a composite op carries the call's work. Its own (exclusive) time is where the work ran: aten::mkldnn_rnn_layer, not the
    # aten::add of the biases nested in it (a rule preferring innermost kernels put an LSTM's work on that add).
    # A composite op (aten::linear, aten::matmul: CompositeImplicitAutograd) only decomposes: never the carrier
    # while a kernel of the ops it decomposes into is in the call, however short that one ran.
    # "Longest" is the operator's time in one call (its kernels summed), in the call of the same op where that time
    # is least (over all iterations), not this call's alone: a call's self time can swell with a preemption (a
    # wrapper such as aten::_convolution, 20 us of its own, would then outweigh the 5 ms of the
    # aten::_slow_conv2d_forward it calls, and carry that call's work; a sum over the calls has the same flaw),
    # and every call of one op should put its work on the same operator.
    call_names = [sides[c[0]].names[c[1]] if c is not None else None for c in call_of]
    per_call: dict[tuple, int] = {}
    for i in range(n):
        if call_of[i] is not None:
            key = (call_of[i], operators[i])
            per_call[key] = per_call.get(key, 0) + int(duration[i])
    least: dict[tuple, int] = {}  # (call name, operator) -> its least time in one call
    for (call, operator), ns in per_call.items():
        key = (sides[call[0]].names[call[1]], operator)
        least[key] = min(least.get(key, ns), ns)
    rank = [(bool(computes[i]), not is_composite(operators[i]), least.get((call_names[i], operators[i]), 0),
             duration[i]) for i in range(n)]
    carriers: dict[tuple, int] = {}
    members: dict[tuple, int] = {}
    for i in range(n):
        c = call_of[i]
        if fused[i] is not None or c is None:
            continue
        members[c] = members.get(c, 0) + 1
        j = carriers.get(c)
        if j is None or rank[i] > rank[j]:
            carriers[c] = i
    for i in range(n):
        f = fused[i]
        if f is not None:
            _fill(out, i, f, f"fused:{f.get('graph')}:{f.get('call_index')}", 1, f.get("flops_rule"))
            continue
        c = call_of[i]
        if c is None:
            out["work_note"][i] = "no operator call around the kernel"
            continue
        calls = sides[c[0]]
        name = calls.names[c[1]]
        work = call_work(name, calls.shapes[c[1]], calls.notes.get(c[1]))
        record = {"flops": work.flops, "flops_formula": work.flops_formula, "bytes_read": work.bytes_read,
                  "bytes_written": work.bytes_written, "dtype": work.dtype,
                  "note": f"{name}: {work.note}" if work.note else None}
        key = f"call:{calls.prefix}{c[1]}"
        if carriers[c] == i:
            _fill(out, i, record, key, members[c], work.flops_rule)
        else:
            zero = {k: (0.0 if (k.startswith(("flops", "bytes")) and record[k] is not None) else record[k])
                    for k in record}
            _fill(out, i, zero, key, members[c], "in_call" if work.flops is not None else None)
    frame = pd.DataFrame(out, columns=WORK_KERNEL_COLUMNS)
    for col in ("flops", "flops_formula", "bytes_read", "bytes_written", "bytes"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["work_kernels"] = frame["work_kernels"].astype("int64")
    return frame


def _fill(out: dict, i: int, record: dict, call: str, kernels_in_call: int, rule: str | None) -> None:
    for k in ("flops", "flops_formula", "bytes_read", "bytes_written", "dtype"):
        out[k][i] = record.get(k)
    read, written = record.get("bytes_read"), record.get("bytes_written")
    out["bytes"][i] = None if read is None or written is None or pd.isna(read) or pd.isna(written) else read + written
    out["work_rule"][i] = rule
    out["work_call"][i] = call
    out["work_kernels"][i] = kernels_in_call
    out["work_note"][i] = record.get("note")


def _fused_rows(kernels: pd.DataFrame, fused_work: pd.DataFrame | None) -> list[dict | None]:
    """The fused-kernel work row of each kernel whose attribution names a generated call site, else None."""
    n = len(kernels)
    if fused_work is None or "evidence" not in kernels:
        return [None] * n
    if "work_flops" not in fused_work:
        fused_work = fused_work.assign(work_note="the fusion map has no work columns (built by an older version)")
    by_site = {(r["graph"], int(r["call_index"])): {k.removeprefix("work_"): v for k, v in r.items()}
               for r in fused_work.to_dict("records")}
    out: list[dict | None] = [None] * n
    for i, ev in enumerate(kernels["evidence"].to_numpy(dtype=object)):
        if not isinstance(ev, str) or '"inductor"' not in ev:
            continue
        site = (json.loads(ev).get("inductor") or {})
        if site.get("call_site") and site.get("kind") in ("cpp", "triton"):
            row = by_site.get((site.get("graph"), site.get("call_index")))
            out[i] = row if row is not None else {"note": f"no work computed for {site.get('kernel')}"}
    return out
