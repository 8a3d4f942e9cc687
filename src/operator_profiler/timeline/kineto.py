"""torch.profiler (Kineto Chrome trace) -> the timeline tables (docs/DESIGN.md §3): kernels joined to their
launch by correlation id, CPU ops and our ranges nested per thread, CPU runs' compute ops as kernels.
Details: docs/modules.md#timeline-kineto."""

from __future__ import annotations

import json
import re
from array import array
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Annotated, Any, ClassVar, Union

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa

from ..heap import release_free_memory, bulk_memory
from ..naming import ITERATION_PREFIX, LAYER_PREFIX
from ..progress import Ticker
from .model import (ACTIVITY_COLUMNS, DISPATCHER_OP, METADATA_OPS, Timeline, exact_repeats, external_id_mode,
                    finish_kernels, write_timeline)
from .trace_json import EXACT_TS_LIMIT, KinetoTrace, TimelineError, open_trace

__all__ = ["Timeline", "TimelineError", "load_trace", "read_kineto", "write_timeline"]


RANGE_CATEGORIES = {"cpu_op": "cpu_op", "user_annotation": "user_annotation", "python_function": "python_function"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "Runtime"}
KERNEL_CATEGORIES = {"kernel", "Kernel"}
#: The record function Inductor wraps each generated C++ kernel call in (``cpp.enable_kernel_profile``):
#: ``graph_<n>_cpp_fused_*``, and with max_autotune a GEMM template's ``graph_<n>_gemm_*_kernel``.
INDUCTOR_KERNEL_RECORD = re.compile(r"^graph_\d+_\w+$")
#: Chrome-trace event kinds the reader leaves aside without a word (Trace Event Format): flows (s, t, f), instants
#: (i, I), counters (C), metadata (M), async (b, n, e), samples (P), objects (N, O, D), marks (R), clock syncs (c),
#: memory dumps (V, v), contexts ( and ). Any other 'ph' (begin/end pairs 'B'/'E', a missing or unknown one) is
#: counted and warned: an op or kernel written so would be missing without a word.
SET_ASIDE_PH = frozenset({"s", "t", "f", "i", "I", "C", "M", "b", "n", "e", "P", "N", "O", "D", "R", "c", "V", "v",
                          "(", ")"})
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
    (repairs/skips of malformed events, docs/field-cases.md C18); ``trace["traceEvents"]`` still materialises
    the list for small files.

    Raises:
        TimelineError: unreadable file, invalid JSON, or no ``traceEvents`` list (file + byte offset).
    """
    return open_trace(Path(path))


NULL_INT = -(2**63)  # "no value" in the array('q') columns of read_kineto
_I64 = 2**63


def _int_or_null(value) -> int:
    """An int for an int64 column: ``value`` as int, :data:`NULL_INT` when missing or not a number
    (or beyond int64, which no field read into these columns holds)."""
    if value.__class__ is int and -(2**63) < value < 2**63:
        return value
    if value is None:
        return NULL_INT
    try:
        value = int(value)
    except (TypeError, ValueError, OverflowError):
        return NULL_INT
    return value if -(2**63) < value < 2**63 else NULL_INT


class _IntColumn:
    """An int64 column (:data:`NULL_INT` for null) collected chunk by chunk: one value at a time (``append``,
    the dict loop) or a chunk's array (``add``, the typed path), joined once by :meth:`values`. No buffer grows
    by reallocation: a realloc'd array of hundreds of MB leaves that much of the heap unusable afterwards."""

    def __init__(self):
        self.parts: list[np.ndarray] = []
        self.pending = array("q")
        self.append = self.pending.append

    def add(self, values: np.ndarray) -> None:
        self.flush()
        self.parts.append(values.astype(np.int64, copy=False))

    def flush(self) -> None:
        if len(self.pending):
            self.parts.append(np.frombuffer(self.pending, dtype=np.int64).copy())
            self.pending = array("q")
            self.append = self.pending.append

    def values(self) -> np.ndarray:
        self.flush()
        joined = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.int64)
        self.parts = [joined]
        return joined


def _ints(values: _IntColumn) -> np.ndarray:
    return values.values()


def _nullable(values: _IntColumn) -> pd.arrays.IntegerArray:
    data = values.values()
    return pd.arrays.IntegerArray(data, data == NULL_INT)


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
# a child op was seen starting 0.3 µs before its parent (docs/field-cases.md C17). Up to this much, a range
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
    exactly when the top ends is its next sibling. The rows come back in nesting order (pid, tid,
    start, end descending, ``order``; a late-recorded parent before its child, see
    :func:`_tolerate_early_children`) with ``range_id`` their position and ``parent_id`` the parent's.
    """
    ranges = ranges.sort_values(["pid", "tid", "start_ns", "end_ns", "order"], ascending=[True, True, True, False, True])
    ranges = _tolerate_early_children(ranges, NEST_TOLERANCE_NS)
    pids, tids = ranges["pid"].to_numpy(), ranges["tid"].to_numpy()
    new_thread = np.ones(len(ranges), dtype=bool)
    new_thread[1:] = (pids[1:] != pids[:-1]) | (tids[1:] != tids[:-1])
    depth, parent = _stack_nesting(new_thread, ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy())
    ranges = ranges.reset_index(drop=True)
    ranges["range_id"] = np.arange(len(ranges), dtype=np.int64)
    ranges["depth"] = depth
    ranges["parent_id"] = pd.arrays.IntegerArray(np.maximum(parent, 0), parent < 0)
    return ranges


def _stack_nesting_loop(new_thread: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_stack_nesting` as the explicit stack it stands for, one range at a time (the reference, and the
    reading of ranges that end before they start)."""
    # One pass over Python lists (numpy scalar access would dominate the loop); the stack holds positions
    # and, beside them, their ends.
    starts, ends = np.asarray(starts).tolist(), np.asarray(ends).tolist()
    depth, parent = [0] * len(starts), [-1] * len(starts)
    stack: list[int] = []
    stack_ends: list[int] = []
    for i, (new, start, end) in enumerate(zip(np.asarray(new_thread).tolist(), starts, ends)):
        if new:
            stack.clear()
            stack_ends.clear()
        zero_length = end == start
        while stack_ends and (stack_ends[-1] < start or (stack_ends[-1] == start and not zero_length)):
            stack.pop()
            stack_ends.pop()
        if stack:
            depth[i] = len(stack)
            parent[i] = stack[-1]
        stack.append(i)
        stack_ends.append(end)
    return np.array(depth, dtype=np.int64), np.array(parent, dtype=np.int64)


def _stack_nesting(new_thread: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(depth, parent position or -1) of ranges in nesting order (``new_thread`` True where a thread's rows begin;
    ``starts``/``ends`` int64 ns), as an explicit stack per thread gives them: each range pops the ranges on top
    of the stack that it closes, then is the child of the top and is pushed; a range closes one that ends before
    it starts, or exactly at its start unless it is zero-length (see :func:`_nest`).

    Computed for all ranges at once: the stack left for range i is its parent chain, and a range popped before i
    ends before the range that popped it closes (``t = start + (end != start) <= end``), so the parent of i is the
    last earlier range of its thread with ``end >= t_i``. Found by pointer jumping (a candidate that i closes is
    replaced by its own candidate: the ranges between the two end before the candidate's t, so before i's),
    after the ranges that end after every earlier one are settled at once; a depth is the length of the parent
    chain (list ranking). Ranges that end before they start break ``t <= end``: then the loop itself
    (:func:`_stack_nesting_loop`) reads them."""
    start, end = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    n = len(start)
    if not n or (end < start).any():
        return _stack_nesting_loop(new_thread, start, end)
    new_thread = np.asarray(new_thread, dtype=bool)
    closes = start + (end != start)  # t: a range closes those ending before it (<= end: no overflow)
    cand = np.arange(-1, n - 1, dtype=np.int64)
    cand[new_thread] = -1
    thread_no = np.cumsum(new_thread, dtype=np.int64) - 1
    lo = int(start.min())
    span = int(end.max()) - lo + 1  # (Python ints: the int64 difference can overflow)
    if int(thread_no[-1]) + 1 <= np.iinfo(np.int64).max // span:
        # A range that closes every earlier one of its thread has no parent (a thread's top-level ranges):
        # (thread, time) packed in one int64, compared with the largest end before it.
        offset = thread_no * span
        end_key = (end - lo) + offset
        before = np.empty(n, dtype=np.int64)
        before[0] = -1
        np.maximum.accumulate(end_key[:-1], out=before[1:])
        cand[before < (closes - lo) + offset] = -1
        del offset, end_key, before
    todo = np.flatnonzero(cand >= 0)
    while len(todo):
        todo = todo[end[cand[todo]] < closes[todo]]
        cand[todo] = cand[cand[todo]]
        todo = todo[cand[todo] >= 0]
    depth = (cand >= 0).astype(np.int64)
    ancestor = cand.copy()
    live = np.flatnonzero(ancestor >= 0)
    while len(live):
        up = ancestor[live]
        depth[live] += depth[up]
        ancestor[live] = ancestor[up]
        live = live[ancestor[live] >= 0]
    return depth, cand


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
    is_call = ((ranges["kind"] == "cpu_op") & (names.str.match(DISPATCHER_OP) | names.str.match(INDUCTOR_KERNEL_RECORD))).to_numpy()
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
            "external_id": pd.array(rows["external_id"], dtype="Int64"),
            "valid_time": True,
        }
    )


def _gpu_kernels(kernels: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """GPU kernel records (the columns read_kineto builds from ``kernel`` events) joined to their launch
    by correlation id."""
    kernels = _join_launches(kernels, launches)
    # An invalid kernel record (docs/field-cases.md C04) is placed at its launch's end: zero length, never at epoch 0.
    invalid = ~kernels["valid_time"].to_numpy(dtype=bool)
    if invalid.any():
        at = kernels.loc[invalid, "launch_end_ns"].fillna(kernels.loc[invalid, "start_ns"]).astype("int64")
        kernels.loc[invalid, "start_ns"] = at
        kernels.loc[invalid, "end_ns"] = at
    return kernels


def _join_launches(kernels: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """GPU records (kernels, memcpy/memset) with ``launch_tid/launch_start_ns/launch_end_ns/launch_api``
    of the launch call carrying their correlation id, and ``pid`` the launch's process."""
    # Ids <= 0 mean "no correlation" (communication kernels, docs/field-cases.md C05): never a join key; an id
    # that two launches carry (merged processes) is ambiguous: no join either.
    # Only the columns used are read (no copy of the launch table: it has millions of rows).
    launch_corr = launches["correlation_id"].astype("Int64").fillna(0).to_numpy(dtype=np.int64)
    keyed = np.flatnonzero(launch_corr > 0)
    keyed = keyed[~pd.Series(launch_corr[keyed]).duplicated(keep=False).to_numpy()]
    index = pd.Index(launch_corr[keyed])
    corr = kernels["correlation_id"].astype("Int64")
    rows = index.get_indexer(corr.fillna(0).astype("int64")) if len(index) else np.full(len(kernels), -1)
    hit = rows >= 0
    source = np.where(hit, keyed[np.maximum(rows, 0)] if len(index) else 0, 0)  # a launch row
    for col, src in (("launch_pid", "pid"), ("launch_tid", "tid"), ("launch_start_ns", "start_ns"),
                     ("launch_end_ns", "end_ns")):
        values = launches[src].astype("Int64")
        data = values.to_numpy(dtype=np.int64, na_value=0)[source] if len(launches) else source
        missing = values.isna().to_numpy()[source] if len(launches) else True
        kernels[col] = pd.arrays.IntegerArray(np.asarray(data, dtype=np.int64), ~hit | missing)
    kernels["launch_api"] = launches["api"].array.take(np.where(hit, source, -1), allow_fill=True) \
        if len(launches) else pd.array([None] * len(kernels), dtype="str")
    # Kineto writes the device index as a GPU event's pid; the process is the launch's. A record without its
    # launch (an orphan: launched before the profiler started) belongs to the trace's process when the trace
    # has one (torch.profiler writes one file per process), so it is never taken for a process of its own.
    processes = launches["pid"].dropna().unique()
    fallback = pd.Series(int(processes[0]), index=kernels.index, dtype="Int64") if len(processes) == 1 \
        else kernels["pid"]
    kernels["pid"] = kernels.pop("launch_pid").fillna(fallback)
    return kernels


# Launch calls that start GPU work expected to appear as a kernel record (docs/field-cases.md C04, C06: any
# runtime/driver call carrying the kernel's correlation id joins; this list only decides which
# calls *without* a kernel record are worth a warning).
KERNEL_LAUNCH_API = re.compile(r"LaunchKernel|LaunchCooperativeKernel|GraphLaunch")
MEMORY_CATEGORIES = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
# X events read a column at a time from typed chunks: 1 range, 2 launch, 3 kernel
BULK_KIND = {**dict.fromkeys(RANGE_CATEGORIES, 1), **dict.fromkeys(LAUNCH_CATEGORIES, 2),
             **dict.fromkeys(KERNEL_CATEGORIES, 3)}
# and, read one at a time: 4 memcpy/memset (X events), 5 fwdbwd flow starts and ends (s, f)
_MEMORY, _FWDBWD = 4, 5
CHUNK_KIND = {**BULK_KIND, **dict.fromkeys(MEMORY_CATEGORIES, _MEMORY), "fwdbwd": _FWDBWD}


# The fields read_kineto reads, as msgspec structs: a chunk of events that fits them is decoded without
# building the rest of each event (args of a GPU event hold a dozen more; every key is skipped in C).
# Each event is decoded by its ``ph`` (a tagged union; Kineto writes ``ph`` first): complete events (``X``) into
# :class:`_Event` with the args the tables take, flow starts and ends (``s``, ``f``) into :class:`_Flow` (what a
# ``fwdbwd`` flow binds), every other kind Kineto writes (flow steps ``t``, instant events ``i``/``I``, counters
# ``C``, metadata ``M``) into :class:`_Mark`, which keeps only the category: the reader only counts them. A
# chunk holding another ``ph``, or an event without one, does not fit and comes as dicts.
# A field is None when absent or JSON null, except where the dict loop tells them apart: UNSET marks
# "absent" for ``name`` (absent "", null "None"), ``args.device``/``args.stream`` (absent: the event's
# pid/tid) and the record_shapes members. A chunk that does not fit (a float pid, an event that is not an
# object, ...) comes as dicts instead (trace_json.KinetoTrace.chunks), read by the general loop: both give
# the same rows (tests/test_kineto_typed_reader.py).
_UNSET = msgspec.UNSET
_IntField = int | str | None
_RawField = msgspec.Raw | msgspec.UnsetType
# a float beyond EXACT_TS_LIMIT µs may not determine its ns: such a chunk is decoded by the exact structs
_TsField = int | Annotated[float, msgspec.Meta(gt=-EXACT_TS_LIMIT, lt=EXACT_TS_LIMIT)] | None


class _Args(msgspec.Struct, gc=False):
    seq: _IntField = msgspec.field(default=None, name="Sequence number")
    fwd: _IntField = msgspec.field(default=None, name="Fwd thread id")
    ext: _IntField = msgspec.field(default=None, name="External id")
    ext_lower: _IntField = msgspec.field(default=None, name="external id")
    correlation: _IntField = None
    device: _IntField | msgspec.UnsetType = _UNSET
    stream: _IntField | msgspec.UnsetType = _UNSET
    grid: Any = None
    block: Any = None
    graph_id: _IntField = msgspec.field(default=None, name="graph id")
    graph_node_id: _IntField = msgspec.field(default=None, name="graph node id")
    nbytes: _IntField = msgspec.field(default=None, name="bytes")
    # record_shapes: kept as the raw JSON text (a per-event decode + encode cost ~8 µs per op event)
    dims: _RawField = msgspec.field(default=_UNSET, name="Input Dims")
    types: _RawField = msgspec.field(default=_UNSET, name="Input type")
    concrete: _RawField = msgspec.field(default=_UNSET, name="Concrete Inputs")
    strides: _RawField = msgspec.field(default=_UNSET, name="Input Strides")
    # what record_shapes leaves out (strings, tensor lists), added by this workflow's capture (capture/op_inputs.py)
    inputs: _RawField = msgspec.field(default=_UNSET, name="opprof inputs")


# ``ph`` is each struct's tag (the class's, readable as ``event.ph``); ``PH_KIND``: 1 a complete event, 2 a flow
# start or end, 0 any other.


class _Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event (``ph`` ``X``): times in µs as written (int, or float below EXACT_TS_LIMIT)."""
    ph: ClassVar[str] = "X"
    PH_KIND: ClassVar[int] = 1
    cat: str | None = None
    name: str | None | msgspec.UnsetType = _UNSET
    pid: _IntField = None
    tid: _IntField = None
    ts: _TsField = None
    dur: int | float | None = None
    args: _Args | None = None


class _ExactEvent(_Event, gc=False):
    """For a chunk holding a fractional ``ts`` of 2**43 µs or more: the exact decimal text as ``Decimal``."""
    ts: int | Decimal | None = None
    dur: int | Decimal | None = None


class _Flow(msgspec.Struct, gc=False, tag_field="ph", tag="s"):
    """A flow's start (``ph`` ``s``; :class:`_FlowEnd` its end): the fields of a ``fwdbwd`` row (:func:`_add_flow`)."""
    ph: ClassVar[str] = "s"
    PH_KIND: ClassVar[int] = 2
    cat: str | None = None
    pid: _IntField = None
    tid: _IntField = None
    ts: _TsField = None
    id: Any = None


class _FlowEnd(_Flow, gc=False, tag="f"):
    ph: ClassVar[str] = "f"


class _ExactFlow(_Flow, gc=False):
    ts: int | Decimal | None = None


class _ExactFlowEnd(_ExactFlow, gc=False, tag="f"):
    ph: ClassVar[str] = "f"


class _Mark(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    """An event the reader only counts by category (``ph`` ``i``; the subclasses ``I``, ``t``, ``C``, ``M``)."""
    ph: ClassVar[str] = "i"
    PH_KIND: ClassVar[int] = 0
    cat: str | None = None


class _MarkGlobal(_Mark, gc=False, tag="I"):
    ph: ClassVar[str] = "I"


class _FlowStep(_Mark, gc=False, tag="t"):
    ph: ClassVar[str] = "t"


class _CounterEvent(_Mark, gc=False, tag="C"):
    ph: ClassVar[str] = "C"


class _Metadata(_Mark, gc=False, tag="M"):
    ph: ClassVar[str] = "M"


_MARKS = (_Mark, _MarkGlobal, _FlowStep, _CounterEvent, _Metadata)
_TYPED = (msgspec.json.Decoder(list[Union[(_Event, _Flow, _FlowEnd) + _MARKS]]).decode,
          msgspec.json.Decoder(list[Union[(_ExactEvent, _ExactFlow, _ExactFlowEnd) + _MARKS]]).decode)
_STRUCTS = frozenset((_Event, _ExactEvent, _Flow, _FlowEnd, _ExactFlow, _ExactFlowEnd, *_MARKS))
_EMPTY_ARGS = _Args()
_NS_INT_LIMIT = 2**62 // 1000  # µs; int ts and dur below it: ts + dur in ns fits int64


_SURROGATE = re.compile("[\ud800-\udfff]")


class _StringColumn:
    """A string column read chunk by chunk as int32 codes into its distinct values (-1: null): each
    distinct string (an operator name repeats millions of times) is encoded to Arrow once, and the
    table's rows can be reordered as codes before the strings are built.

    ``pending`` collects a chunk's values (str or None); ``flush`` codes them (one dict lookup per value, in C:
    ``np.fromiter`` over ``map``; a chunk with strings not seen before adds them first, in the order they come);
    ``codes()`` joins every chunk's codes; ``strings(codes)`` builds the ``str`` column of the codes given.
    (A hash factorization per chunk, ``pd.factorize``, took twice as long: 0.25 vs 0.14 s for 2.9M values.)
    """

    def __init__(self, repaired: list[str] | None = None):
        self.pending: list = []
        self.parts: list[np.ndarray] = []
        self.code_of: dict[str, int] = {}  # the distinct strings, in the order of their codes
        self._code_or_null: dict = {None: -1}  # each value read (null included) -> its code
        self.repaired = repaired if repaired is not None else []  # values that held lone surrogates

    def flush(self) -> None:
        pending = self.pending
        if not pending:
            return
        self.pending = []
        lookup = self._code_or_null
        try:
            codes = np.fromiter(map(lookup.__getitem__, pending), dtype=np.int32, count=len(pending))
        except KeyError:  # strings not seen before: coded in the order they come
            code_of = self.code_of
            for value in pending:
                if value not in lookup:
                    text = value
                    if not value.isascii():
                        try:
                            value.encode("utf-8")
                        except UnicodeEncodeError:  # a lone surrogate ("\ud800" escaped in the JSON): not text
                            text = _SURROGATE.sub("\ufffd", value)
                            self.repaired.append(value)
                    code = code_of.get(text)
                    if code is None:
                        code = code_of[text] = len(code_of)
                    lookup[value] = code
            codes = np.fromiter(map(lookup.__getitem__, pending), dtype=np.int32, count=len(pending))
        self.parts.append(codes)

    def codes(self) -> np.ndarray:
        self.flush()
        codes = np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.int32)
        self.parts = [codes]
        return codes

    def strings(self, codes: np.ndarray):
        """The ``str`` column (Arrow ``large_string``, as pandas builds it) of ``codes``."""
        values = pa.array(list(self.code_of), type=pa.large_string())
        return values.take(pa.array(np.maximum(codes, 0), mask=codes < 0)).to_pandas().array


def _beyond_int64(path: Path, index: int, offset, name, cat, ts, dur) -> TimelineError:
    ts, dur = (v if v.__class__ is int else float(v) for v in (ts, dur))  # (the typed path holds them as Decimal)
    return TimelineError(
        f"{path}: traceEvents[{index}] at byte offset {offset} ({name!r}, cat {cat!r}) has a ts/dur beyond the "
        f"int64 ns range (ts {ts!r} µs, dur {dur!r} µs: more than 292 years from the clock's origin); not a "
        "torch.profiler trace: ts and dur are µs on the profiler's clock")


def _absent_to_none(value):
    return None if value is _UNSET else value


def _ns_fast(values: list) -> np.ndarray | None:
    """µs values -> int64 ns as :func:`_to_ns` gives them, vectorised; None unless every value is an int (ns =
    value * 1000 in int64) or every value is a float of magnitude below 2**42 µs (where ``round(value * 1000)``
    is :func:`_to_ns`'s exact result, rounded half to even like ``np.rint``)."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    a = np.array(values)
    if a.dtype == np.int64:
        if -_NS_INT_LIMIT < a.min() and a.max() < _NS_INT_LIMIT:
            return a * 1000
    elif a.dtype == np.float64:
        if (np.abs(a) < _FLOAT_FAST_LIMIT).all():
            return np.rint(a * 1000.0).astype(np.int64)
    return None


def _int_column(values: list) -> np.ndarray:
    """Values of an :data:`_IntField` -> int64 as :func:`_int_or_null` gives them (:data:`NULL_INT` for null):
    ``np.fromiter`` converts as ``int()`` does and fails on None or beyond int64."""
    n = len(values)
    try:
        return np.fromiter(values, dtype=np.int64, count=n)
    except (TypeError, ValueError, OverflowError):
        pass
    if values[0] is None and values.count(None) == n:  # (the field absent from every event)
        return np.full(n, NULL_INT, dtype=np.int64)
    try:
        return np.fromiter([NULL_INT if v is None else v for v in values], dtype=np.int64, count=n)
    except (TypeError, ValueError, OverflowError):
        return np.array([_int_or_null(v) for v in values], dtype=np.int64)


def _shapes_text(args: _Args, cache: dict) -> str | None:
    """record_shapes args -> the compact JSON ``[dims, types, concrete inputs, strides]`` (None without dims),
    from their raw text, with a 5th element where the event has this workflow's ``opprof inputs`` (see
    :func:`_shapes_json`); equal raw texts share one string."""
    key = (bytes(args.dims), None if args.types is _UNSET else bytes(args.types),
           None if args.concrete is _UNSET else bytes(args.concrete),
           None if args.strides is _UNSET else bytes(args.strides),
           None if args.inputs is _UNSET else bytes(args.inputs))
    text = cache.get(key, _UNSET)
    if text is _UNSET:
        if key[0] == b"null":
            text = None
        else:
            parts = [None if part is None else json.loads(part) for part in key]
            text = _COMPACT_JSON(parts if parts[4] is not None else parts[:4])
        cache[key] = text
    return text


def _shapes_json(args: dict, dims) -> str:
    """The dict loop's ``input_shapes`` text: ``[dims, types, concrete inputs, strides]``, and as a 5th element
    the ``opprof inputs`` the capture's shapes iterations add (capture/op_inputs.py: the strings and tensor
    lists record_shapes leaves out) where the event has them."""
    parts = [dims, args.get("Input type"), args.get("Concrete Inputs"), args.get("Input Strides")]
    extra = args.get("opprof inputs")
    return _COMPACT_JSON(parts if extra is None else [*parts, extra])


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":")).encode


def _external_id(args: dict) -> int | None:
    return _int_or_none(args.get("External id", args.get("external id")))


@bulk_memory()
def read_kineto(path: Path, *, typed: bool = True) -> Timeline:
    """Read a torch.profiler Chrome trace (GPU or CPU-only) into the timeline tables.

    Returns:
        ``Timeline(kernels, launches, ranges, diagnostics)`` with the columns of
        :mod:`operator_profiler.tables` (KERNELS, LAUNCHES, RANGES); times in integer ns on the
        trace's clock (``baseTimeNanoseconds + ts``). Extra columns: kernels ``external_id`` and
        ``valid_time`` (False for a kernel record with ``ts`` 0 or a negative ``dur``, docs/field-cases.md C04:
        its ``duration_ns`` is 0 and its interval is its launch's end, so it weighs nothing and
        draws nothing at epoch 0); ranges ``external_id`` and ``forward_range_id`` (on a backward op,
        the forward op its ``fwdbwd`` flow comes from, formats.md#kineto-backward-thread). ``diagnostics`` holds the counts, the
        launch APIs seen (C06), the ``External id`` mode (formats.md#kineto-external-id), orphan kernels and warnings
        (including the malformed events the loader repaired or skipped, docs/field-cases.md C18).

    Raises:
        TimelineError: the file is not a Kineto trace, is truncated or malformed beyond one event
            (:mod:`.trace_json`), an event lacks ``ts``/``dur`` (named with its index in
            ``traceEvents`` and its byte offset), or the trace holds neither kernels nor ops.

    ``typed=False`` reads every event through the general (dict) loop: the same tables, slower; for tests
    that check the two paths against each other.
    """
    path = Path(path)
    trace = load_trace(path)
    # Times are read relative to baseTimeNanoseconds, which is added once at the end: Kineto writes it
    # after traceEvents, and reading it first would cost a decompression pass of a .gz (trace_json).
    base = 0
    # Columns are filled directly (no dict per event): the loop runs once per event of traces with
    # millions of them. Integers go to array('q') (8 bytes each, no int objects; a null is NULL_INT)
    # and repeated strings (op and API names) are shared through one dict, so the columns stay small.
    r_pid, r_tid, r_start, r_end, r_seq, r_fwd, r_order, r_ext = (_IntColumn() for _ in range(8))
    surrogates: list[str] = []  # names that held lone surrogates, repaired to U+FFFD (warned)
    r_name, r_kind, r_shapes = (_StringColumn(surrogates) for _ in range(3))  # shapes: record_shapes JSON
    l_pid, l_tid, l_start, l_end, l_corr, l_ext = (_IntColumn() for _ in range(6))
    l_api = _StringColumn(surrogates)
    k_pid, k_device, k_stream, k_start, k_end, k_corr, k_graph, k_node, k_ext = (_IntColumn() for _ in range(9))
    k_name, k_grid, k_block = (_StringColumn(surrogates) for _ in range(3))
    # flushed after each chunk (the per-chunk buffers of the dict loop)
    columns = (r_name, r_kind, r_shapes, l_api, k_name, k_grid, k_block, r_pid, r_tid, r_start, r_end, r_seq,
               r_fwd, r_order, r_ext, l_pid, l_tid, l_start, l_end, l_corr, l_ext, k_pid, k_device, k_stream,
               k_start, k_end, k_corr, k_graph, k_node, k_ext)
    k_valid = bytearray()
    flow_rows: list[tuple] = []
    memory_correlations: set[int] = set()
    memory_rows: list[tuple | None] = []
    categories: Counter = Counter()
    category_code: dict = {}  # (typed chunks) category -> code, and the kind of each code (CHUNK_KIND)
    category_kind: list[int] = []
    # what the reader repaired or left out, by kind: [count, index of the first event] (warned at the end)
    anomalies: dict[str, list] = {}

    odd_ph: Counter = Counter()  # the 'ph' values of events neither read nor set aside (SET_ASIDE_PH)

    def odd_ph_text() -> str:
        return ", ".join(f"{ph} {n}" for ph, n in odd_ph.most_common())

    def anomaly(kind: str, count: int, index: int) -> None:
        seen = anomalies.setdefault(kind, [0, index])
        seen[0] += count
        seen[1] = min(seen[1], index)  # (a typed chunk reports its kinds of events one after the other)

    shared: dict[str, str] = {}
    to_ns, int_or_null = _to_ns, _int_or_null
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    null = NULL_INT
    ticker = Ticker(f"reading {path.name}")
    shapes_cache: dict = {}

    def ns_or_error(rows: list, events: list, kinds: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
        """start and end (relative ns) of typed X events ``rows`` (of the chunk ``events``), or the reader's
        error for the chunk's first X event (of any kind in ``kinds``, as the dict loop meets them) without."""
        start = _ns_fast([e.ts for e in rows])
        dur = _ns_fast([e.dur for e in rows]) if start is not None else None
        if start is not None and dur is not None:
            return start, start + dur
        try:
            start = np.array([to_ns(e.ts) for e in rows], dtype=np.int64)
            return start, start + np.array([to_ns(e.dur) for e in rows], dtype=np.int64)
        except (TypeError, ArithmeticError, ValueError):
            pass
        for i in np.flatnonzero(kinds).tolist():
            ev = events[i]
            try:
                start = to_ns(ev.ts)
                end = start + to_ns(ev.dur)
            except (TypeError, ArithmeticError, ValueError):
                raise TimelineError(
                    f"{path}: traceEvents[{first + i}] at byte offset {trace.offset(first + i)} "
                    f"({_absent_to_none(ev.name)!r}, cat {ev.cat!r}) has no valid ts/dur; the trace is truncated or "
                    "not written by torch.profiler") from None
            if not (-_I64 < start < _I64 and -_I64 < end < _I64):
                raise _beyond_int64(path, first + i, trace.offset(first + i), _absent_to_none(ev.name), ev.cat, ev.ts,
                                    ev.dur)
        raise AssertionError("unreachable: a conversion failed above")

    xyz_cache: dict[tuple, str | None] = {}

    def xyz_text(value) -> str | None:
        """:func:`_xyz` of a grid/block value, computed once per distinct value (equal elements, such as
        1 and 1.0, give the same text: ``str(int(v))``)."""
        if value.__class__ is not list:
            return _xyz(value)
        try:
            key = tuple(value)
            text = xyz_cache.get(key, _UNSET)
        except TypeError:  # an unhashable element: _xyz decides
            return _xyz(value)
        if text is _UNSET:
            text = _xyz(value)
            text = xyz_cache[key] = text if text is None else shared.setdefault(text, text)
        return text

    def names_of(rows: list, index, first: int) -> list[str]:
        """The names of typed events ``rows`` (``index``: their positions in the chunk, which starts at event
        ``first``) as the dict loop reads them: absent "", any other non-string by its text (reported with the first
        one's index in traceEvents)."""
        names = [e.name for e in rows]
        if set(map(type, names)) == {str}:  # (the common case, one pass in C)
            return names
        odd = [i for i, n in enumerate(names) if n.__class__ is not str and n is not _UNSET]
        if odd:
            anomaly("name", len(odd), first + int(index[odd[0]]))
        return [n if n.__class__ is str else ("" if n is _UNSET else str(n)) for n in names]

    def typed_chunk(events: list, first: int) -> None:
        """The events of a chunk decoded by :data:`_TYPED` into the columns, a column at a time."""
        # Each event's category as a code (one dict lookup an event), counted by bincount; a category met for the
        # first time gets its code and its place in ``categories`` in file order, as counting them one by one would.
        code_of = category_code.get
        codes = [code_of(e.cat, -1) for e in events]
        if -1 in codes:
            for e in events:
                if e.cat not in category_code:
                    category_code[e.cat] = len(category_code)
                    category_kind.append(CHUNK_KIND.get(e.cat, 0))
                    categories[e.cat] += 0
            codes = [code_of(e.cat) for e in events]
        codes = np.array(codes, dtype=np.intp)
        counts = np.bincount(codes, minlength=len(category_code))
        for cat, code in category_code.items():
            if counts[code]:
                categories[cat] += int(counts[code])
        # what each event is (CHUNK_KIND by its category and ph, 0: none), then the positions of each kind, in file order
        kinds = np.array(category_kind, dtype=np.int8)[codes]
        ph_kind = np.array([e.PH_KIND for e in events], dtype=np.int8)
        kinds[(ph_kind != 1) & (kinds != _FWDBWD) | (ph_kind != 2) & (kinds == _FWDBWD)] = 0
        in_ranges, in_launches, in_kernels = (np.flatnonzero(kinds == k).tolist() for k in (1, 2, 3))
        for i in np.flatnonzero(kinds == _MEMORY).tolist():  # memcpy/memset, one at a time (few)
            ev = events[i]
            cat = ev.cat
            margs = ev.args or _EMPTY_ARGS
            corr = _int_or_none(margs.correlation)
            if corr is not None:
                memory_correlations.add(corr)
            as_dict = {k: v for k, v in (("ts", ev.ts), ("dur", ev.dur), ("name", ev.name), ("pid", ev.pid),
                                         ("tid", ev.tid)) if v is not _UNSET and (v is not None or k == "name")}
            args_dict = {k: v for k, v in (("device", margs.device), ("stream", margs.stream),
                                           ("bytes", margs.nbytes)) if v is not _UNSET}
            memory_rows.append(_memory_row(as_dict, cat, args_dict, corr, base))
        for i in np.flatnonzero(kinds == _FWDBWD).tolist():  # fwdbwd flow starts and ends
            ev = events[i]
            pid, tid = _int_or_none(ev.pid), _int_or_none(ev.tid)
            if ev.ts is not None and pid is not None and tid is not None:
                _add_flow(flow_rows, (ev.id, ev.ph, pid, tid), ev.ts)
        if in_ranges:
            rows = [events[i] for i in in_ranges]
            start, end = ns_or_error(rows, events, kinds, first)
            pid, tid = _int_column([e.pid for e in rows]), _int_column([e.tid for e in rows])
            keep = (pid != null) & (tid != null)
            if not keep.all():
                anomaly("thread", int((~keep).sum()), first + in_ranges[int(np.flatnonzero(~keep)[0])])
                rows = [e for e, k in zip(rows, keep.tolist()) if k]
                start, end, pid, tid = start[keep], end[keep], pid[keep], tid[keep]
                in_order = np.array(in_ranges, dtype=np.int64)[keep]
            else:
                in_order = np.array(in_ranges, dtype=np.int64)
            args = [e.args or _EMPTY_ARGS for e in rows]
            r_pid.add(pid)
            r_tid.add(tid)
            r_start.add(start)
            r_end.add(end)
            r_name.pending.extend(names_of(rows, in_order, first))
            r_kind.pending.extend([RANGE_CATEGORIES[e.cat] for e in rows])
            r_seq.add(_int_column([a.seq for a in args]))
            r_fwd.add(_int_column([a.fwd for a in args]))
            r_ext.add(_int_column([a.ext if a.ext is not None else a.ext_lower
                                         for a in args]))
            r_shapes.pending.extend([None if a.dims is _UNSET else _shapes_text(a, shapes_cache) for a in args])
            r_order.add((in_order + first))
        if in_launches:
            rows = [events[i] for i in in_launches]
            start, end = ns_or_error(rows, events, kinds, first)
            args = [e.args or _EMPTY_ARGS for e in rows]
            l_pid.add(_int_column([e.pid for e in rows]))
            l_tid.add(_int_column([e.tid for e in rows]))
            l_start.add(start)
            l_end.add(end)
            l_api.pending.extend(names_of(rows, in_launches, first))
            l_corr.add(_int_column([a.correlation for a in args]))
            l_ext.add(_int_column([a.ext if a.ext is not None else a.ext_lower
                                         for a in args]))
        if in_kernels:
            rows = [events[i] for i in in_kernels]
            start, end = ns_or_error(rows, events, kinds, first)
            args = [e.args or _EMPTY_ARGS for e in rows]
            # docs/field-cases.md C04: dropped-timestamp records come as ts 0 (dur 0) or with a negative dur.
            valid = (start != 0) & (end >= start)
            k_pid.add(_int_column([e.pid for e in rows]))
            k_device.add(_int_column([e.pid if (v := a.device) is _UNSET else v
                                            for e, a in zip(rows, args)]))
            k_stream.add(_int_column([e.tid if (v := a.stream) is _UNSET else v
                                            for e, a in zip(rows, args)]))
            k_name.pending.extend(names_of(rows, in_kernels, first))
            k_start.add(start)
            k_end.add(np.where(valid, end, start))
            k_corr.add(_int_column([a.correlation for a in args]))
            for col, values in ((k_grid, [a.grid for a in args]), (k_block, [a.block for a in args])):
                col.pending.extend([xyz_text(v) for v in values])
            k_graph.add(_int_column([a.graph_id for a in args]))
            k_node.add(_int_column([a.graph_node_id for a in args]))
            k_ext.add(_int_column([a.ext if a.ext is not None else a.ext_lower
                                         for a in args]))
            k_valid.extend(valid.tobytes())

    for first, events in trace.chunks(_TYPED if typed else None):
        ticker.tick(first, "events", trace.fraction_read())
        if events and events[0].__class__ in _STRUCTS:
            typed_chunk(events, first)
            for column in columns:
                column.flush()
            continue
        for index, ev in enumerate(events, first):  # one Python loop per chunk of events
            if ev.__class__ is not dict:
                anomaly("element", 1, index)
                continue
            cat = ev.get("cat")
            ph = ev.get("ph")
            categories[cat] += 1
            if ph != "X":
                if cat == "fwdbwd" and (ph == "s" or ph == "f"):
                    ts = ev.get("ts")
                    pid, tid = _int_or_none(ev.get("pid")), _int_or_none(ev.get("tid"))
                    if ts is not None and pid is not None and tid is not None:
                        _add_flow(flow_rows, (ev.get("id"), ph, pid, tid), ts)
                elif ph.__class__ is not str or ph not in SET_ASIDE_PH:
                    anomaly("ph", 1, index)
                    odd_ph[repr(ph) if ph.__class__ is not str else ph] += 1
                continue
            kind = RANGE_CATEGORIES.get(cat)
            is_launch = kind is None and cat in LAUNCH_CATEGORIES
            if kind is None and not is_launch and cat not in KERNEL_CATEGORIES:
                if cat in MEMORY_CATEGORIES:
                    margs = ev.get("args") or _NO_ARGS
                    corr = _int_or_none(margs.get("correlation"))
                    if corr is not None:
                        memory_correlations.add(corr)
                    memory_rows.append(_memory_row(ev, cat, margs, corr, base))
                continue
            try:
                raw_ts, raw_dur = ev["ts"], ev["dur"]
                # int µs (pre-2024 traces) inline; floats and exact decimal text through _to_ns
                start = base + (raw_ts * 1000 if raw_ts.__class__ is int else to_ns(raw_ts))
                end = start + (raw_dur * 1000 if raw_dur.__class__ is int else to_ns(raw_dur))
            except (KeyError, TypeError, ArithmeticError, ValueError):  # ValueError: NaN
                raise TimelineError(
                    f"{path}: traceEvents[{index}] at byte offset {trace.offset(index)} ({ev.get('name')!r}, cat {cat!r}) "
                    "has no valid ts/dur; the trace is truncated or not written by torch.profiler"
                ) from None
            if not (-_I64 < start < _I64 and -_I64 < end < _I64):
                raise _beyond_int64(path, index, trace.offset(index), ev.get("name"), cat, raw_ts, raw_dur)
            args = ev.get("args") or _NO_ARGS
            if args.__class__ is not dict:
                anomaly("args", 1, index)
                args = _NO_ARGS
            name = ev.get("name", "")
            if name.__class__ is not str:
                anomaly("name", 1, index)
                name = str(name)
            name = shared.setdefault(name, name)
            if kind is not None:
                pid, tid = ev.get("pid"), ev.get("tid")
                if pid.__class__ is not int or tid.__class__ is not int or not -_I64 < pid < _I64 or not -_I64 < tid < _I64:
                    pid, tid = int_or_null(pid), int_or_null(tid)
                    if pid == null or tid == null:
                        anomaly("thread", 1, index)
                        continue
                r_pid.append(pid)
                r_tid.append(tid)
                r_start.append(start)
                r_end.append(end)
                r_name.pending.append(name)
                r_kind.pending.append(kind)
                if args:
                    v = args.get("Sequence number")
                    r_seq.append(v if v.__class__ is int and -_I64 < v < _I64 else int_or_null(v))
                    v = args.get("Fwd thread id")
                    r_fwd.append(v if v.__class__ is int and -_I64 < v < _I64 else int_or_null(v))
                    v = args.get("External id")
                    r_ext.append(v if v.__class__ is int and -_I64 < v < _I64 else int_or_null(v if v is not None else args.get("external id")))
                    dims = args.get("Input Dims")
                    if dims is None:
                        r_shapes.pending.append(None)
                    else:
                        shapes = _shapes_json(args, dims)
                        r_shapes.pending.append(shared.setdefault(shapes, shapes))
                else:
                    r_seq.append(null)
                    r_fwd.append(null)
                    r_ext.append(null)
                    r_shapes.pending.append(None)
                r_order.append(index)
            elif is_launch:
                v = ev.get("pid")
                l_pid.append(v if v.__class__ is int and -_I64 < v < _I64 else int_or_null(v))
                v = ev.get("tid")
                l_tid.append(v if v.__class__ is int and -_I64 < v < _I64 else int_or_null(v))
                l_start.append(start)
                l_end.append(end)
                l_api.pending.append(name)
                v = args.get("correlation")
                l_corr.append(v if v.__class__ is int and -_I64 < v < _I64 else int_or_null(v))
                v = args.get("External id")
                l_ext.append(v if v.__class__ is int and -_I64 < v < _I64 else int_or_null(v if v is not None else args.get("external id")))
            else:
                # docs/field-cases.md C04: dropped-timestamp records come as ts 0 (dur 0) or with a negative dur.
                # Compared in exact ns: ts/dur may be int, float or exact decimal text (trace_json).
                valid = start != base and end >= start
                k_pid.append(int_or_null(ev.get("pid")))
                k_device.append(int_or_null(args.get("device", ev.get("pid"))))
                k_stream.append(int_or_null(args.get("stream", ev.get("tid"))))
                k_name.pending.append(name)
                k_start.append(start)
                k_end.append(end if valid else start)
                k_corr.append(int_or_null(args.get("correlation")))
                grid, block = _xyz(args.get("grid")), _xyz(args.get("block"))
                k_grid.pending.append(grid if grid is None else shared.setdefault(grid, grid))
                k_block.pending.append(block if block is None else shared.setdefault(block, block))
                k_graph.append(int_or_null(args.get("graph id")))
                k_node.append(int_or_null(args.get("graph node id")))
                v = args.get("External id")
                k_ext.append(int_or_null(v if v is not None else args.get("external id")))
                k_valid.append(valid)
        for column in columns:
            column.flush()
    del shared, shapes_cache, columns  # (each column is dropped once its table is built)
    release_free_memory()  # the chunks' decoded events
    base = int(trace.get("baseTimeNanoseconds") or 0)
    if base:
        for col in (r_start, r_end, l_start, l_end, k_start, k_end):
            shifted = _ints(col)
            if len(shifted) and not (-_I64 < int(shifted.min()) + base and int(shifted.max()) + base < _I64):
                raise TimelineError(
                    f"{path}: baseTimeNanoseconds {base} + the events' ts is beyond the int64 ns range (year 2262); "
                    "not a torch.profiler trace: ts must be µs relative to baseTimeNanoseconds")
            shifted += base
            col.parts = [shifted]
        flow_rows = [(*row[:4], row[4] + base) for row in flow_rows]
        memory_rows = [None if row is None else (*row[:5], row[5] + base, row[6] + base, *row[7:])
                       for row in memory_rows]

    reader_warnings = []
    said = {
        "element": "array elements that are not event objects were skipped",
        "args": "events whose 'args' is not an object were read without their args",
        "name": "events whose name is not a string (null, a number, a list) were named by its text",
        "thread": "op/annotation events without an integer pid and tid were left out (they nest on no thread)",
        "ph": "events were not read for their 'ph' ({}): torch.profiler writes ops, kernels and launches as complete "
              "events ('X'); ops or kernels written as begin/end pairs ('B'/'E') or without a valid 'ph' are missing "
              "from the timeline",
    }
    for kind, (count, index) in anomalies.items():
        what = said[kind].format(odd_ph_text()) if kind == "ph" else said[kind]
        reader_warnings.append(f"{count} {what} (first: traceEvents[{index}])")
    dropped = sum(1 for row in memory_rows if row is None)
    if dropped:
        reader_warnings.append(f"{dropped} memcpy/memset events without a valid ts/dur were left out of "
                               "gpu_activities (docs/field-cases.md C04)")
    # An op/annotation or launch with a negative dur (a dropped timestamp, docs/field-cases.md C04) is read as
    # zero-length at its ts, and said: it would otherwise enclose nothing and sort before its own start.
    negative = r_end.values() < r_start.values()
    if negative.any():
        first_bad = int(np.flatnonzero(negative)[0])
        code = int(r_name.codes()[first_bad])
        reader_warnings.append(
            f"{int(negative.sum())} op/annotation events have a negative dur (first: traceEvents"
            f"[{int(r_order.values()[first_bad])}] {list(r_name.code_of)[code] if code >= 0 else None!r}): read as "
            "zero-length at their ts")
        r_end.parts = [np.where(negative, r_start.values(), r_end.values())]
    negative = l_end.values() < l_start.values()
    if negative.any():
        reader_warnings.append(f"{int(negative.sum())} launch calls have a negative dur: read as zero-length at their ts")
        l_end.parts = [np.where(negative, l_start.values(), l_end.values())]
    del negative

    ranges = pd.DataFrame({
        "pid": _ints(r_pid), "tid": _ints(r_tid), "start_ns": _ints(r_start), "end_ns": _ints(r_end),
        "name": r_name.codes(), "kind": r_kind.codes(),  # as codes while _nest orders the rows
        "seq": _nullable(r_seq), "fwd_thread_id": _nullable(r_fwd), "order": _ints(r_order),
        "external_id": _nullable(r_ext), "input_shapes": r_shapes.codes(),
    })
    del r_pid, r_tid, r_start, r_end, r_seq, r_fwd, r_order, r_ext
    ranges = _nest(ranges)
    name_codes = ranges["name"].to_numpy()
    for column, values in (("name", r_name), ("kind", r_kind), ("input_shapes", r_shapes)):
        ranges[column] = values.strings(ranges[column].to_numpy())
    ranges["end_tid"] = pd.array([None] * len(ranges), dtype="Int64")
    ranges["domain"] = "torch.profiler"
    # layer and iteration of each distinct name, then of each range by its name's code
    distinct = pd.Series(list(r_name.code_of), dtype="str")
    layer = distinct.str.removeprefix(LAYER_PREFIX).where(distinct.str.startswith(LAYER_PREFIX), None)
    iteration = distinct.str.removeprefix(ITERATION_PREFIX)
    is_iteration = distinct.str.startswith(ITERATION_PREFIX) & iteration.str.isdigit()
    iteration = pd.to_numeric(iteration.where(is_iteration), errors="coerce").astype("Int64")
    named = name_codes >= 0
    at = np.maximum(name_codes, 0)
    ranges["layer"] = layer.array.take(np.where(named, at, -1), allow_fill=True) if len(distinct) else \
        pd.array([None] * len(ranges), dtype="str")
    ranges["iteration"] = iteration.array.take(np.where(named, at, -1), allow_fill=True) if len(distinct) else \
        pd.array([None] * len(ranges), dtype="Int64")
    del r_name, r_kind, r_shapes, name_codes, distinct, layer, iteration, is_iteration
    ranges["forward_range_id"] = _bind_fwdbwd_flows(ranges, flow_rows)

    launches = pd.DataFrame({
        "pid": _nullable(l_pid), "tid": _nullable(l_tid), "start_ns": _ints(l_start), "end_ns": _ints(l_end),
        "api": l_api.codes(), "correlation_id": _nullable(l_corr), "external_id": _nullable(l_ext),
    })
    del l_pid, l_tid, l_start, l_end, l_corr, l_ext
    launches = launches.sort_values("start_ns", kind="stable").reset_index(drop=True)
    launches["api"] = l_api.strings(launches["api"].to_numpy())
    del l_api
    launches, repeated_launches = _drop_repeated_launches(launches)
    launches["launch_id"] = np.arange(len(launches), dtype=np.int64)

    gpu_kernels = pd.DataFrame({
        "pid": _nullable(k_pid), "device": _nullable(k_device), "stream": _nullable(k_stream),
        "name": k_name.strings(k_name.codes()), "mangled_name": pd.array([None] * len(k_name.codes()), dtype="str"),
        "start_ns": _ints(k_start), "end_ns": _ints(k_end), "correlation_id": _nullable(k_corr),
        "grid": k_grid.strings(k_grid.codes()), "block": k_block.strings(k_block.codes()),
        "graph_id": _nullable(k_graph), "graph_node_id": _nullable(k_node), "external_id": _nullable(k_ext),
        "valid_time": np.frombuffer(bytes(k_valid), dtype=bool).copy(),
    })
    del k_pid, k_device, k_stream, k_name, k_start, k_end, k_corr, k_grid, k_block, k_graph, k_node, k_ext, k_valid

    categories = Counter({str(c): n for c, n in categories.items()})
    gpu_trace = bool(len(gpu_kernels)) or _has_gpu_activity(trace, categories, launches)
    repeats: dict = {"launch_records": repeated_launches, "kernel_records": 0, "kept": None}
    if gpu_trace:
        kernels = _gpu_kernels(gpu_kernels, launches)
        kernels, repeats["kernel_records"], repeats["kept"] = _drop_repeated_kernels(kernels, base)
    else:
        kernels = _cpu_kernels(ranges)
    del gpu_kernels  # (finish_kernels builds the ordered copy)
    if not len(kernels) and not len(ranges):
        raise TimelineError(
            f"{path}: no kernel events and no operator events (categories: "
            f"{', '.join(f'{c} {n}' for c, n in sorted(categories.items())) or 'none'}"
            + (f"; events not read for their 'ph': {odd_ph_text()}, "
               "torch.profiler writes complete events, ph 'X'" if odd_ph else "")
            + "); record the trace with torch.profiler.profile(activities=[ProfilerActivity.CPU, "
            "ProfilerActivity.CUDA]) around the model's iterations")
    release_free_memory()
    kernels = finish_kernels(kernels, ranges, source="kineto")
    diagnostics = _diagnostics(path, trace, categories, kernels, launches, memory_correlations, gpu_trace)
    diagnostics["counts"]["duplicate_kernel_records"] = repeats["kernel_records"]
    diagnostics["counts"]["duplicate_launch_records"] = repeats["launch_records"]
    reader_warnings += _repeat_warnings(repeats)
    if surrogates:
        reader_warnings.append(
            f"{len(surrogates)} distinct name(s) held lone UTF-16 surrogates (a \\ud800-\\udfff escape without its "
            f"pair: not text), read with U+FFFD in their place: {', '.join(repr(v[:80]) for v in surrogates[:3])}")
    diagnostics["warnings"] = list(trace.warnings) + reader_warnings + diagnostics["warnings"]
    ranges = ranges.drop(columns="order")
    release_free_memory()
    return Timeline(kernels=kernels, launches=launches, ranges=ranges, diagnostics=diagnostics,
                    activities=_activities(memory_rows, launches))


_COPY_KIND = re.compile(r"^Memcpy (\w+)")

# What makes two records one (docs/field-cases.md C24): every field the reader keeps. A kernel record written twice
# (a corrupt trace, or two traces of one run merged) would count its time twice and, matched in order against
# ncu's rows, shift every pairing after it; a launch written twice would make its kernels' join ambiguous.
KERNEL_RECORD_FIELDS = ["pid", "device", "stream", "name", "start_ns", "end_ns", "correlation_id", "grid", "block",
                        "graph_id", "graph_node_id", "external_id", "launch_api"]
LAUNCH_RECORD_FIELDS = ["pid", "tid", "start_ns", "end_ns", "api", "correlation_id", "external_id"]


def _drop_repeated_launches(launches: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``launches`` without the launch events that repeat an earlier one in every field (one call written twice: its
    correlation id is its own, so two rows carrying it in full are one call), and how many were dropped. Rows
    without a correlation id (<= 0 or null) are never taken for repeats."""
    eligible = (launches["correlation_id"].fillna(0) > 0).to_numpy(dtype=bool)
    drop = exact_repeats(launches, LAUNCH_RECORD_FIELDS, eligible)
    if not drop.any():
        return launches, 0
    return launches[~drop].reset_index(drop=True), int(drop.sum())


def _drop_repeated_kernels(kernels: pd.DataFrame, base: int) -> tuple[pd.DataFrame, int, dict | None]:
    """``kernels`` (joined to their launches) without the records that repeat an earlier one in every field
    (:data:`KERNEL_RECORD_FIELDS`): one kernel execution written twice. Returns the table, how many records were
    dropped, and, when some identical records were kept, ``{"count", "name"}`` of those.

    Kept as they are: records with an invalid timestamp (``valid_time`` False: ts 0 or a negative dur carry no
    time that could tell two executions apart), and, in a trace of whole-µs timestamps (Kineto before 2024), records
    of a CUDA-graph launch or of an unknown launch: two identical nodes of one graph launch can run within the
    same µs on one stream and then look alike to the last field. Records that differ in start time (the nodes of
    a graph replay share the launch's correlation id) are never repeats."""
    if len(kernels) < 2:
        return kernels, 0, None
    valid = kernels["valid_time"].to_numpy(dtype=bool)
    repeat = exact_repeats(kernels, KERNEL_RECORD_FIELDS, valid)
    if not repeat.any():
        return kernels, 0, None
    relative = np.concatenate([kernels["start_ns"].to_numpy(), kernels["end_ns"].to_numpy()]) - base
    whole_us = bool((relative % 1000 == 0).all())
    kept = np.zeros(len(kernels), dtype=bool)
    if whole_us:
        api = kernels["launch_api"].astype(object)
        graph = (api.isna() | api.astype(str).str.contains("GraphLaunch") | kernels["graph_id"].notna()).to_numpy()
        kept = repeat & graph
    drop = repeat & ~kept
    identical = {"count": int(kept.sum()), "name": str(kernels["name"].iloc[int(np.flatnonzero(kept)[0])])} \
        if kept.any() else None
    return kernels[~drop].reset_index(drop=True), int(drop.sum()), identical


def _repeat_warnings(repeats: dict) -> list[str]:
    """The warnings on records written twice (:func:`_drop_repeated_kernels`, :func:`_drop_repeated_launches`)."""
    out = []
    if repeats["kernel_records"]:
        out.append(f"{repeats['kernel_records']} kernel record(s) repeat another record in every field (name, device, "
                   "stream, start, duration, correlation id, grid, block): the trace holds those kernels more than once "
                   "(corrupt, or merged from overlapping traces); each kernel is counted once "
                   "(counts.duplicate_kernel_records)")
    if repeats["launch_records"]:
        out.append(f"{repeats['launch_records']} launch call record(s) repeat another record in every field: read "
                   "once (counts.duplicate_launch_records)")
    if repeats["kept"]:
        out.append(f"{repeats['kept']['count']} kernel record(s) of a CUDA-graph or unknown launch are identical to "
                   f"another (first: {repeats['kept']['name']!r}) in a trace of whole-µs timestamps, where two nodes "
                   "of one graph launch can look alike: both kept, so their time may be counted twice")
    return out


def _add_flow(rows: list, key: tuple, ts) -> None:
    """A ``fwdbwd`` flow event's row ``(id, ph, pid, tid, ts ns)``; one with an unreadable ts or a ts beyond the int64
    ns range binds nothing and is left out."""
    try:
        at = _to_ns(ts)
    except (TypeError, ArithmeticError, ValueError):
        return
    if -_I64 < at < _I64:
        rows.append((*key, at))


def _memory_row(ev: dict, cat: str, args: dict, corr: int | None, base: int) -> tuple | None:
    """One memcpy/memset event as an activity row (``ACTIVITY_COLUMNS`` order up to the launch
    columns), or None when its ``ts``/``dur`` are missing or invalid (docs/field-cases.md C04: it is then only
    counted in the diagnostics). Kineto names them ``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``
    (docs/formats.md#kineto-events; seen in the real HTA traces)."""
    try:
        start = base + _to_ns(ev["ts"])
        end = start + _to_ns(ev["dur"])
    except (KeyError, TypeError, ArithmeticError, ValueError):
        return None
    if start == base or end < start:  # ts 0 or a negative dur, compared in exact ns (ts may be text)
        return None
    if not (-_I64 < start < _I64 and -_I64 < end < _I64):
        return None
    name = str(ev.get("name", ""))
    kind = "memset" if "memset" in cat.lower() else "memcpy"
    copy = _COPY_KIND.match(name)
    return (kind, copy.group(1) if kind == "memcpy" and copy else None, _int_or_none(ev.get("pid")),
            _int_or_none(args.get("device", ev.get("pid"))), _int_or_none(args.get("stream", ev.get("tid"))),
            start, end, end - start, _int_or_none(args.get("bytes")), corr)


def _activities(rows: list[tuple | None], launches: pd.DataFrame) -> pd.DataFrame:
    """The memcpy/memset rows joined to their launch call (``ACTIVITY_COLUMNS``), in start order."""
    frame = pd.DataFrame([r for r in rows if r is not None], columns=ACTIVITY_COLUMNS[:10])
    for col in ("pid", "device", "stream", "bytes", "correlation_id"):
        frame[col] = pd.array(frame[col], dtype="Int64")
    for col in ("start_ns", "end_ns", "duration_ns"):
        frame[col] = frame[col].astype("int64")
    frame = _join_launches(frame, launches)
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)[ACTIVITY_COLUMNS]


_NO_ARGS: dict = {}


def _has_gpu_activity(trace: dict, categories: Counter, launches: pd.DataFrame) -> bool:
    """A trace recorded with CUDA activities, even when it holds no kernel record (counter mode)."""
    if trace.get("deviceProperties") or categories.get("cuda_profiler_range"):
        return True
    return bool(len(launches)) and bool(_kernel_launch_calls(launches["api"]).any())


def _kernel_launch_calls(api: pd.Series):
    """Per launch call, whether its API (:data:`KERNEL_LAUNCH_API`) launches a kernel: ``api.str.contains``, run once
    per distinct API name (a handful for millions of calls) and spread by the codes (a bool array); that Series
    itself where the answers are not all booleans (nulls in an object column)."""
    codes, distinct = pd.factorize(api, use_na_sentinel=False)
    if not len(distinct):
        return np.zeros(len(api), dtype=bool)
    found = pd.Series(distinct, dtype=api.dtype).str.contains(KERNEL_LAUNCH_API)
    if found.dtype != bool:
        return api.str.contains(KERNEL_LAUNCH_API)
    return found.to_numpy()[codes]


def _bind_fwdbwd_flows(ranges: pd.DataFrame, flows: list[tuple]) -> pd.arrays.IntegerArray:
    """Backward op -> forward op through the ``fwdbwd`` flow events (docs/formats.md#kineto-backward-thread).

    A flow's ``s`` end sits at the start of the forward op that created the autograd node, its ``f``
    end at the start of the backward op, each on its op's thread; several ops can start at the same
    time on a thread (``aten::linear`` > ``aten::t``), the deepest one is the flow's op.
    """
    result = np.full(len(ranges), -1, dtype=np.int64)
    if flows and len(ranges):
        ends = pd.DataFrame(flows, columns=["flow", "ph", "pid", "tid", "start_ns"])
        ends["flow"] = ends["flow"].astype(str)  # ids are ints or strings depending on the writer
        at = ranges[["pid", "tid", "start_ns", "depth", "range_id"]].merge(ends, on=["pid", "tid", "start_ns"])
        # the deepest range at the flow's point; range_id is the row position (set by _nest)
        at = at.sort_values("depth").drop_duplicates(["flow", "ph", "pid"], keep="last")
        pairs = at[at["ph"] == "s"].merge(at[at["ph"] == "f"], on=["pid", "flow"], suffixes=("_fwd", "_bwd"))
        result[pairs["range_id_bwd"].to_numpy(dtype=np.int64)] = pairs["range_id_fwd"].to_numpy(dtype=np.int64)
    return pd.arrays.IntegerArray(np.maximum(result, 0), result < 0)


def _diagnostics(path: Path, trace: dict, categories: Counter, kernels: pd.DataFrame, launches: pd.DataFrame,
                 memory_correlations: set[int], gpu_trace: bool) -> dict:
    warnings: list[str] = []
    gpu = kernels[kernels["device"] >= 0] if len(kernels) else kernels
    orphans = int(gpu["launch_start_ns"].isna().sum()) if len(gpu) else 0
    null_corr = int((gpu["correlation_id"].fillna(0) <= 0).sum()) if len(gpu) else 0
    invalid = int((~gpu["valid_time"].astype(bool)).sum()) if len(gpu) and "valid_time" in gpu else 0
    kernel_launch = launches[_kernel_launch_calls(launches["api"])] if len(launches) else launches
    # correlation ids of a kernel or memcpy/memset record (an array: a set of a million ints costs 0.1 s)
    with_kernel = np.concatenate([gpu["correlation_id"].dropna().to_numpy(dtype=np.int64) if len(gpu) else
                                  np.zeros(0, dtype=np.int64),
                                  np.fromiter(memory_correlations, dtype=np.int64, count=len(memory_correlations))])
    without = kernel_launch[~kernel_launch["correlation_id"].isin(with_kernel)
                            & kernel_launch["correlation_id"].notna()] if len(kernel_launch) else kernel_launch
    if gpu_trace and not len(gpu):
        ranges_n = categories.get("cuda_profiler_range", 0)
        why = (f"it holds {ranges_n} cuda_profiler_range events: it was recorded in CUPTI range-profiler mode "
               "(profiler_metrics=...), which replaces kernel records by counter ranges"
               if ranges_n else "the GPU activity records are missing (profiled without ProfilerActivity.CUDA, "
                                "or all dropped by the tracer)")
        holds = "GPU launch calls" if len(kernel_launch) else "CUDA device properties"
        warnings.append(f"no kernel events: {path.name} has {holds} but no 'kernel' records; {why}. "
                        "Record the trace again with activities=[CPU, CUDA] and no profiler_metrics; counters "
                        "come from ncu")
    keyed = launches["correlation_id"].dropna()
    ambiguous = int(keyed[keyed > 0].duplicated(keep=False).sum()) if len(launches) else 0
    if len(gpu):
        # One kernel launch call starts one kernel (a graph launch many): kernels sharing a plain launch's
        # correlation id all take its op, which only one of them ran.
        joined = gpu[gpu["launch_api"].notna() & (gpu["correlation_id"].fillna(0) > 0)]
        plain = joined[~joined["launch_api"].astype(str).str.contains("GraphLaunch")]
        shared_ids = plain[plain.duplicated(["pid", "correlation_id"], keep=False)]
        if len(shared_ids):
            warnings.append(
                f"{len(shared_ids)} kernel records share the correlation id of one kernel launch call with another "
                f"kernel (first: {shared_ids['name'].iloc[0]!r}, correlation id {int(shared_ids['correlation_id'].iloc[0])}): "
                "each is attributed to that call's op although it launched one kernel; the trace may be merged "
                "from several runs or corrupt")
        valid = gpu["valid_time"].astype(bool) if "valid_time" in gpu else pd.Series(True, index=gpu.index)
        early = gpu[valid & gpu["launch_start_ns"].notna()
                    & (gpu["start_ns"] < gpu["launch_start_ns"].fillna(0).astype("int64"))]
        if len(early):
            warnings.append(f"{len(early)} kernels start before their launch call (first: {early['name'].iloc[0]!r}): "
                            "their timestamps are inconsistent (clock skew or an edited trace); durations kept as "
                            "recorded")
    if orphans:
        warnings.append(f"{orphans} kernel(s) have no launch record in the trace window (launched before the "
                        "profiler started, or a null/dangling correlation id): left unattributed")
    if ambiguous:
        warnings.append(f"{ambiguous} launch calls share their correlation id with another launch (traces of "
                        "several processes merged into one file?): their kernels cannot be joined and stay "
                        "unattributed; profile each process into its own trace")
    if invalid:
        warnings.append(f"{invalid} kernel record(s) carry an invalid timestamp (ts 0 or a negative dur): "
                        "attributed, but their time is unknown (counted as 0 ns, excluded from time shares)")
    if len(without) and len(gpu):  # (no kernel record at all is the warning above)
        warnings.append(f"{len(without)} launch(es) have no kernel record (possibly dropped as out-of-range by "
                        "the tracer): their device time is unknown")
    mode = external_id_mode(kernels)
    return {
        "file": str(path),
        "format": "kineto",
        "base_time_ns": int(trace.get("baseTimeNanoseconds") or 0) or None,
        "time_base": "relative" if trace.get("baseTimeNanoseconds") else "absolute_epoch",
        "devices": [{k: d.get(k) for k in ("id", "name", "computeMajor", "computeMinor", "numSms")}
                    for d in trace.get("deviceProperties") or [] if isinstance(d, dict)],
        "distributed": trace.get("distributedInfo"),
        "event_categories": dict(sorted(categories.items())),
        "counts": {
            "kernels": int(len(gpu)) if gpu_trace else 0,
            "cpu_kernels": 0 if gpu_trace else int(len(kernels)),
            "launch_calls": int(len(launches)),
            "orphan_kernels": orphans,
            "null_correlation_kernels": null_corr,
            "invalid_timestamp_kernels": invalid,
            "launches_without_kernel": int(len(without)),
            "memory_activities": len(memory_correlations),
        },
        # Launch calls per API that launched a kernel (a graph launch replaying 8 kernels counts once).
        "launch_apis": (gpu.dropna(subset=["launch_api"]).drop_duplicates(["pid", "correlation_id"])["launch_api"]
                        .value_counts().to_dict() if len(gpu) else {}),
        "launches_without_kernel": [
            {"api": a, "correlation_id": int(c), "pid": int(p), "tid": int(t), "start_ns": int(s), "end_ns": int(e)}
            for a, c, p, t, s, e in zip(without["api"], without["correlation_id"], without["pid"], without["tid"],
                                        without["start_ns"], without["end_ns"])
        ] if len(without) else [],
        "external_id_mode": mode,
        "warnings": warnings,
        "info": [],
    }


