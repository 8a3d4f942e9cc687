"""torch.profiler (Kineto Chrome trace) -> the timeline tables of DESIGN.md §3.

Format facts from ``../shared/docs/kineto-and-inductor.md`` §1 (sources: kineto ``output_json.cpp``):
``ts``/``dur`` are µs, relative to ``baseTimeNanoseconds`` since 2024-05 (absolute epoch µs before);
GPU events have ``pid`` = device and ``tid`` = stream; a kernel joins its launch (``cuda_runtime`` or
``cuda_driver``) by ``args.correlation``.

On a CPU-only trace there are no GPU kernels. The *kernels* are then the CPU compute calls: every
Inductor C++ kernel (``graph_<n>_cpp_*``, visible with ``cpp.enable_kernel_profile``) and every
dispatcher operator (``aten::addmm``, ``aten::copy_`` ...) except metadata ops (views, ``empty``,
``resolve_conj`` ...: their time stays with the call that made them). A CPU kernel's ``duration_ns``
is its *self* time: its interval minus the nested compute calls', so ``aten::addmm`` > ``aten::copy_``
gives two kernels (the GEMM's own time and the bias copy) and every nanosecond is counted once,
with the innermost ATen op that did the work as the operator, as for a GPU kernel. ``start_ns``/
``end_ns`` remain the call's interval, ``parent_kernel_id`` the enclosing compute call. A CPU kernel
is its own launch (``launch_*`` = its interval on its thread, ``launch_api`` = ``cpu``); framework
markers (``TorchDynamo Cache Lookup``, ``## Call CompiledFxGraph ##``, autograd wrappers) stay ranges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from .. import tables
from ..naming import ITERATION_PREFIX, LAYER_PREFIX
from .trace_json import KinetoTrace, TimelineError, open_trace

__all__ = ["Timeline", "TimelineError", "load_trace", "read_kineto", "write_timeline"]


@dataclass
class Timeline:
    kernels: pd.DataFrame
    launches: pd.DataFrame
    ranges: pd.DataFrame
    # What the reader repaired or skipped (cases.md C18), one plain sentence each (for diagnostics.json).
    warnings: list[str] = field(default_factory=list)


RANGE_CATEGORIES = {"cpu_op": "cpu_op", "user_annotation": "user_annotation", "python_function": "python_function"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "Runtime"}
KERNEL_CATEGORIES = {"kernel", "Kernel"}
# A dispatcher operator: exactly one "ns::name" (aten::addmm, prims::add, quantized::linear).
# Autograd nodes ("torch::autograd::AccumulateGrad", "autograd::engine::evaluate_function: X")
# do not match: they are wrappers whose work is the operators inside them.
DISPATCHER_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z0-9_.]+$")
INDUCTOR_CPP_KERNEL = re.compile(r"^graph_\d+_cpp_")
# Ops that only create or re-describe tensors (no arithmetic, no copy of data). Inside a compute
# call their time is part of that call's own time, as on a GPU, where they launch no kernel.
METADATA_OPS = frozenset(
    "aten::" + op
    for op in (
        "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "t", "transpose", "permute",
        "expand", "expand_as", "squeeze", "unsqueeze", "select", "slice", "narrow", "split",
        "split_with_sizes", "chunk", "unbind", "detach", "alias", "lift_fresh", "resolve_conj",
        "resolve_neg", "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
        "result_type", "to", "contiguous", "flatten", "unflatten", "view_as", "broadcast_to",
        "_has_compatible_shallow_copy_type", "is_nonzero", "size", "stride", "numel", "dim",
        "is_same_size", "cudnn_is_acceptable", "_nnpack_available", "is_contiguous",
    )
)
_THOUSAND = Decimal(1000)


_FLOAT_FAST_LIMIT = float(2**42)


def _to_ns(value) -> int:
    """µs -> integer ns, no float drift.

    ``value`` as :mod:`.trace_json` gives it: ``int``; ``float`` with ``|value| < 2**43`` (the nearest
    double of a 3-decimal µs value is then within 0.49 ns of it, so exact rounding of ``value*1000``
    is the written ns; below ``2**42`` the float product itself is within 0.5); or ``str``/``Decimal``
    holding the exact decimal text. Rounds half to even beyond ns. Raises ``ArithmeticError`` (or
    ``TypeError``) for non-numbers.
    """
    cls = value.__class__
    if cls is int:
        return value * 1000
    if cls is float:
        if -_FLOAT_FAST_LIMIT < value < _FLOAT_FAST_LIMIT:
            return round(value * 1000)
        if value == value and abs(value) != float("inf"):  # exact: value * 1000, rounded half to even
            num, den = value.as_integer_ratio()
            q, r = divmod(num * 1000, den)
            return q + (2 * r > den or (2 * r == den and q & 1))
    if isinstance(value, int):
        return value * 1000
    return int((Decimal(value) * _THOUSAND).to_integral_value(ROUND_HALF_EVEN))


def load_trace(path: Path) -> KinetoTrace:
    """Open a ``.json`` or ``.json.gz`` Kineto trace for streaming (:mod:`.trace_json`).

    The result gives ``get(key)`` for the top-level metadata, ``events()`` yielding ``(index, event)``
    in file order, ``offset(index)`` (byte offset of the event being processed) and ``warnings``
    (repairs/skips of malformed events, cases.md C18); ``trace["traceEvents"]`` still materialises
    the list for small files.

    Raises:
        TimelineError: unreadable file, invalid JSON, or no ``traceEvents`` list (file + byte offset).
    """
    return open_trace(Path(path))


def _int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _xyz(value) -> str | None:
    if isinstance(value, (list, tuple)):
        return ",".join(str(int(v)) for v in value)
    return None


# CPU and GPU clocks are converted with one offset and the CPU events themselves can be skewed:
# a child op was seen starting 0.3 µs before its parent (cases.md C17). Up to this much, a range
# that starts just before a longer one on the same thread and ends inside it is its child.
NEST_TOLERANCE_NS = 1000


def _tolerate_early_children(ranges: pd.DataFrame, tolerance_ns: int) -> pd.DataFrame:
    """Reorder so that a range starting at most ``tolerance_ns`` after the previous one (while it is
    open) and ending later by more than that comes first: it is the parent whose start was recorded
    late, rather than a child overrunning its parent's end."""
    if len(ranges) < 2:
        return ranges
    starts, ends = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    same_thread = (ranges["pid"].to_numpy()[1:] == ranges["pid"].to_numpy()[:-1]) & (
        ranges["tid"].to_numpy()[1:] == ranges["tid"].to_numpy()[:-1])
    early = starts[1:] - starts[:-1]  # how early the child would have started
    overrun = ends[1:] - ends[:-1]  # how far the other reading (the later one is a child) overruns
    # The reading with the smaller violation wins: integer-µs traces have children overrunning
    # their parent's end by up to 1 µs, which must stay children.
    late_parent = same_thread & (early > 0) & (early <= tolerance_ns) & (overrun > early) & (
        starts[1:] < ends[:-1])
    if not late_parent.any():
        return ranges
    key = starts.copy()
    for i in np.flatnonzero(late_parent) + 1:  # sort the late parent at its child's start
        key[i] = key[i - 1]
    return ranges.assign(_key=key).sort_values(["pid", "tid", "_key", "end_ns", "order"],
                                               ascending=[True, True, True, False, True]).drop(columns="_key")


def _nest(ranges: pd.DataFrame) -> pd.DataFrame:
    """Fill ``depth`` and ``parent_id`` by time nesting per (pid, tid).

    Complete events on one thread nest, up to the timestamp resolution: with the integer-µs
    timestamps of Kineto before 2024 a child can end a microsecond after its parent, or sit as a
    zero-length event exactly at its parent's end. So an event that starts inside the open range on
    top of the stack is its child even if it ends later (self times then subtract only the overlap),
    and a zero-length event at the top's end is still inside it; a positive-length event that starts
    exactly when the top ends is its next sibling.
    """
    ranges = ranges.sort_values(["pid", "tid", "start_ns", "end_ns", "order"], ascending=[True, True, True, False, True])
    ranges = _tolerate_early_children(ranges, NEST_TOLERANCE_NS)
    depth = np.zeros(len(ranges), dtype=np.int64)
    parent = np.full(len(ranges), -1, dtype=np.int64)
    pids, tids = ranges["pid"].to_numpy(), ranges["tid"].to_numpy()
    starts, ends = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    stack: list[int] = []  # positions
    prev_thread = None
    for i in range(len(ranges)):
        thread = (pids[i], tids[i])
        if thread != prev_thread:
            stack.clear()
            prev_thread = thread
        zero_length = ends[i] == starts[i]
        while stack and (ends[stack[-1]] < starts[i] or (ends[stack[-1]] == starts[i] and not zero_length)):
            stack.pop()
        depth[i] = len(stack)
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    ranges = ranges.reset_index(drop=True)
    ranges["range_id"] = np.arange(len(ranges), dtype=np.int64)
    ranges["depth"] = depth
    ranges["parent_id"] = pd.array([p if p >= 0 else None for p in parent], dtype="Int64")
    return ranges


def _cpu_kernels(ranges: pd.DataFrame) -> pd.DataFrame:
    """CPU compute calls with their exclusive (self) time (see module docstring).

    A *compute call* is an Inductor C++ kernel or a dispatcher op that is not a metadata op; a
    metadata op (:data:`METADATA_OPS`) is a compute call only when no compute call encloses it
    (otherwise its time belongs to its parent). ``duration_ns`` is the call's interval minus the
    intervals of the nearest compute calls nested in it, so every CPU nanosecond inside the
    outermost calls is counted exactly once; ``parent_kernel_id`` points to the nearest enclosing
    compute call (resolved to kernel ids by :func:`finish_kernels`).
    """
    names = ranges["name"]
    is_call = ((ranges["kind"] == "cpu_op") & (names.str.match(DISPATCHER_OP) | names.str.match(INDUCTOR_CPP_KERNEL))).to_numpy()
    is_metadata = names.isin(METADATA_OPS).to_numpy()
    parent = ranges["parent_id"].fillna(-1).astype(np.int64).to_numpy()
    starts, ends = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    n = len(ranges)
    kernel = np.zeros(n, dtype=bool)
    enclosing = np.full(n, -1, dtype=np.int64)  # nearest enclosing compute call (position), -1 if none
    nested_time = np.zeros(n, dtype=np.int64)
    # ranges are in pre-order per thread (sorted by start, longer first), so parents come first.
    for i in range(n):
        p = parent[i]
        enclosing[i] = -1 if p < 0 else (p if kernel[p] else enclosing[p])
        kernel[i] = is_call[i] and (not is_metadata[i] or enclosing[i] < 0)
        if kernel[i] and enclosing[i] >= 0:  # only the overlap: a child may overrun its parent (see _nest)
            nested_time[enclosing[i]] += min(ends[i], ends[enclosing[i]]) - starts[i]
    chosen = np.flatnonzero(kernel)
    rows = ranges.iloc[chosen]
    return pd.DataFrame(
        {
            "pid": rows["pid"].to_numpy(),
            "device": -1,
            "stream": -1,
            "name": rows["name"].to_numpy(),
            "mangled_name": None,
            "start_ns": rows["start_ns"].to_numpy(),
            "end_ns": rows["end_ns"].to_numpy(),
            "duration_ns": np.maximum(ends[chosen] - starts[chosen] - nested_time[chosen], 0).astype(np.int64),
            "correlation_id": pd.array([None] * len(rows), dtype="Int64"),
            "launch_tid": rows["tid"].to_numpy(),
            "launch_start_ns": rows["start_ns"].to_numpy(),
            "launch_end_ns": rows["end_ns"].to_numpy(),
            "launch_api": "cpu",
            "grid": None,
            "block": None,
            "graph_id": pd.array([None] * len(rows), dtype="Int64"),
            "graph_node_id": pd.array([None] * len(rows), dtype="Int64"),
            "range_id": rows["range_id"].to_numpy(),
            # range_id is the position in ``ranges`` (set by _nest), so positions are range ids.
            "parent_range_id": enclosing[chosen],
        }
    )


def _gpu_kernels(rows: list[dict], launches: pd.DataFrame) -> pd.DataFrame:
    kernels = pd.DataFrame(rows)
    # Ids <= 0 mean "no correlation" (communication kernels, cases.md C05): never a join key.
    keyed = launches[launches["correlation_id"].fillna(0).astype("int64") > 0]
    by_corr = keyed.drop_duplicates("correlation_id", keep=False).set_index("correlation_id")
    corr = kernels["correlation_id"]
    hit = corr.isin(by_corr.index)
    for col, src in (("launch_pid", "pid"), ("launch_tid", "tid"), ("launch_start_ns", "start_ns"), ("launch_end_ns", "end_ns"), ("launch_api", "api")):
        values = corr.where(hit).map(by_corr[src]) if len(by_corr) else pd.Series([None] * len(kernels))
        kernels[col] = values
    # Kineto writes the device index as a GPU event's pid; the process is the launch's.
    kernels["pid"] = kernels.pop("launch_pid").fillna(kernels["pid"])
    for col in ("pid", "launch_tid", "launch_start_ns", "launch_end_ns", "correlation_id", "graph_id", "graph_node_id"):
        kernels[col] = pd.array(kernels[col], dtype="Int64")
    kernels["launch_api"] = kernels["launch_api"].astype(object).where(kernels["launch_api"].notna(), None)
    return kernels


def read_kineto(path: Path) -> Timeline:
    """Read a torch.profiler Chrome trace (GPU or CPU-only) into the timeline tables.

    Returns:
        ``Timeline(kernels, launches, ranges)`` with the columns of :mod:`operator_profiler.tables`
        (KERNELS, LAUNCHES, RANGES); times in integer ns on the trace's clock
        (``baseTimeNanoseconds + ts``).

    Raises:
        TimelineError: the file is not a Kineto trace, is truncated or malformed beyond one event
            (:mod:`.trace_json`), or an event lacks ``ts``/``dur`` (named with its index in
            ``traceEvents`` and its byte offset). Malformed events that could be confined are
            repaired or skipped and reported in ``Timeline.warnings`` instead.
    """
    path = Path(path)
    trace = load_trace(path)
    base = int(trace.get("baseTimeNanoseconds") or 0)
    range_rows: list[dict] = []
    launch_rows: list[dict] = []
    kernel_rows: list[dict] = []
    for index, ev in trace.events():
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        if cat not in RANGE_CATEGORIES and cat not in LAUNCH_CATEGORIES and cat not in KERNEL_CATEGORIES:
            continue
        try:
            start = base + _to_ns(ev["ts"])
            end = start + _to_ns(ev["dur"])
        except (KeyError, TypeError, ArithmeticError):
            raise TimelineError(
                f"{path}: traceEvents[{index}] at byte offset {trace.offset(index)} ({ev.get('name')!r}, cat {cat!r}) "
                "has no valid ts/dur; "
                "the trace is truncated or not written by torch.profiler"
            ) from None
        args = ev.get("args") or {}
        pid, tid = _int_or_none(ev.get("pid")), _int_or_none(ev.get("tid"))
        if cat in RANGE_CATEGORIES:
            if pid is None or tid is None:
                continue
            range_rows.append(
                {
                    "pid": pid, "tid": tid, "start_ns": start, "end_ns": end, "name": str(ev.get("name", "")),
                    "kind": RANGE_CATEGORIES[cat], "seq": _int_or_none(args.get("Sequence number")),
                    "fwd_thread_id": _int_or_none(args.get("Fwd thread id")), "order": index,
                }
            )
        elif cat in LAUNCH_CATEGORIES:
            launch_rows.append(
                {
                    "pid": pid, "tid": tid, "start_ns": start, "end_ns": end, "api": str(ev.get("name", "")),
                    "correlation_id": _int_or_none(args.get("correlation")),
                }
            )
        else:
            kernel_rows.append(
                {
                    "pid": pid, "device": _int_or_none(args.get("device", ev.get("pid"))),
                    "stream": _int_or_none(args.get("stream", ev.get("tid"))), "name": str(ev.get("name", "")),
                    "mangled_name": None, "start_ns": start, "end_ns": end,
                    "correlation_id": _int_or_none(args.get("correlation")),
                    "grid": _xyz(args.get("grid")), "block": _xyz(args.get("block")),
                    "graph_id": _int_or_none(args.get("graph id")),
                    "graph_node_id": _int_or_none(args.get("graph node id")),
                }
            )

    ranges = pd.DataFrame(range_rows, columns=["pid", "tid", "start_ns", "end_ns", "name", "kind", "seq", "fwd_thread_id", "order"])
    ranges["seq"] = pd.array(ranges["seq"], dtype="Int64")
    ranges["fwd_thread_id"] = pd.array(ranges["fwd_thread_id"], dtype="Int64")
    ranges = _nest(ranges)
    ranges["end_tid"] = pd.array([None] * len(ranges), dtype="Int64")
    ranges["domain"] = "torch.profiler"
    layer = ranges["name"].str.removeprefix(LAYER_PREFIX)
    ranges["layer"] = layer.where(ranges["name"].str.startswith(LAYER_PREFIX), None)
    iteration = ranges["name"].str.removeprefix(ITERATION_PREFIX)
    is_iteration = ranges["name"].str.startswith(ITERATION_PREFIX) & iteration.str.isdigit()
    ranges["iteration"] = pd.array(
        [int(v) if ok else None for v, ok in zip(iteration, is_iteration)], dtype="Int64"
    )

    launches = pd.DataFrame(launch_rows, columns=["pid", "tid", "start_ns", "end_ns", "api", "correlation_id"])
    launches = launches.sort_values("start_ns", kind="stable").reset_index(drop=True)
    launches["launch_id"] = np.arange(len(launches), dtype=np.int64)
    launches["correlation_id"] = pd.array(launches["correlation_id"], dtype="Int64")

    kernels = _gpu_kernels(kernel_rows, launches) if kernel_rows else _cpu_kernels(ranges)
    kernels = finish_kernels(kernels, ranges, source="kineto")
    return Timeline(kernels=kernels, launches=launches, ranges=ranges.drop(columns="order"), warnings=list(trace.warnings))


def finish_kernels(kernels: pd.DataFrame, ranges: pd.DataFrame, source: str) -> pd.DataFrame:
    """Order kernels by launch, number them, and add duration, match_key, occurrence, iteration."""
    order_key = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64")
    kernels = kernels.assign(_order=order_key).sort_values(["_order", "start_ns"], kind="stable")
    kernels = kernels.drop(columns="_order").reset_index(drop=True)
    kernels["kernel_id"] = np.arange(len(kernels), dtype=np.int64)
    if "duration_ns" not in kernels:  # GPU kernels: the execution interval
        kernels["duration_ns"] = (kernels["end_ns"] - kernels["start_ns"]).astype("int64")
    if "range_id" in kernels:  # CPU kernels: nearest enclosing CPU kernel, by its range
        kernel_of_range = dict(zip(kernels["range_id"], kernels["kernel_id"]))
        kernels["parent_kernel_id"] = pd.array(
            [kernel_of_range.get(r) if r >= 0 else None for r in kernels.pop("parent_range_id")], dtype="Int64"
        )
        kernels["range_id"] = pd.array(kernels["range_id"], dtype="Int64")
    else:
        kernels["range_id"] = pd.array([None] * len(kernels), dtype="Int64")
        kernels["parent_kernel_id"] = pd.array([None] * len(kernels), dtype="Int64")
    kernels["match_key"] = kernels["mangled_name"].fillna(kernels["name"])
    # Per process: correlation ids and launch order are per process (a multi-rank capture, cases.md C22).
    kernels["occurrence"] = kernels.groupby(["pid", "match_key"]).cumcount().astype("int64")
    kernels["source"] = source
    kernels["iteration"] = kernel_iterations(kernels, ranges)
    return kernels


def kernel_iterations(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.arrays.IntegerArray:
    """The measured iteration of each kernel: the iteration range open at its launch call (its start
    when the launch is unknown)."""
    launch = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64").to_numpy()
    return iteration_at(kernels["pid"].to_numpy(), launch, ranges)


def iteration_at(pids: np.ndarray, times: np.ndarray, ranges: pd.DataFrame) -> pd.arrays.IntegerArray:
    """Index of the iteration range of the same process (any thread) open at each time (ns), null if
    none. Iteration ranges of one process do not overlap; those of several processes (ranks) may, so
    each process is searched on its own. A range never closed (nsys) ends at ``effective_end_ns``."""
    its = ranges[ranges["iteration"].notna()]
    result = np.full(len(times), -1, dtype=np.int64)
    if not its.empty and len(times):
        end_col = "effective_end_ns" if "effective_end_ns" in its else "end_ns"
        t = np.asarray(times, dtype=np.int64)
        pids = np.asarray(pids, dtype=np.int64)
        for pid, mine in its.groupby("pid"):
            mine = mine.sort_values("start_ns")
            q = np.flatnonzero(pids == int(pid))
            starts = mine["start_ns"].to_numpy(dtype=np.int64)
            ends = mine[end_col].astype("Int64").fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)
            pos = np.searchsorted(starts, t[q], side="right") - 1
            cand = np.maximum(pos, 0)
            inside = (pos >= 0) & (t[q] < ends[cand])
            result[q[inside]] = mine["iteration"].to_numpy(dtype=np.int64)[cand[inside]]
    return pd.arrays.IntegerArray(np.maximum(result, 0), result < 0)


def write_timeline(timeline: Timeline, out_dir: Path) -> None:
    """Write ``kernels.parquet``, ``launches.parquet``, ``ranges.parquet`` into ``out_dir``."""
    out_dir = Path(out_dir)
    tables.write_table(timeline.kernels, tables.KERNELS, out_dir / "kernels.parquet")
    tables.write_table(timeline.launches, tables.LAUNCHES, out_dir / "launches.parquet")
    tables.write_table(timeline.ranges, tables.RANGES, out_dir / "ranges.parquet")
