"""The timeline model every reader produces: the kernels, launches and ranges tables (``docs/DESIGN.md`` §3) in a
:class:`Timeline`, the operator name sets, and the queries over them that every stage shares (which iteration or
train-step phase a time lies in, launch order, the GPU's other activities). Readers (:mod:`.kineto`, :mod:`.nsys`)
only read their format into this model."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import tables
from ..files import write_parquet_atomic
from ..heap import release_free_memory, bulk_memory
from ..naming import PHASE_PREFIX, PHASES


@dataclass
class Timeline:
    kernels: pd.DataFrame
    launches: pd.DataFrame
    ranges: pd.DataFrame
    # What the reader noticed (counts, launch APIs, warnings including the malformed events repaired
    # or skipped, docs/field-cases.md C18); written as the timeline's diagnostics.json.
    diagnostics: dict = field(default_factory=dict)
    # memcpy/memset (ACTIVITY_COLUMNS), written as gpu_activities.parquet
    activities: pd.DataFrame | None = None

    @property
    def warnings(self) -> list[str]:
        return self.diagnostics.get("warnings", [])


# A dispatcher operator: exactly one "ns::name" (aten::addmm, prims::add, quantized::linear).
# Autograd nodes ("torch::autograd::AccumulateGrad", "autograd::engine::evaluate_function: X")
# do not match: they are wrappers whose work is the operators inside them.
DISPATCHER_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z0-9_.]+$")


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


#: ``gpu_activities.parquet``: GPU memcpy/memset work (not kernels: never attributed or counted in the
#: kernel totals, shown in trace.json). Times int ns; ``bytes`` int; ``copy_kind`` ``HtoD``, ``DtoH`` ...
ACTIVITY_COLUMNS = ["kind", "copy_kind", "pid", "device", "stream", "start_ns", "end_ns", "duration_ns", "bytes",
                    "correlation_id", "launch_tid", "launch_start_ns", "launch_end_ns", "launch_api"]


def all_null_ints(n: int) -> pd.arrays.IntegerArray:
    """An ``Int64`` column of ``n`` nulls (``pd.array([None] * n)`` builds and checks a list: 0.2 s per million)."""
    return pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))


def take_rows(frame: pd.DataFrame, order: np.ndarray) -> pd.DataFrame:
    """``frame``'s rows in ``order`` (positions), index reset, built one column at a time and emptying
    ``frame`` as it goes: each source column is freed once taken, so the copy costs one column at a
    time instead of a whole second table (a million-row table holds hundreds of MB). ``frame`` is left
    without columns: for a caller that is done with it."""
    columns = {}
    for name in list(frame.columns):
        column = frame.pop(name)
        columns[name] = column.array.take(order) if isinstance(column.dtype, pd.api.extensions.ExtensionDtype) \
            else column.to_numpy()[order]
        del column
    return pd.DataFrame(columns, copy=False)


def shared_values(values: np.ndarray) -> np.ndarray:
    """Whether each value occurs more than once in ``values`` (a bool array aligned with it). Values already in
    ascending order (the nsys exports' KERNEL rows by start, checked on the real ones; the launch calls of one
    process by correlation id) are compared with their neighbours, without hashing a million of them."""
    values = np.asarray(values)
    out = np.zeros(len(values), dtype=bool)
    if len(values) < 2:
        return out
    if values.dtype.kind in "iu" and bool((values[1:] >= values[:-1]).all()):
        same = values[1:] == values[:-1]
        out[1:] |= same
        out[:-1] |= same
        return out
    return pd.Series(values, copy=False).duplicated(keep=False).to_numpy(dtype=bool)


def exact_repeats(frame: pd.DataFrame, columns: list[str], eligible: np.ndarray | None = None) -> np.ndarray:
    """Rows that repeat an earlier row of ``frame`` in every one of ``columns`` (nulls equal to nulls): a record
    written twice (a corrupt or merged trace, docs/field-cases.md C24). Only ``eligible`` rows (all when None)
    count, as the repeat and as the row repeated. ``columns`` must include ``start_ns``: rows are compared only
    where their start is shared (:func:`shared_values`), so a table of a million rows with no repeat costs one pass
    over one column.
    Returns a bool array aligned with ``frame`` (True: drop, the first of each group kept)."""
    out = np.zeros(len(frame), dtype=bool)
    if len(frame) < 2:
        return out
    candidates = shared_values(frame["start_ns"].to_numpy())
    if eligible is not None:
        candidates = candidates & eligible
    rows = np.flatnonzero(candidates)
    if len(rows) < 2:
        return out
    subset = frame.iloc[rows][columns].astype(object)  # (few rows: object compares nulls as equal)
    subset = subset.where(subset.notna(), None)
    out[rows[subset.duplicated(keep="first").to_numpy()]] = True
    return out


def finish_kernels(kernels: pd.DataFrame, ranges: pd.DataFrame, source: str) -> pd.DataFrame:
    """Order kernels by launch, number them, and add duration, match_key, occurrence, iteration.

    Launch order: the launch call's start; launches with the same start (integer-µs Kineto timestamps) by
    correlation id, which CUPTI hands out in API-call order within a process; then by GPU start.
    ``kernels`` is emptied (its columns move to the result: :func:`take_rows`)."""
    order_key = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64")
    corr = (pd.array(kernels["correlation_id"], dtype="Int64").fillna(np.iinfo(np.int64).max)
            if "correlation_id" in kernels.columns else np.zeros(len(kernels), dtype=np.int64))
    start = kernels["start_ns"]
    if start.dtype.kind == "i":
        # One stable np.lexsort of int64 keys and one take (assign + sort_values + drop copied
        # the table three times and factorized each key).
        keys = [order_key.to_numpy(), *([kernels["pid"].to_numpy(dtype=np.int64)] if "pid" in kernels.columns else []),
                np.asarray(corr, dtype=np.int64), start.to_numpy()]
        kernels = take_rows(kernels, np.lexsort(keys[::-1]))
    else:  # a start column with nulls (never from our readers): pandas sorts them last
        kernels = kernels.assign(_order=order_key, _corr=np.asarray(corr, dtype=np.int64))
        kernels = kernels.sort_values(["_order", "pid", "_corr", "start_ns"] if "pid" in kernels.columns
                                      else ["_order", "_corr", "start_ns"], kind="stable")
        kernels = kernels.drop(columns=["_order", "_corr"]).reset_index(drop=True)
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
        kernels["range_id"] = all_null_ints(len(kernels))
        kernels["parent_kernel_id"] = all_null_ints(len(kernels))
    # The mangled name, else the name: a column of its own only where both are needed (otherwise the
    # column is shared, not copied: Kineto has no mangled names, nsys has them for every kernel).
    missing = kernels["mangled_name"].isna()
    kernels["match_key"] = (kernels["name"] if missing.all() else kernels["mangled_name"] if not missing.any()
                            else kernels["mangled_name"].fillna(kernels["name"]))
    # Per process: correlation ids and launch order are per process (a multi-rank capture, docs/field-cases.md C22).
    kernels["occurrence"] = kernels.groupby(["pid", "match_key"]).cumcount().astype("int64")
    kernels["source"] = source
    kernels["iteration"] = kernel_iterations(kernels, ranges)
    return kernels


def kernel_iterations(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.arrays.IntegerArray:
    """The measured iteration of each kernel: the iteration range open at its launch call (its start
    when the launch is unknown)."""
    if not ranges["iteration"].notna().any():
        return all_null_ints(len(kernels))
    launch = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64").to_numpy()
    return iteration_at(kernels["pid"].to_numpy(), launch, ranges)


def iteration_at(pids: np.ndarray, times: np.ndarray, ranges: pd.DataFrame) -> pd.arrays.IntegerArray:
    """Index of the iteration range of the same process (any thread) open at each time (ns), null if
    none. Iteration ranges of one process do not overlap; those of several processes (ranks) may, so
    each process is searched on its own. A range never closed (nsys) ends at ``effective_end_ns``."""
    its = ranges[ranges["iteration"].notna()]
    result = np.full(len(times), -1, dtype=np.int64)
    if not its.empty and len(times):
        rows = enclosing_range_rows(its, np.asarray(pids, dtype=np.int64), np.asarray(times, dtype=np.int64))
        inside = rows >= 0
        result[inside] = its["iteration"].to_numpy(dtype=np.int64)[rows[inside]]
    return pd.arrays.IntegerArray(np.maximum(result, 0), result < 0)


def enclosing_range_rows(marked: pd.DataFrame, pids: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per query (``pids[i]``, ``times[i]`` in ns): the position in ``marked`` of the range of that process that
    contains the time, -1 when none. ``marked``'s ranges of one process must not overlap (iteration or phase
    ranges, run one after another); a range never closed ends at ``effective_end_ns`` when present, else never."""
    out = np.full(len(times), -1, dtype=np.int64)
    end_col = "effective_end_ns" if "effective_end_ns" in marked else "end_ns"
    positions = pd.Series(np.arange(len(marked)), index=marked.index)
    for pid, mine in marked.groupby("pid"):
        mine = mine.sort_values("start_ns")
        q = np.flatnonzero(pids == int(pid))
        starts = mine["start_ns"].to_numpy(dtype=np.int64)
        ends = mine[end_col].astype("Int64").fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)
        pos = np.searchsorted(starts, times[q], side="right") - 1
        cand = np.maximum(pos, 0)
        inside = (pos >= 0) & (times[q] < ends[cand])
        out[q[inside]] = positions[mine.index].to_numpy()[cand[inside]]
    return out


def phase_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """Our harness's phase ranges (``opprof.phase:<phase>``, :data:`operator_profiler.naming.PHASES`) with
    their ``phase``; any thread, any domain (the NVTX copy in domain ``opprof`` or the default one)."""
    names = ranges["name"].astype("str")
    marked = ranges[names.str.startswith(PHASE_PREFIX).fillna(False).to_numpy(dtype=bool)]
    phase = marked["name"].astype("str").str.removeprefix(PHASE_PREFIX)
    return marked.assign(phase=phase)[phase.isin(PHASES).to_numpy(dtype=bool)]


def kernel_phases(kernels: pd.DataFrame, ranges: pd.DataFrame) -> np.ndarray:
    """The train-step phase of each kernel (``forward``, ``backward``, ``optimizer``; None outside every
    phase range, e.g. inference): the phase range of the same process open at its launch call (its start
    when the launch is unknown), whatever the thread. Backward kernels are launched by the autograd
    engine's threads while the main thread waits in ``loss.backward()`` inside the ``backward`` range, so
    the time on the process, not the thread, decides. Phase ranges of one process do not overlap (the
    harness runs them one after the other); a range never closed (nsys) ends at ``effective_end_ns``.
    Returns an object array aligned with ``kernels``."""
    out = np.full(len(kernels), None, dtype=object)
    marked = phase_ranges(ranges)
    if marked.empty or not len(kernels):
        return out
    times = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64").to_numpy()
    pids = kernels["pid"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
    rows = enclosing_range_rows(marked, pids, times)
    inside = rows >= 0
    out[inside] = marked["phase"].to_numpy(dtype=object)[rows[inside]]
    return out


def gpu_activity_summary(activities: pd.DataFrame | None, ranges: pd.DataFrame) -> dict:
    """What the GPU ran besides kernels, for diagnostics.json and the report: per kind (``memcpy``,
    ``memset``) ``count``, ``time_ns``, ``bytes`` and, for memcpy, ``by_copy_kind`` (``HtoD`` ...: the same
    three); ``in_iterations_time_ns``: the time of those launched inside a measured iteration range
    (None when the timeline has no iteration ranges). Times are GPU execution intervals in ns."""
    summary: dict = {"memcpy": None, "memset": None, "in_iterations_time_ns": None}
    if activities is None or not len(activities):
        return summary

    def totals(frame: pd.DataFrame) -> dict:
        return {"count": len(frame), "time_ns": int(frame["duration_ns"].sum()),
                "bytes": int(frame["bytes"].fillna(0).sum())}

    for kind, frame in activities.groupby("kind", sort=True):
        entry = totals(frame)
        if kind == "memcpy":
            entry["by_copy_kind"] = {str(k): totals(f) for k, f in frame.groupby(frame["copy_kind"].fillna("?"))}
        summary[str(kind)] = entry
    if ranges["iteration"].notna().any():
        at = activities["launch_start_ns"].fillna(activities["start_ns"]).astype("int64").to_numpy()
        pids = activities["pid"].fillna(-1).astype("int64").to_numpy()
        inside = iteration_at(pids, at, ranges).to_numpy(dtype=np.int64, na_value=-1) >= 0
        summary["in_iterations_time_ns"] = int(activities["duration_ns"].to_numpy()[inside].sum())
    return summary


def external_id_mode(kernels: pd.DataFrame) -> str:
    """What a GPU kernel's ``External id`` means in this trace (docs/formats.md#kineto-external-id).

    ``op_id``: the id of the op that launched it (Kineto after PR #873, 2024-02); ``correlation``:
    the kernel's own correlation id (Kineto before the fix, pytorch/kineto#843: never join it to ops);
    ``absent``: no kernel carries one.
    """
    if "external_id" not in kernels or not len(kernels):
        return "absent"
    both = kernels[kernels["external_id"].notna() & kernels["correlation_id"].notna()]
    if not len(both):
        return "absent"
    same = (both["external_id"].astype("int64") == both["correlation_id"].astype("int64")).mean()
    return "correlation" if same > 0.5 else "op_id"


@bulk_memory()
def write_timeline(timeline: Timeline, out_dir: Path) -> None:
    """Write ``kernels.parquet``, ``launches.parquet``, ``ranges.parquet`` into ``out_dir``."""
    out_dir = Path(out_dir)
    tables.write_table(timeline.kernels, tables.KERNELS, out_dir / "kernels.parquet")
    tables.write_table(timeline.launches, tables.LAUNCHES, out_dir / "launches.parquet")
    tables.write_table(timeline.ranges, tables.RANGES, out_dir / "ranges.parquet")
    activities = timeline.activities if timeline.activities is not None else pd.DataFrame(columns=ACTIVITY_COLUMNS)
    write_parquet_atomic(activities, out_dir / "gpu_activities.parquet")
    release_free_memory()  # the writers' buffers


def top_level_ops(ranges: pd.DataFrame) -> np.ndarray:
    """For each range (by position = range_id), the range id of its outermost enclosing dispatcher op
    (itself included), -1 when none. Ranges come parents first (the readers' pre-order)."""
    n = len(ranges)
    is_op = ((ranges["kind"] == "cpu_op") & ranges["name"].str.match(DISPATCHER_OP)).to_numpy(dtype=bool)
    parent = pd.array(ranges["parent_id"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    top = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        p = parent[i]
        top[i] = top[p] if 0 <= p < i and top[p] >= 0 else (i if is_op[i] else -1)
    return top
