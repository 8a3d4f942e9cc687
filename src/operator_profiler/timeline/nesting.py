"""Nesting of push/pop ranges per (process, thread, NVTX domain) stack: depth and parent of every range, and
the stack keys that name a stack (NVTX push/pop ranges nest per thread and per domain, not per thread alone)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def stack_keys(pid: np.ndarray, tid: np.ndarray, domain) -> np.ndarray:
    """One unsigned integer per (pid, tid, domain) push/pop stack: pid and tid are 24-bit (§2), and a
    capture has far fewer than 65,536 domains. ``domain`` is a name array (factorized here) or
    integer domain codes, or a categorical (its codes)."""
    if isinstance(getattr(domain, "dtype", None), pd.CategoricalDtype):
        domain = np.asarray(domain.codes if isinstance(domain, pd.Categorical) else domain.cat.codes, dtype=np.int64)
    domain = np.asarray(domain)
    if domain.dtype.kind not in "iu":
        domain, _ = pd.factorize(domain)
    if len(domain) and domain.min() < 0:  # a missing domain is a domain of its own, not every bit set
        domain = np.where(domain < 0, domain.max() + 1, domain)
    return ((np.asarray(pid, dtype=np.uint64) << np.uint64(40)) | (np.asarray(tid, dtype=np.uint64) << np.uint64(16))
            | np.asarray(domain, dtype=np.uint64))


def unpack_stack_key(key) -> tuple[int, int, int]:
    """:func:`stack_keys` -> (pid, tid, domain code)."""
    key = int(key)
    return key >> 40, (key >> 16) & 0xFFFFFF, key & 0xFFFF


def parent_rows(range_id: np.ndarray, parent_id) -> np.ndarray:
    """Each range's parent as a row of the table: -1 for none and for a ``parent_id`` that names no range of the
    table (rows filtered out). By position where the ids are the row numbers (as the readers write them)."""
    range_id = np.asarray(range_id, dtype=np.int64)
    parent_id = pd.array(parent_id, dtype="Int64")
    has = ~np.asarray(parent_id.isna(), dtype=bool)
    wanted = parent_id[has].to_numpy(dtype=np.int64)
    parent = np.full(len(range_id), -1, dtype=np.int64)
    if (range_id == np.arange(len(range_id))).all():
        parent[has] = np.where((wanted >= 0) & (wanted < len(range_id)), wanted, -1)
    else:
        parent[has] = pd.Index(range_id).get_indexer(wanted)
    return parent


def parent_cycle(parent: np.ndarray) -> int | None:
    """A row whose chain of parents (``parent``: each row's parent row, -1 for none) never ends, because it
    runs into a cycle; None when every chain ends. By doubling: after k steps each row knows its 2**k-th
    ancestor, and one still there once 2**k reaches the number of rows has gone round a cycle."""
    parent = np.asarray(parent, dtype=np.int64)
    ancestor = parent.copy()
    live = np.flatnonzero(ancestor >= 0)
    span = 1
    while len(live):
        if span >= len(parent):
            return int(live[0])
        further = ancestor[ancestor[live]]
        ancestor[live] = further
        live = live[further >= 0]
        span *= 2
    return None


def nesting_order(pid: np.ndarray, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The row order by (pid, tid, start, end descending), ties in row order: ``np.lexsort((-end, start, tid,
    pid))`` (parents before the children that start with them), in a fraction of its time on rows that
    come (nearly) in start order, as exports hold them: a stable sort by start, a sort of the equal-start
    runs alone by end, and a stable radix sort by thread (pid and tid are below 2**24)."""
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    order = np.argsort(start, kind="stable")
    s = start[order]
    tie = s[1:] == s[:-1]
    if tie.any():
        e = end[order]
        if (tie & (e[1:] > e[:-1])).any():  # some equal-start run not already longest first
            runs = np.flatnonzero(np.r_[tie, False] | np.r_[False, tie])
            order[runs] = order[runs[np.lexsort((-e[runs], s[runs]))]]
    thread = (np.asarray(pid, dtype=np.int64) << 24) | np.asarray(tid, dtype=np.int64)
    codes, threads = pd.factorize(thread[order])
    if len(threads) > 1:
        rank = np.argsort(np.argsort(threads))  # the code of each thread -> its place in (pid, tid) order
        rank = rank.astype(np.uint16) if len(threads) <= 2**16 else rank
        order = order[np.argsort(rank[codes], kind="stable")]
    return order


def _stacks(ranges: pd.DataFrame, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The push/pop ``rows`` ordered by stack then by their order in ``ranges``, and each one's stack as a
    dense code (0, 1, ... in that order)."""
    every = len(rows) == len(ranges)  # (all push/pop: the columns themselves, no copies)
    domain = ranges["domain"]
    domain = domain.cat.codes.to_numpy() if isinstance(domain.dtype, pd.CategoricalDtype) else \
        domain.to_numpy(dtype=object)
    pid, tid = ranges["pid"].to_numpy(), ranges["tid"].to_numpy()
    if not every:
        domain, pid, tid = domain[rows], pid[rows], tid[rows]
    domain = np.asarray(domain)
    if domain.dtype.kind not in "iu":
        domain, _ = pd.factorize(domain)
    thread = (np.asarray(pid, dtype=np.int64) << 24) | np.asarray(tid, dtype=np.int64)
    if len(rows) > 1 and domain.min() >= 0 and (thread[1:] >= thread[:-1]).all():
        # The reader's order (by thread, then start): a thread is a run of rows, and a small stack code
        # (thread number x domains + domain) sorts stably by radix in one pass.
        thread_no = np.cumsum(np.r_[False, thread[1:] != thread[:-1]], dtype=np.int64)
        key = thread_no * (int(domain.max()) + 1) + domain
        if key.max() < 2**16:
            order = np.argsort(key.astype(np.uint16), kind="stable")
            key = key[order]
            return rows[order], np.cumsum(np.r_[0, key[1:] != key[:-1]])
    codes, _ = pd.factorize(stack_keys(pid, tid, domain))
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    return rows[order], np.cumsum(np.r_[0, codes[1:] != codes[:-1]])


def nest_push_pop(ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """Depth and parent of each push/pop range within its (pid, tid, domain) stack.

    ``ranges`` is sorted by (pid, tid, start, end desc). Push/pop stacks are per thread and per NVTX
    domain, so ranges of different domains need not nest and get separate stacks (docs/field-cases.md C11).
    Start/end ranges are process-wide and never nest (depth 0, no parent). Returns (depth, parent
    row or -1, number of ranges that overlap without nesting).

    In a stack's start order the parent of a range is the nearest earlier range that ends no
    earlier (an earlier range ending sooner is a closed sibling's subtree). That is found for all
    ranges at once by pointer jumping: a candidate that ends too early is replaced by its own
    candidate, which only skips ranges ending even earlier. A range's depth is the number of earlier
    ranges of its stack still open when it starts; a stack is checked: every range's depth must be its
    parent's plus one (by induction, the parent chain's length). A stack that fails (overlapping
    ranges that do not nest, or equal timestamps the count cannot order) is nested again with an
    explicit stack, range by range.
    """
    n = len(ranges)
    depth = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    rows = np.flatnonzero((ranges["kind"] == "nvtx_push_pop").to_numpy())
    if not len(rows):
        return depth, parent, 0
    rows, group = _stacks(ranges, rows)
    start = ranges["start_ns"].to_numpy(dtype=np.int64)[rows]
    end = ranges["effective_end_ns"].to_numpy(dtype=np.int64)[rows]
    m = len(rows)
    first = np.r_[True, group[1:] != group[:-1]]
    cand = np.arange(-1, m - 1, dtype=np.int64)
    cand[first] = -1
    # One key per range, ordered by stack then end: (stack code, end) packed in an int64 where it fits.
    span = int(end.max()) - int(start.min()) + 1  # (Python ints: the int64 difference can overflow)
    packs = (int(group[-1]) + 1) < np.iinfo(np.int64).max // max(span, 1)
    if packs:
        offset = group * span - start.min()
        end_keys = end + offset
        # A range that ends after every earlier range of its stack has no parent: found at once (a thread's
        # top-level ranges, siblings that would each walk back through all the earlier ones).
        cand[np.r_[-1, np.maximum.accumulate(end_keys)[:-1]] < end_keys] = -1
    todo = np.flatnonzero(cand >= 0)
    while len(todo):
        todo = todo[end[cand[todo]] < end[todo]]
        cand[todo] = cand[cand[todo]]
        todo = todo[cand[todo] >= 0]
    # Depth: earlier ranges of the stack still open at each start (= not ended by it).
    group_start = np.flatnonzero(first)
    position = np.arange(m) - np.repeat(group_start, np.diff(np.r_[group_start, m]))
    ok = np.zeros(m, dtype=bool)
    local_depth = np.zeros(m, dtype=np.int64)
    if packs:
        end_keys.sort()
        local_depth = position - (np.searchsorted(end_keys, start + offset, side="right") - (np.arange(m) - position))
        del end_keys, offset
        # The ranges "ended by a start" include zero-length ranges at that very time placed after it (they come
        # last among equal starts): not earlier, so not closed before it; without this a range overlapping an
        # earlier one could pass the check and its overlap go unreported.
        zero = start == end
        if zero.any():
            run_start = np.r_[True, (group[1:] != group[:-1]) | (start[1:] != start[:-1])]
            run = np.cumsum(run_start) - 1
            run_last = np.r_[np.flatnonzero(run_start)[1:], m] - 1
            zeros_in_run = np.bincount(run, weights=zero, minlength=int(run[-1]) + 1).astype(np.int64)
            later = np.where(zero, run_last[run] - np.arange(m), zeros_in_run[run])
            local_depth += later
        ok = local_depth == np.where(cand >= 0, local_depth[np.maximum(cand, 0)] + 1, 0)
    del position
    bad_groups = np.unique(group[~ok])
    partial = 0
    if len(bad_groups):
        redo = np.isin(group, bad_groups)
        local_parent, local_depth_redo, partial = nest_with_stack(group[redo], start[redo], end[redo])
        redo_idx = np.flatnonzero(redo)
        cand[redo_idx] = np.where(local_parent >= 0, redo_idx[np.maximum(local_parent, 0)], -1)
        local_depth[redo_idx] = local_depth_redo
    parent[rows] = np.where(cand >= 0, rows[np.maximum(cand, 0)], -1)
    depth[rows] = local_depth
    return depth, parent, partial


def nest_with_stack(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The explicit-stack nesting of ranges in (group, start order): (parent index or -1, depth,
    number of ranges that overlap a range without nesting in it)."""
    m = len(group)
    parent = [-1] * m
    depth = [0] * m
    partial = 0
    stack: list[int] = []
    groups, starts, ends = group.tolist(), start.tolist(), end.tolist()
    for i in range(m):
        if i and groups[i] != groups[i - 1]:
            stack = []
        # The top of the stack contains range i unless it ends before i does: then it either
        # ended before i started (a sibling) or overlaps i without containing it.
        while stack and ends[stack[-1]] < ends[i]:
            if ends[stack[-1]] > starts[i]:
                partial += 1
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = depth[stack[-1]] + 1
        stack.append(i)
    return np.array(parent, dtype=np.int64), np.array(depth, dtype=np.int64), partial
