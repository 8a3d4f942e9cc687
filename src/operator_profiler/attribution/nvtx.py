"""Path (b): kernel -> launch call -> the NVTX ranges open on the launching thread (nsys's own projection
rule); push/pop stacks per (process, thread, domain), start/end ranges kept apart as regions.
Details: docs/modules.md#attribution-nvtx."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..heap import release_free_memory, bulk_memory
from ..naming import MEASURED_RANGE, NVTX_DOMAIN, PHASE_PREFIX
from ..timeline.nesting import parent_rows, stack_keys, unpack_stack_key
from .row_groups import group_codes, path_codes

DEFAULT_OPERATOR_DOMAINS = ("default",)
NO_ITEMS: list[str] = []  # shared, never mutated
log = logging.getLogger(__name__)
# Autograd nodes: "MmBackward0", "autograd::engine::evaluate_function: MmBackward0".
BACKWARD_NODE = re.compile(r"(Backward\d*$)|(^autograd::engine::evaluate_function: )")

REASONS = {
    "null_correlation": "the kernel has no correlation id (NULL or <= 0), so its launch call is unknown",
    "no_launch_record": "no CUDA API call in the same process has the kernel's correlation id",
    "pid_reused": "several processes used the kernel's pid in turn (correlation ids restart in each) and the kernel's "
                  "process could not be told, so its launch call is not known (docs/field-cases.md C25)",
    "cuda_graph_replay": "replayed from a CUDA graph without the capture-time node event (or traced at graph level)",
    "no_nvtx_ranges": "the capture has no NVTX push/pop ranges",
    "no_operator_range": "NVTX ranges enclose the launch, but none names an operator (not in an operator domain, a "
                         "layer/iteration marker, or ignored by nvtx.ignore_ranges)",
    "range_on_other_thread": "an operator range is open at launch time, but on another thread (e.g. backward on the "
                             "autograd thread)",
    "no_enclosing_range": "no NVTX range encloses the launch call",
    "unclosed_range": "attributed to a range never closed before the capture ended (low confidence)",
}


@dataclass(frozen=True)
class NvtxOptions:
    """Which NVTX ranges name operators.

    ``operator_domains``: NVTX domain names whose push/pop ranges name operators (``default`` = the
    unnamed domain 0). ``ignore_ranges``: regular expressions *searched* in the range name (anchor
    with ``^...$`` for a whole name); a matching range is never the operator (library bookkeeping
    ranges), the search goes on to its parent.

    Raises:
        ConfigError: an empty domain name or an invalid regular expression.
    """

    operator_domains: tuple[str, ...] = DEFAULT_OPERATOR_DOMAINS
    ignore_ranges: tuple[str, ...] = ()

    def __post_init__(self):
        from ..errors import ConfigError  # not ..config: jsonschema and yaml are not needed here

        for domain in self.operator_domains:
            if not isinstance(domain, str) or not domain:
                raise ConfigError(f"NVTX operator domain {domain!r}: give a domain name ('default' for the unnamed domain)")
        for pattern in self.ignore_ranges:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"NVTX ignore-range pattern {pattern!r} is not a regular expression ({exc})") from None

    @classmethod
    def from_config(cls, section: dict | None) -> NvtxOptions:
        section = section or {}
        return cls(tuple(section.get("operator_domains", DEFAULT_OPERATOR_DOMAINS)),
                   tuple(section.get("ignore_ranges", ())))


class _Ranges:
    """Push/pop ranges as arrays (rows in ``ranges`` order) and, per (pid, tid, domain), their order by start."""

    def __init__(self, ranges: pd.DataFrame):
        n = len(ranges)
        self.n = n
        self.range_id = ranges["range_id"].to_numpy(dtype=np.int64)
        self.parent = parent_rows(self.range_id, ranges["parent_id"])  # (a parent missing from the table: -1)
        self.start = ranges["start_ns"].to_numpy(dtype=np.int64)
        end = ranges["effective_end_ns"] if "effective_end_ns" in ranges else ranges["end_ns"]
        self.end = end.to_numpy() if end.dtype == np.int64 else \
            end.astype("Int64").fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)
        # Names stay in Arrow (millions of ranges, few names needed): see name_of(). The column's own Arrow
        # array where it is one (pandas' str: large_string), not a copy.
        self.names = pa.array(ranges["name"].astype("str")) if n else pa.array([], pa.string())
        if isinstance(self.names, pa.ChunkedArray):  # (a table read from parquet: one chunk per row group)
            self.names = self.names.combine_chunks()
        self._name_codes: np.ndarray | None = None
        self._distinct_names = pa.array([], pa.string())  # (set with the codes)
        domain_code, self.domain_labels = pd.factorize(ranges["domain"])
        self.domain_code = np.asarray(domain_code, dtype=np.int64)
        self.pid = ranges["pid"].to_numpy(dtype=np.int64)
        self.tid = ranges["tid"].to_numpy(dtype=np.int64)
        self.push_pop = (ranges["kind"] == "nvtx_push_pop").to_numpy()
        self.is_layer = ranges["layer"].notna().to_numpy()
        # Our harness's ranges (layer, iteration, train-step phase, the measured window) never name an operator,
        # and the measured window is no region either (it encloses every kernel of the capture).
        self.is_marker = self.is_layer | ranges["iteration"].notna().to_numpy() | self._by_name(
            lambda names: pc.or_(pc.starts_with(names, PHASE_PREFIX), pc.equal(names, MEASURED_RANGE)))
        self.unclosed = ranges["unclosed"].fillna(False).to_numpy(dtype=bool) if "unclosed" in ranges else \
            ranges["end_ns"].isna().to_numpy()
        # Sequence numbers as int64 with a mask (as floats, two numbers above 2**53 could compare equal).
        seq = pd.array(ranges["seq"], dtype="Int64")
        self.seq, self.has_seq = seq.to_numpy(dtype=np.int64, na_value=0), ~seq.isna()
        stashed = pd.array(ranges["stashed_seq"] if "stashed_seq" in ranges else [pd.NA] * n, dtype="Int64")
        self.stashed, self.has_stashed = stashed.to_numpy(dtype=np.int64, na_value=0), ~stashed.isna()
        self.backward_node = self._by_name(lambda names: pc.match_substring_regex(names, BACKWARD_NODE.pattern))
        present = np.sort(pd.unique(self.domain_code[self.push_pop])) if n else []
        self.domains = sorted(str(self.domain_labels[c]) for c in present)
        # (pid, tid, domain) -> (starts sorted, rows in that order); one integer key per stack.
        self.groups: dict[tuple[int, int, str], tuple[np.ndarray, np.ndarray]] = {}
        push_pop_rows = np.flatnonzero(self.push_pop)
        keys = stack_keys(self.pid[push_pop_rows], self.tid[push_pop_rows], self.domain_code[push_pop_rows])
        for key, positions in pd.Series(keys).groupby(keys, sort=False).indices.items():
            rows = push_pop_rows[positions]
            # By start, longest first on ties (a parent before the child that starts with it); the
            # table's own row order is not relied on (only taken when it is that order already).
            start, end = self.start[rows], self.end[rows]
            step = np.diff(start)
            if not ((step > 0) | ((step == 0) & (end[1:] <= end[:-1]))).all():
                order = np.lexsort((-end, start))
                start, rows = start[order], rows[order]
            pid, tid, code = (int(v) for v in unpack_stack_key(key))
            self.groups[(pid, tid, str(self.domain_labels[code]))] = (start, rows)

    def _by_name(self, test) -> np.ndarray:
        """``test`` (an Arrow compute call on a string array) of each range's name, evaluated once per distinct
        name; False for a null name or a null result."""
        if not self.n:
            return np.zeros(0, dtype=bool)
        codes = self.name_codes()
        hit = pc.fill_null(test(self._distinct_names), False).to_numpy(zero_copy_only=False)
        return np.append(hit, False)[codes]  # (code -1, a null name: the appended False)

    def name_codes(self) -> np.ndarray:
        """Each range's name as an integer code (equal names, equal codes; -1 for a null name), computed once."""
        if self._name_codes is None:
            self._name_codes = np.zeros(0, dtype=np.int64)
            if self.n:
                encoded = pc.dictionary_encode(self.names)
                if isinstance(encoded, pa.ChunkedArray):
                    encoded = encoded.combine_chunks()
                self._name_codes = pc.fill_null(encoded.indices, -1).to_numpy().astype(np.int64)
                self._distinct_names = encoded.dictionary
        return self._name_codes

    def name_of(self, rows: np.ndarray) -> np.ndarray:
        """Range names of ``rows`` as an object array; None for -1."""
        rows = np.asarray(rows, dtype=np.int64)
        if not self.n:
            return np.full(len(rows), None, dtype=object)
        taken = self.names.take(pa.array(np.maximum(rows, 0), mask=rows < 0))
        return taken.to_numpy(zero_copy_only=False).astype(object)

    def in_domains(self, labels) -> np.ndarray:
        codes = [i for i, label in enumerate(self.domain_labels) if label in set(labels)]
        return np.isin(self.domain_code, codes)

    def innermost(self, pid: np.ndarray, tid: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> dict[str, np.ndarray]:
        """Per domain, the row of the innermost push/pop range on (pid, tid) with start <= t0 and end >= t1
        (-1 if none). Arrays are aligned with the queries; rows with pid < 0 are no query."""
        m = len(t0)
        out = {d: np.full(m, -1, dtype=np.int64) for d in self.domains}
        if not m or not self.groups:
            return out
        queries = pd.DataFrame({"pid": pid, "tid": tid})
        valid = pid >= 0
        for (qpid, qtid), index in queries[valid].groupby(["pid", "tid"], sort=False).indices.items():
            idx = np.flatnonzero(valid)[index]
            for domain in self.domains:
                group = self.groups.get((int(qpid), int(qtid), domain))
                if group is None:
                    continue
                starts, rows = group
                pos = np.searchsorted(starts, t0[idx], side="right") - 1
                cand = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
                out[domain][idx] = self._climb_until(cand, lambda c, k=idx: self.end[c] >= t1[k])
        return out

    def _climb_until(self, cand: np.ndarray, ok) -> np.ndarray:
        """Walk each candidate up its parents until ``ok(rows)`` (a boolean array over all candidates,
        evaluated with -1 replaced by row 0) holds for it, or no parent is left (-1)."""
        cand = cand.copy()
        while True:
            live = np.flatnonzero(cand >= 0)
            if not len(live):
                return cand
            good = np.asarray(ok(np.where(cand >= 0, cand, 0)))[live]
            bad = live[~good]
            if not len(bad):
                return cand
            cand[bad] = self.parent[cand[bad]]

    def climb(self, cand: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """Nearest ancestor-or-self of each row with ``eligible[row]``, -1 if none."""
        return self._climb_until(cand, lambda c: eligible[c])


@dataclass
class Enclosure:
    """What path (b) found, aligned with the kernels' rows."""

    context_pid: np.ndarray
    context_tid: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    innermost: dict[str, np.ndarray]  # domain -> innermost range row
    replay: np.ndarray  # CUDA-graph replay without a capture-time node
    # The launch call itself (differs from the context for a graph node kernel: the cudaGraphLaunch
    # of the replay, not the node's capture): regions and the GPU projection are about the replay.
    launch_pid: np.ndarray
    launch_tid: np.ndarray
    l0: np.ndarray
    l1: np.ndarray
    captured: np.ndarray  # kernels whose context is a capture-time node event


def _contexts(kernels: pd.DataFrame) -> tuple:
    """(pid, tid, t0, t1, replay, launch (pid, tid, t0, t1), captured): the CPU interval whose
    enclosing ranges name each kernel, and the launch call itself.

    A kernel normally uses its launch call. A CUDA-graph node kernel uses the node's creation at
    capture time when the export has it (NVTX ranges are recorded at capture, not replay); otherwise,
    and for graph-level rows, it is a replay without context (its launch still gives evidence).
    """
    n = len(kernels)

    def col(name: str) -> pd.Series:
        return kernels[name] if name in kernels else pd.Series([pd.NA] * n, dtype="Int64", index=kernels.index)

    has_capture = col("capture_tid").notna().to_numpy()
    has_launch = col("launch_tid").notna().to_numpy() & col("launch_start_ns").notna().to_numpy()
    graph_row = (col("activity").astype(object) == "graph").to_numpy() if "activity" in kernels else np.zeros(n, bool)
    node_kernel = col("graph_node_id").notna().to_numpy()
    replay = graph_row | (node_kernel & ~has_capture)

    def ints(series: pd.Series) -> np.ndarray:
        return series.astype("Int64").fillna(-1).to_numpy(dtype=np.int64)

    launch_pid = np.where(has_launch, kernels["pid"].to_numpy(dtype=np.int64), -1)
    launch = (launch_pid, np.where(has_launch, ints(col("launch_tid")), -1), ints(col("launch_start_ns")),
              ints(col("launch_end_ns")))
    pid = np.where(has_capture, ints(col("capture_pid")), launch[0])
    tid = np.where(has_capture, ints(col("capture_tid")), launch[1])
    t0 = np.where(has_capture, ints(col("capture_start_ns")), launch[2])
    t1 = np.where(has_capture, ints(col("capture_end_ns")), launch[3])
    return pid, tid, t0, t1, replay, launch, has_capture


def enclose(kernels: pd.DataFrame, index: _Ranges) -> Enclosure:
    """The innermost range of every domain around each kernel's context (see :func:`_contexts`)."""
    pid, tid, t0, t1, replay, launch, captured = _contexts(kernels)
    return Enclosure(pid, tid, t0, t1, index.innermost(pid, tid, t0, t1), replay, *launch, captured)


def launch_innermost(found: Enclosure, index: _Ranges) -> dict[str, np.ndarray]:
    """Innermost ranges around the launch calls themselves (the same as ``found.innermost`` unless
    some kernel is a CUDA-graph node placed at its capture)."""
    if not found.captured.any():
        return found.innermost
    return index.innermost(found.launch_pid, found.launch_tid, found.l0, found.l1)


def _pick_innermost(index: _Ranges, candidates: list[np.ndarray], m: int) -> np.ndarray:
    """Across domains, the candidate with the latest start (the innermost), -1 if none."""
    best = np.full(m, -1, dtype=np.int64)
    best_start = np.full(m, np.iinfo(np.int64).min, dtype=np.int64)
    for cand in candidates:
        ok = cand >= 0
        start = np.where(ok, index.start[np.maximum(cand, 0)], np.iinfo(np.int64).min)
        better = ok & (start >= best_start)
        best[better], best_start[better] = cand[better], start[better]
    return best


def _layer_rows(index: _Ranges, innermost: dict[str, np.ndarray], m: int) -> np.ndarray:
    return _pick_innermost(index, [index.climb(c, index.is_layer) for c in innermost.values()], m)


def _forward_rows(index: _Ranges, op_rows: np.ndarray, eligible: np.ndarray
                  ) -> tuple[np.ndarray, pd.arrays.IntegerArray]:
    """(forward op row, backward seq used: null where none) for each operator row.

    The innermost range at or above the op carrying ``stashed seq = N``, or a backward node with
    ``seq = N``, names N. The forward op is an operator range of the same process with ``seq = N``
    that is not itself inside a backward node (sequence numbers are per thread, so ops the autograd
    thread runs have numbers of their own that can collide), and the latest such one that started
    before the backward range did.
    """
    m = len(op_rows)
    forward = np.full(m, -1, dtype=np.int64)
    seq_used = pd.arrays.IntegerArray(np.zeros(m, dtype=np.int64), np.ones(m, dtype=bool))
    if not m or not index.n:
        return forward, seq_used
    links = index.has_stashed | (index.backward_node & index.has_seq)
    linked = index.climb(op_rows, links)
    has = np.flatnonzero(linked >= 0)
    if not len(has):
        return forward, seq_used
    rows = linked[has]
    seq_used[has] = np.where(index.has_stashed[rows], index.stashed[rows], index.seq[rows])
    in_backward = index.climb(np.where(index.parent >= 0, index.parent, -1), index.backward_node) >= 0
    candidates = np.flatnonzero(eligible & ~index.backward_node & ~in_backward & index.has_seq)
    if not len(candidates):
        return forward, seq_used
    # Candidates sorted by (pid, seq, start): the answer is the last one at or before the backward range's start.
    order = np.lexsort((index.start[candidates], index.seq[candidates], index.pid[candidates]))
    candidates = candidates[order]
    keys = pd.MultiIndex.from_arrays([index.pid[candidates], index.seq[candidates]])
    first = pd.Series(np.arange(len(candidates)), index=keys).groupby(level=[0, 1]).agg(["min", "max"])
    inverse, unique_rows = pd.factorize(rows)  # one lookup per backward range (hash: numpy's unique is slow)
    unique_seq = np.where(index.has_stashed[unique_rows], index.stashed[unique_rows], index.seq[unique_rows])
    bounds = first.reindex(pd.MultiIndex.from_arrays([index.pid[unique_rows], unique_seq]))
    starts = index.start[candidates]
    answer = np.full(len(unique_rows), -1, dtype=np.int64)
    for i, (lo, hi, t) in enumerate(zip(bounds["min"], bounds["max"], index.start[unique_rows])):
        if np.isnan(lo):
            continue
        lo, hi = int(lo), int(hi)
        pos = lo + int(np.searchsorted(starts[lo:hi + 1], t, side="right")) - 1
        if pos >= lo:
            answer[i] = candidates[pos]
    forward[has] = answer[inverse]
    return forward, seq_used


def _operator_eligible(index: _Ranges, options: NvtxOptions) -> np.ndarray:
    eligible = index.push_pop & ~index.is_marker & index.in_domains(options.operator_domains)
    if index.n:  # a range without a name never names an operator
        eligible &= pc.not_equal(pc.fill_null(index.names, ""), "").to_numpy(zero_copy_only=False)
    if options.ignore_ranges and index.n:
        pattern = "|".join(f"(?:{p})" for p in options.ignore_ranges)
        try:
            ignored = pc.fill_null(pc.match_substring_regex(index.names, pattern), False).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:  # a Python-only regex feature (RE2 has no lookaround): match name by name
            compiled = re.compile(pattern)
            ignored = np.array([bool(compiled.search(s)) for s in index.names.to_pylist()], dtype=bool)
        eligible &= ~ignored
    return eligible


def kernel_layer_ranges(kernels: pd.DataFrame, ranges: pd.DataFrame) -> np.ndarray:
    """range_id of each kernel's layer range (-1 if none), for :mod:`operator_profiler.layers`.

    The innermost ``opprof.layer:`` range enclosing the kernel's launch on its thread; for a backward
    kernel outside every layer range, the layer range of its forward op (through ``seq``).
    """
    index = _Ranges(ranges)
    found = enclose(kernels, index)
    m = len(kernels)
    layer = _layer_rows(index, found.innermost, m)
    missing = layer < 0
    if missing.any() and index.n:
        eligible = _operator_eligible(index, NvtxOptions(operator_domains=tuple(index.domains)))
        op = _pick_innermost(index, [index.climb(found.innermost[d], eligible) for d in index.domains], m)
        forward, _ = _forward_rows(index, op, eligible)
        layer = np.where(missing, _range_layers(index, forward), layer)
    return np.where(layer >= 0, index.range_id[np.maximum(layer, 0)], -1)


def _range_layers(index: _Ranges, rows: np.ndarray) -> np.ndarray:
    """The layer range row enclosing each range row (-1 for -1 or none), on the range's own thread."""
    ok = rows >= 0
    safe = np.maximum(rows, 0)
    pid = np.where(ok, index.pid[safe], -1)
    tid = np.where(ok, index.tid[safe], -1)
    inner = index.innermost(pid, tid, index.start[safe], index.end[safe])
    return np.where(ok, _layer_rows(index, inner, len(rows)), -1)


def _region_hits(index: _Ranges, pid: np.ndarray, t0: np.ndarray, t1: np.ndarray):
    """For each start/end range (in start order): (its row, the kernels of its process whose
    [t0, t1] it encloses). Kernels sorted by t0 once, so each region costs a binary search plus
    its hits."""
    se = np.flatnonzero(~index.push_pop & ~index.is_marker)
    if not len(se) or not len(t0):
        return
    order = np.argsort(t0, kind="stable")
    sorted_t0 = t0[order]
    for row in se[np.lexsort((index.range_id[se], index.start[se]))]:  # (equal starts: by id, not by row order)
        lo, hi = np.searchsorted(sorted_t0, index.start[row], "left"), np.searchsorted(sorted_t0, index.end[row], "right")
        hits = order[lo:hi]
        yield row, hits[(t1[hits] <= index.end[row]) & (pid[hits] == index.pid[row])]


def _regions(index: _Ranges, pid: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> tuple[list[list[str]], np.ndarray]:
    """Start/end ranges of the same process enclosing each [t0, t1], in start order (docs/field-cases.md C09),
    and whether each has any."""
    out: list[list[str]] = [NO_ITEMS] * len(t0)  # replaced by a fresh list for kernels inside a region
    has = np.zeros(len(t0), dtype=bool)
    for row, hits in _region_hits(index, pid, t0, t1):
        region_name = index.name_of(np.array([row]))[0]
        has[hits] = True
        for k in hits:
            out[k] = [*out[k], region_name]
    return out, has


def _other_thread_ranges(index: _Ranges, eligible: np.ndarray, pid: np.ndarray, t0: np.ndarray,
                         t1: np.ndarray) -> np.ndarray:
    """Whether an operator range of the same process (any thread) encloses [t0, t1]."""
    m = len(t0)
    found = np.zeros(m, dtype=bool)
    rows = np.flatnonzero(eligible)
    if not len(rows) or not m:
        return found
    for p in np.sort(pd.unique(pid[pid >= 0])):
        mine = rows[index.pid[rows] == p]
        if not len(mine):
            continue
        mine = mine[np.argsort(index.start[mine], kind="stable")]
        max_end = np.maximum.accumulate(index.end[mine])
        q = np.flatnonzero(pid == p)
        pos = np.searchsorted(index.start[mine], t0[q], side="right") - 1
        found[q] = (pos >= 0) & (max_end[np.maximum(pos, 0)] >= t1[q])
    return found


def _json_literals(arr: pa.Array) -> pa.Array:
    """Each string as a JSON string literal, in Arrow (quote and backslash escaped); the rare strings
    with control characters go through ``json.dumps``."""
    arr = arr.cast(pa.string())  # (range names may come as large_string)
    escaped = pc.replace_substring(pc.replace_substring(arr, "\\", "\\\\"), '"', '\\"')
    out = pc.binary_join_element_wise('"', escaped, '"', "")
    special = np.flatnonzero(pc.fill_null(pc.match_substring_regex(arr, r"[\x00-\x1f]"), False).to_numpy(
        zero_copy_only=False))
    if len(special):
        values = out.to_numpy(zero_copy_only=False).astype(object)
        for i in special:
            values[i] = json.dumps(arr[int(i)].as_py(), ensure_ascii=False)
        out = pa.array(values, type=pa.string())
    return out


def _json_strings(values: np.ndarray) -> np.ndarray:
    """:func:`_json_literals` of Python strings, as an object array."""
    values = np.asarray(values, dtype=object)
    if not len(values):
        return values
    return _json_literals(pa.array(values, type=pa.string())).to_numpy(zero_copy_only=False).astype(object)


def _stack_json(index: _Ranges, rows: np.ndarray) -> tuple[pa.Array, np.ndarray, pa.Array]:
    """JSON lists of range names from the outermost ancestor down to each of ``rows`` and their
    ancestors, built in Arrow level by level (a child's list is its parent's plus its name).

    Returns (stacks, position of each range row in ``stacks`` or -1, the JSON name literal of the
    same positions).
    """
    needed = np.zeros(index.n, dtype=bool)
    up = pd.unique(rows[rows >= 0])  # (numpy's hash unique takes seconds on millions)
    while len(up):
        up = up[~needed[up]]
        needed[up] = True
        up = index.parent[up]
        up = up[up >= 0]
    needed_rows = np.flatnonzero(needed)
    depth = np.zeros(len(needed_rows), dtype=np.int64)
    up = index.parent[needed_rows].copy()
    while (live := np.flatnonzero(up >= 0)).size:
        depth[live] += 1
        up[live] = index.parent[up[live]]
    # Order the needed rows by level so each level is a contiguous block of the result.
    order = np.argsort(depth, kind="stable")
    needed_rows, depth = needed_rows[order], depth[order]
    position = np.full(index.n, -1, dtype=np.int64)
    position[needed_rows] = np.arange(len(needed_rows))
    names = _json_literals(index.names.take(pa.array(needed_rows)))
    blocks: list[pa.Array] = []
    done = 0
    for level in range(int(depth.max()) + 1 if len(depth) else 0):
        count = int((depth == level).sum())
        level_names = names.slice(done, count)
        if level == 0:
            blocks.append(pc.binary_join_element_wise("[", level_names, "]", ""))
        else:
            previous = pa.concat_arrays(blocks) if len(blocks) > 1 else blocks[0]
            parents = previous.take(pa.array(position[index.parent[needed_rows[done:done + count]]]))
            open_list = pc.utf8_slice_codeunits(parents, 0, -1)  # drop the closing bracket
            blocks.append(pc.binary_join_element_wise(open_list, ", ", level_names, "]", ""))
        done += count
    stacks = pa.concat_arrays(blocks) if blocks else pa.array([], type=pa.string())
    return stacks, position, names


def _evidence_json(index: _Ranges, shown: np.ndarray, op_rows: np.ndarray, found: Enclosure, tag_domains: list[str],
                   regions: list[list[str]], has_regions: np.ndarray, seq_used: pd.arrays.IntegerArray, forward: np.ndarray,
                   reason: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``{"nvtx": {...}}`` per kernel with sorted keys: backward_seq, cuda_graph_replay, forward_link,
    operator, reason, regions, stack, tags. Kernels whose pieces agree (the same head and middle keys,
    operator name, list of stack names and tag names) share one text: each distinct text is assembled
    once (:func:`_evidence_texts`), and the column is a categorical of them (no string per kernel)."""
    m = len(shown)
    if not m:
        return pd.array([], dtype="str")
    head_rows = np.flatnonzero(~seq_used.isna() | found.replay)
    heads = []  # keys before "operator"
    for k in head_rows:
        parts = []
        if not pd.isna(seq_used[k]):
            parts.append(f'"backward_seq": {int(seq_used[k])}')
        if found.replay[k]:
            parts.append('"cuda_graph_replay": true')
        if not pd.isna(seq_used[k]) and forward[k] < 0:
            note = f"no forward op with seq = {int(seq_used[k])} (no stashed-seq marker)"
            parts.append(f'"forward_link": {json.dumps(note)}')
        heads.append("".join(p + ", " for p in parts))
    middle_rows = np.flatnonzero(pd.notna(reason) | has_regions)
    middles = []  # keys between "operator" and "stack"
    for k in middle_rows:
        parts = []
        if reason[k] is not None:
            parts.append(f'"reason": {json.dumps(reason[k])}')
        if regions[k]:
            parts.append(f'"regions": {json.dumps(regions[k])}')
        middles.append("".join(", " + p for p in parts))
    # Each as a code into its distinct texts (0: ""): hashing a million Python strings costs more.
    head, head_texts = _text_codes(m, head_rows, heads)
    middle, middle_texts = _text_codes(m, middle_rows, middles)
    tags = {d: found.innermost[d] for d in tag_domains}
    if index.n:
        names = index.name_codes()
        named = [np.where(rows >= 0, names[np.maximum(rows, 0)], -2) for rows in (op_rows, *tags.values())]
        group = group_codes([head, middle, path_codes(index.parent, names, shown), *named])
    else:
        group = group_codes([head, middle])
    first = np.unique(group, return_index=True)[1]  # one kernel per distinct text, in code order
    texts = _evidence_texts(index, shown[first], op_rows[first], {d: rows[first] for d, rows in tags.items()},
                            head_texts[head[first]], middle_texts[middle[first]])
    # A categorical: a million kernels share a few thousand texts (written as plain strings, the table contract).
    text_of_group, distinct = pd.factorize(texts.to_pandas())
    return pd.Categorical.from_codes(text_of_group[group], categories=pd.Index(distinct, dtype="str"))


def _filled(m: int, value) -> np.ndarray:
    """An object array of ``m`` references to ``value`` (a list of them is converted element by element)."""
    out = np.empty(m, dtype=object)
    out.fill(value)
    return out


def _text_codes(m: int, rows: np.ndarray, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` (one per row of ``rows``, the other of ``m`` rows: "") as (a code per row, the distinct texts
    with "" at code 0)."""
    codes = np.zeros(m, dtype=np.int64)
    if not len(rows):
        return codes, np.array([""], dtype=object)
    found, distinct = pd.factorize(np.array(texts, dtype=object))
    codes[rows] = found + 1
    return codes, np.concatenate([np.array([""], dtype=object), np.asarray(distinct, dtype=object)])


def _evidence_texts(index: _Ranges, shown: np.ndarray, op_rows: np.ndarray, tags: dict[str, np.ndarray],
                    head: np.ndarray, middle: np.ndarray) -> pa.Array:
    """The evidence JSON of the kernels given by their pieces, assembled in Arrow."""
    m = len(shown)
    if index.n:
        stacks, position, names = _stack_json(index, np.concatenate([shown, op_rows]))
        at = position[np.maximum(shown, 0)]
        stack_part = pc.fill_null(stacks.take(pa.array(np.maximum(at, 0), mask=(shown < 0) | (at < 0))), "[]")
        at = position[np.maximum(op_rows, 0)]
        op_part = pc.fill_null(names.take(pa.array(np.maximum(at, 0), mask=(op_rows < 0) | (at < 0))), "null")
    else:
        stack_part = pa.array(["[]"] * m, type=pa.string())
        op_part = pa.array(["null"] * m, type=pa.string())
    # Tags: one '"domain": "name"' piece per tag domain (null where untagged), joined pairwise where
    # both are present. Not null_handling="skip": pyarrow drops the rows where every piece is null.
    joined = None
    for domain, rows in tags.items():
        if index.n and (rows >= 0).any():
            names = _json_literals(index.names.take(pa.array(np.maximum(rows, 0), mask=rows < 0)))
            piece = pc.binary_join_element_wise(f"{json.dumps(domain)}: ", names, "")
            joined = piece if joined is None else pc.coalesce(pc.binary_join_element_wise(joined, piece, ", "),
                                                              joined, piece)
    if joined is not None:
        tail = pc.fill_null(pc.binary_join_element_wise(', "tags": {', joined, "}", ""), "")
    else:
        tail = pa.array(np.full(m, "", dtype=object), type=pa.string())
    head, middle = (pa.array(piece, type=pa.string()) for piece in (head, middle))
    return pc.binary_join_element_wise('{"nvtx": {', head, '"operator": ', op_part, middle, ', "stack": ',
                                       stack_part, tail, "}}", "")


def _names_array(index: _Ranges, rows: np.ndarray):
    """Range names of ``rows`` (null for -1) as an Arrow-backed string array (no Python str per row)."""
    rows = np.asarray(rows, dtype=np.int64)
    if not index.n:
        return pd.array([None] * len(rows), dtype="str")
    return index.names.take(pa.array(np.maximum(rows, 0), mask=rows < 0)).to_pandas().array


def _warn_about_domains(index: _Ranges, options: NvtxOptions, found: Enclosure, reason: np.ndarray) -> None:
    """Say when the operator domains do not match the capture: a configured domain absent, or
    kernels left unattributed inside ranges of other domains (the fix is one option away)."""
    if not index.n:
        return
    missing = [d for d in options.operator_domains if d not in index.domains]
    if missing and index.domains:  # (no push/pop ranges at all: the reader said so already)
        log.warning("NVTX operator domain(s) %s have no push/pop ranges in this capture; domains present: %s",
                    ", ".join(repr(d) for d in missing), ", ".join(repr(d) for d in index.domains) or "none")
    stuck = reason == "no_operator_range"
    if stuck.any():
        others = [d for d in index.domains if d not in options.operator_domains and (found.innermost[d][stuck] >= 0).any()]
        if others:
            log.warning("%d kernel(s) are inside NVTX ranges of domain(s) %s only, which do not name operators "
                        "(operator domains: %s); to use them: --nvtx-operator-domain DOMAIN (config "
                        "nvtx.operator_domains)", int(stuck.sum()), ", ".join(repr(d) for d in others),
                        ", ".join(repr(d) for d in options.operator_domains))


def _launch_refused(kernels: pd.DataFrame) -> np.ndarray:
    """Kernels the timeline reader left without a launch call because their process could not be told (column
    ``launch_refused``, written only for exports where several processes used one pid)."""
    if "launch_refused" not in kernels:
        return np.zeros(len(kernels), dtype=bool)
    return kernels["launch_refused"].notna().to_numpy(dtype=bool)


@bulk_memory(system_pool=True)
def attribute_nvtx(kernels: pd.DataFrame, ranges: pd.DataFrame, kernel_layers: pd.DataFrame,
                   options: NvtxOptions = NvtxOptions()) -> pd.DataFrame:
    """Attribute every kernel of an nsys timeline by NVTX enclosure.

    Args:
        kernels, ranges: timeline tables of :func:`operator_profiler.timeline.nsys.read_nsys` (DESIGN.md §3).
        kernel_layers: ``kernel_id, layer, module, layer_class`` from :func:`operator_profiler.layers.classify_layers`.
        options: which domains/ranges name operators.

    Returns:
        The ATTRIBUTION columns plus ``operator_range_id``, ``duration_ns`` (ns), ``iteration``, ``name``
        and ``regions`` (start/end range names). ``path`` is ``nvtx`` or ``unattributed``; ``reason`` is
        one of :data:`REASONS` (``unclosed_range`` also on attributed kernels: low confidence);
        ``evidence`` is JSON ``{"nvtx": {"stack", "operator", "tags", "regions", ...}}`` (a categorical:
        kernels share a few distinct texts; the parquet file holds plain strings).
    """
    release_free_memory()  # what the stages before left free (this is the peak of a big capture)
    index = _Ranges(ranges)
    m = len(kernels)
    found = enclose(kernels, index)
    eligible = _operator_eligible(index, options)
    op_domains = [d for d in index.domains if d in options.operator_domains]
    op_rows = _pick_innermost(index, [index.climb(found.innermost[d], eligible) for d in op_domains], m)
    op_rows = np.where(found.replay, -1, op_rows)
    forward, seq_used = _forward_rows(index, op_rows, eligible)
    regions, has_regions = _regions(index, found.launch_pid, found.l0, found.l1)

    # Reasons, most specific first.
    corr = kernels["correlation_id"].astype("Int64")
    no_corr = (corr.isna() | (corr.fillna(0) <= 0)).to_numpy()
    no_context = found.context_pid < 0
    any_range = _pick_innermost(index, list(found.innermost.values()), m) >= 0
    other_thread = _other_thread_ranges(index, eligible, np.where(no_context, -1, kernels["pid"].to_numpy(dtype=np.int64)),
                                        found.t0, found.t1)
    has_push_pop = bool(index.push_pop.any())
    reason = np.full(m, None, dtype=object)
    attributed = op_rows >= 0
    if index.n:
        reason[attributed & index.unclosed[np.maximum(op_rows, 0)]] = "unclosed_range"
    unattributed = ~attributed
    for condition, label in (
        (~any_range & ~other_thread, "no_enclosing_range"),
        (~any_range & other_thread, "range_on_other_thread"),
        (any_range, "no_operator_range"),
        (np.full(m, not has_push_pop), "no_nvtx_ranges"),
        (no_context & ~no_corr, "no_launch_record"),
        (no_context & no_corr, "null_correlation"),
        (found.replay, "cuda_graph_replay"),
        (no_context & _launch_refused(kernels), "pid_reused"),
    ):
        reason[unattributed & condition] = label  # later rows are more specific and win

    _warn_about_domains(index, options, found, reason)

    # Evidence: the operator-domain stack (or, when none, the innermost stack of any domain), the
    # innermost range of each other domain, and the process-level regions.
    shown = np.where(op_rows >= 0, op_rows, _pick_innermost(index, [found.innermost[d] for d in op_domains], m))
    shown = np.where(shown >= 0, shown, _pick_innermost(index, list(found.innermost.values()), m))
    tag_domains = [d for d in index.domains if d not in options.operator_domains and d != NVTX_DOMAIN]
    kernel_ids = kernels["kernel_id"].to_numpy(dtype=np.int64)
    operator = _names_array(index, np.where(attributed, op_rows, -1))
    fwd_name = _names_array(index, forward)
    evidence = _evidence_json(index, shown, op_rows, found, tag_domains, regions, has_regions, seq_used, forward,
                              reason)
    by_kernel = kernel_layers.set_index(kernel_layers["kernel_id"].astype("int64"))

    def pick(column: str) -> pd.api.extensions.ExtensionArray | np.ndarray:
        values = by_kernel[column].reindex(kernel_ids)
        return values.array if values.dtype != object else np.where(values.isna(), None, values.to_numpy())

    module, layer, layer_class = pick("module" if "module" in kernel_layers else "layer"), pick("layer"), \
        pick("layer_class")
    operator_range_id = pd.arrays.IntegerArray(
        index.range_id[np.maximum(op_rows, 0)] if index.n else np.zeros(m, dtype=np.int64), ~attributed)
    path = pa.array(["unattributed", "nvtx"]).take(pa.array(attributed.view(np.int8))).to_pandas().array
    # The range index and enclosure results are done with: the table below is a big capture's peak.
    del index, found, by_kernel, shown, op_rows, forward, other_thread
    release_free_memory()
    out = pd.DataFrame(
        {
            "kernel_id": kernel_ids,
            "operator": operator,
            "forward_operator": fwd_name,
            "module": module,
            "layer": layer,
            "layer_class": layer_class,
            "path": path,
            # One shared empty list: path (b) names no fused ops (a million separate lists cost 100 MB).
            "fused_ops": _filled(m, NO_ITEMS),
            "source_nodes": _filled(m, NO_ITEMS),
            "listed_not_computed": _filled(m, NO_ITEMS),
            "reason": reason,
            "evidence": evidence,
            "operator_range_id": operator_range_id,
            "duration_ns": kernels["duration_ns"].to_numpy(dtype=np.int64),
            "iteration": pd.array(kernels["iteration"], dtype="Int64"),
            "name": kernels["name"].astype("str").array,
            "regions": regions,
        },
        copy=False,
    )
    pa.default_memory_pool().release_unused()
    return out


def _as_str(column: pd.Series):
    """``column.astype("str").array``, the same values and dtype; a categorical of strings (the readers' ``domain``
    and ``kind``) is decoded from its codes (a take of its few categories), not through one Python object per row
    (1.6M projection rows: 0.4 s per column). Other categoricals take ``astype`` (it writes numbers with missing
    values as floats: ``3.0``)."""
    if isinstance(column.dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(column.cat.categories):
        return column.cat.categories.astype("str").array.take(column.cat.codes.to_numpy(), allow_fill=True)
    return column.astype("str").array


@bulk_memory(system_pool=True)
def gpu_projection(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """Per-stream GPU projection of every NVTX range, like nsys's ``nvtx_gpu_proj_trace`` (docs/formats.md#nsys-nvtx-projection).

    A kernel is projected onto every range of every domain on its launch thread's stacks that encloses
    its launch (and onto the start/end regions of its process); a CUDA-graph node kernel also onto the
    ranges open at its node's capture (their GPU span then covers every replay).

    Returns:
        One row per (range, stream): ``range_id, name, domain, kind, pid, tid, depth, stream,
        cpu_start_ns, cpu_end_ns, gpu_start_ns`` (first kernel start), ``gpu_end_ns`` (last kernel end),
        ``projected_duration_ns`` (gpu_end - gpu_start), ``kernel_count``, ``gpu_time_ns`` (sum of kernel
        durations). Times in ns.
    """
    columns = ["range_id", "name", "domain", "kind", "pid", "tid", "depth", "stream", "cpu_start_ns", "cpu_end_ns",
               "gpu_start_ns", "gpu_end_ns", "projected_duration_ns", "kernel_count", "gpu_time_ns"]
    if not len(ranges) or not len(kernels):
        return pd.DataFrame({c: pd.Series(dtype="int64" if c not in ("name", "domain", "kind") else object)
                             for c in columns})
    index = _Ranges(ranges)
    found = enclose(kernels, index)
    pairs_k, pairs_r = [], []
    # A kernel counts for the ranges around its launch call; a CUDA-graph node kernel also for the
    # ranges open where its node was captured (the op that made it), as nsys's projection does.
    starts = list(launch_innermost(found, index).values())
    if found.captured.any():
        starts += [np.where(found.captured, cand, -1) for cand in found.innermost.values()]
    for cand in starts:
        cand = cand.copy()
        while True:
            live = np.flatnonzero(cand >= 0)
            if not len(live):
                break
            pairs_k.append(live)
            pairs_r.append(cand[live])
            cand[live] = index.parent[cand[live]]
    for row, hits in _region_hits(index, found.launch_pid, found.l0, found.l1):
        pairs_k.append(hits)
        pairs_r.append(np.full(len(hits), row, dtype=np.int64))
    if not pairs_k:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c not in ("name", "domain", "kind") else object)
                             for c in columns})
    k = np.concatenate(pairs_k)
    del pairs_k
    r = np.concatenate(pairs_r)
    del pairs_r
    if found.captured.any():  # a range both around the launch and the capture counts the kernel once
        unique = pd.DataFrame({"k": k, "r": r}).drop_duplicates()
        k, r = unique["k"].to_numpy(), unique["r"].to_numpy()
        del unique
    # One group per (range row, stream), in that order, aggregated over the sorted pairs (what a pandas groupby of a
    # pairs table gave, with a fraction of its memory: 1M kernels, 5M pairs, 0.5 -> 0.2 GB at once).
    stream = kernels["stream"].to_numpy(dtype=np.int64)[k]
    order = np.lexsort((stream, r))
    k, r, stream = k[order], r[order], stream[order]
    del order
    first = np.flatnonzero(np.concatenate(([True], (r[1:] != r[:-1]) | (stream[1:] != stream[:-1]))))
    rows, group_stream = r[first], stream[first]
    del r, stream

    def per_group(column: str, reduce) -> np.ndarray:
        return reduce.reduceat(kernels[column].to_numpy(dtype=np.int64)[k], first)

    agg = {"stream": group_stream, "gpu_start_ns": per_group("start_ns", np.minimum),
           "gpu_end_ns": per_group("end_ns", np.maximum), "kernel_count": np.diff(np.append(first, len(k))),
           "gpu_time_ns": per_group("duration_ns", np.add)}
    range_id, cpu_start, cpu_end = index.range_id[rows], index.start[rows], index.end[rows]
    del k, index, found  # (the range index and the enclosure are done with: freed before the table is built)
    release_free_memory()
    sel = ranges[["name", "domain", "kind", "pid", "tid", "depth"]].iloc[rows]  # only what the table shows
    out = pd.DataFrame(
        {
            "range_id": range_id, "name": sel["name"].array, "domain": _as_str(sel["domain"]),
            "kind": _as_str(sel["kind"]), "pid": sel["pid"].to_numpy(dtype=np.int64),
            "tid": sel["tid"].to_numpy(dtype=np.int64), "depth": sel["depth"].to_numpy(dtype=np.int64),
            "stream": agg["stream"], "cpu_start_ns": cpu_start, "cpu_end_ns": cpu_end,
            "gpu_start_ns": agg["gpu_start_ns"], "gpu_end_ns": agg["gpu_end_ns"],
            "projected_duration_ns": agg["gpu_end_ns"] - agg["gpu_start_ns"],
            "kernel_count": agg["kernel_count"].astype(np.int64), "gpu_time_ns": agg["gpu_time_ns"].astype(np.int64),
        },
        copy=False,
    )
    return out if list(out.columns) == columns else out[columns]
