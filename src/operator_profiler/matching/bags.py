"""Launches whose order is not fixed from run to run (CUDA-graph replays over several streams, interleaving
threads) and how they are matched: by token, inside the gap their pinned neighbours leave (DESIGN.md §4)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from .align import AMBIGUOUS, PINNED

def bag_labels(seg: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per launch of the segment: its bag (-1: ordered launch) and its chain inside the bag.

    A bag is a run of launches whose order is not fixed from run to run: the node kernels of one CUDA-graph replay
    (same ``cudaGraphLaunch`` correlation id) spread over several streams (chain = stream: nodes captured on one
    stream form a dependency chain and keep their order), or the launches of two threads around a launch made while
    another thread was active (``concurrent``, :func:`concurrent_launches`; chain = thread: each thread keeps its
    program order), or the launches of two threads that alternate twice (X, Y, X, Y) within one measured iteration
    (:func:`alternation_regions`; chain = thread), or the kernels without a launch record (launched before the
    trace) over several streams (chain = stream). A single hand-over X, Y, X (forward on the main thread,
    backward on the autograd thread while the main thread waits in ``backward()``, the optimizer on the main
    thread) is ordered by the program and stays out of bags."""
    m = len(seg)
    bag = np.full(m, -1, dtype=np.int64)
    chain = np.full(m, -1, dtype=np.int64)
    next_bag = 0
    tids = pd.array(seg["launch_tid"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    concurrent = seg["concurrent"].to_numpy(dtype=bool) if "concurrent" in seg.columns else np.zeros(m, dtype=bool)
    # threads: around a launch made while another thread was active, the blocks of consecutive launches of one
    # thread just before and after it (a swap of two blocks between runs is what concurrency can cause)
    regions = alternation_regions(tids, _iteration_runs(seg))
    if m and concurrent.any():
        starts = np.flatnonzero(np.r_[True, tids[1:] != tids[:-1]])
        ends = np.r_[starts[1:], m]
        block_of = np.repeat(np.arange(len(starts)), ends - starts)
        for k in np.flatnonzero(concurrent).tolist():
            b = int(block_of[k])
            lo, hi = max(0, b - 1), min(len(starts) - 1, b + 1)
            regions.append((int(starts[lo]), int(ends[hi])))
    if regions:
        for lo, hi in _merge(regions):
            if len(set(tids[lo:hi].tolist())) < 2:
                continue
            bag[lo:hi] = next_bag
            chain[lo:hi] = tids[lo:hi]
            next_bag += 1
    # kernels without a launch record over several streams (their launch order across streams is not known)
    if "orphan" in seg.columns:
        orphans = np.flatnonzero(seg["orphan"].to_numpy(dtype=bool) & (bag < 0))
        streams_o = pd.array(seg["stream"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
        if len(orphans) and len(set(streams_o[orphans].tolist())) > 1:
            bag[orphans] = next_bag
            chain[orphans] = streams_o[orphans]
            next_bag += 1
    # CUDA-graph replays over several streams
    api = seg["launch_api"].astype(object).to_numpy()
    corr = pd.array(seg["correlation_id"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    streams = pd.array(seg["stream"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    graph = np.array([isinstance(a, str) and "graphlaunch" in a.lower() for a in api], dtype=bool) & (corr > 0)
    if graph.any():
        frame = pd.DataFrame({"pos": np.flatnonzero(graph), "corr": corr[graph], "stream": streams[graph]})
        for _, g in frame.groupby("corr", sort=False):
            if g["stream"].nunique() < 2:
                continue
            pos = g["pos"].to_numpy()
            existing = bag[pos]
            if (existing >= 0).any():  # inside an interleaving region: chains by thread and stream
                chain[pos] = chain[pos] * 1_000_003 + streams[pos]
                continue
            bag[pos] = next_bag
            chain[pos] = streams[pos]
            next_bag += 1
    return bag, chain


PROFILER_STEP = r"^ProfilerStep#(\d+)$"  # torch.profiler's per-step annotation (``profiler.step()``)


def measured_iterations(kernels: pd.DataFrame, ranges: pd.DataFrame | None) -> pd.arrays.IntegerArray:
    """Per kernel: the measured iteration its launch lies in, for telling one iteration's thread hand-overs from
    threads that alternate. The timeline's own ``iteration`` (our ``opprof.iteration:N`` markers) where any is
    known, else torch.profiler's ``ProfilerStep#N`` ranges of the process (from ``ranges``); null elsewhere."""
    n = len(kernels)
    if "iteration" in kernels.columns and kernels["iteration"].notna().any():
        return pd.array(kernels["iteration"], dtype="Int64")
    if ranges is None or not len(ranges) or not n or "launch_start_ns" not in kernels.columns:
        return pd.array([None] * n, dtype="Int64")
    steps = ranges["name"].astype(str).str.extract(PROFILER_STEP, expand=False)
    marked = ranges[steps.notna()].assign(iteration=pd.to_numeric(steps[steps.notna()]).astype("Int64"))
    if not len(marked):
        return pd.array([None] * n, dtype="Int64")
    from ..timeline.model import iteration_at

    start = kernels["start_ns"] if "start_ns" in kernels.columns else kernels["launch_start_ns"]
    at = pd.array(kernels["launch_start_ns"], dtype="Int64").fillna(pd.array(start, dtype="Int64")).fillna(0)
    pids = pd.array(kernels["pid"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    return iteration_at(pids, at.to_numpy(dtype=np.int64), marked)


def _iteration_runs(seg: pd.DataFrame) -> np.ndarray:
    """Per launch (in launch order): the number of the run of consecutive launches with the same measured iteration
    (``iteration``; launches outside any iteration form runs of their own). One run when the timeline marks no
    iterations."""
    m = len(seg)
    if "iteration" not in seg.columns or not m:
        return np.zeros(m, dtype=np.int64)
    it = pd.array(seg["iteration"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    return np.cumsum(np.r_[False, it[1:] != it[:-1]]).astype(np.int64)


def _thread_blocks(tids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) positions of the runs of consecutive launches of one thread."""
    m = len(tids)
    starts = np.flatnonzero(np.r_[True, tids[1:] != tids[:-1]]) if m else np.zeros(0, dtype=np.int64)
    return starts, np.r_[starts[1:], m].astype(np.int64)


def alternation_regions(tids: np.ndarray, runs: np.ndarray) -> list[tuple[int, int]]:
    """``[lo, hi)`` launch regions where two threads alternate twice (blocks X, Y, X, Y of consecutive launches of
    one thread, other threads' blocks in between allowed) inside one iteration run (``runs``, per launch). Two
    threads that take turns like that run on their own (data-parallel workers, a Python thread per stream): which
    one launches first differs from run to run, so the region is a bag. A single hand-over X, Y, X (forward,
    backward on the autograd thread, optimizer) is the program's order and gives no region. Launches without a
    thread (``-1``) belong to no block."""
    regions: list[tuple[int, int]] = []
    if len(tids) < 4:
        return regions
    bounds = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1], True])  # runs are consecutive launches
    for lo_run, hi_run in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        at = np.arange(lo_run, hi_run)
        sub = tids[lo_run:hi_run]
        threads = [t for t in np.unique(sub).tolist() if t >= 0]
        if len(threads) < 2:
            continue
        for a_i, x in enumerate(threads):
            for y in threads[a_i + 1:]:
                both = np.flatnonzero((sub == x) | (sub == y))
                starts, ends = _thread_blocks(sub[both])
                if len(starts) < 4:
                    continue  # X, Y, X at most: one hand-over, ordered
                regions.append((int(at[both[starts[0]]]), int(at[both[ends[-1] - 1]]) + 1))
    return regions


def _merge(regions):
    out = []
    for lo, hi in sorted(regions):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def repair_bags(seg, t_tokens, n_tokens, n_to_t, n_state, t_state) -> tuple[set, set]:
    """Redo the alignment's answer where bags are: the pairs it made inside a bag assumed the timeline's order, so
    they are set aside, and each gap between two pairs of ordered launches that holds a bag is placed again. First
    as a whole: the gap's rows must read as its ordered launches one by one and each bag as one block of rows (a
    CUDA-graph launch is one API call, so ncu profiles its nodes together, between the launches before and after
    it); inside a block a token pairs by itself, in order along one chain, or stays undecided. Otherwise a token
    with one launch and one row in the gap pairs, and the gap's other rows and launches of bag tokens stay
    undecided. In place; returns the ncu positions and timeline positions left undecided (``order_ambiguous``)."""
    bag, chain = bag_labels(seg)
    rows_left: set = set()
    launches_left: set = set()
    if not (bag >= 0).any():
        return rows_left, launches_left
    for j in np.flatnonzero(n_to_t >= 0).tolist():
        p = int(n_to_t[j])
        if bag[p] >= 0:
            n_to_t[j], n_state[j], t_state[p] = -1, AMBIGUOUS, AMBIGUOUS
    pins = [(-1, -1)] + [(j, int(n_to_t[j])) for j in np.flatnonzero(n_to_t >= 0).tolist()] + \
        [(len(n_tokens), len(t_tokens))]
    for (jl, pl), (jh, ph) in zip(pins, pins[1:]):
        launches = list(range(pl + 1, ph))
        if not any(bag[p] >= 0 for p in launches):
            continue  # ordered launches only: the alignment's answer stands
        rows = list(range(jl + 1, jh))
        placed = _place_gap(launches, rows, bag, chain, t_tokens, n_tokens)
        if placed is None:
            placed = _place_unique_tokens(launches, rows, bag, chain, t_tokens, n_tokens)
        pairs, undecided_rows, undecided_launches = placed
        for j, p in pairs:
            n_to_t[j], n_state[j], t_state[p] = p, PINNED, PINNED
        for j in undecided_rows:
            n_state[j] = AMBIGUOUS
            rows_left.add(j)
        for p in undecided_launches:
            t_state[p] = AMBIGUOUS
            launches_left.add(p)
    return rows_left, launches_left


def _place_unique_tokens(launches: list[int], rows: list[int], bag, chain, t_tokens, n_tokens):
    """A gap that does not read as its launches: a token with exactly one launch and one row in it pairs, and so
    does a token whose launches there all lie on one chain of one bag, as many as its rows (in that chain's
    order); the rows and launches of the other tokens that a bag launch has stay undecided."""
    rows_by_token: dict = defaultdict(list)
    for j in rows:
        rows_by_token[int(n_tokens[j])].append(j)
    launches_by_token: dict = defaultdict(list)
    for p in launches:
        launches_by_token[int(t_tokens[p])].append(p)
    pairs, undecided_rows, undecided_launches = [], [], []
    for tok, ps in launches_by_token.items():
        js = rows_by_token.get(tok, [])
        if len(ps) == 1 and len(js) == 1:
            pairs.append((js[0], ps[0]))
        elif len(ps) == len(js) and len({(int(bag[p]), int(chain[p])) for p in ps}) == 1 and bag[ps[0]] >= 0:
            pairs += list(zip(js, ps))  # all on one chain of one bag (one thread, one stream): in its order
        elif js and any(bag[p] >= 0 for p in ps):
            undecided_rows += js
            undecided_launches += ps
    return pairs, undecided_rows, undecided_launches


def _place_gap(launches: list[int], rows: list[int], bag, chain, t_tokens, n_tokens):
    """The gap's rows read as its launches in order, each bag one block: ``(pairs, undecided rows, undecided
    launches)``, or None when the rows are not exactly that. Inside a block a token pairs by itself when it is
    unique, in order when all its launches are on one chain, and stays undecided otherwise."""
    if len(launches) != len(rows) or not launches:
        return None
    items: list[list[int]] = []
    for p in launches:
        if items and bag[p] >= 0 and bag[items[-1][-1]] == bag[p]:
            items[-1].append(p)
        else:
            items.append([p])
    pairs, undecided_rows, undecided_launches, at = [], [], [], 0
    for item in items:
        block = rows[at:at + len(item)]
        at += len(item)
        if sorted(int(t_tokens[p]) for p in item) != sorted(int(n_tokens[j]) for j in block):
            return None
        by_token_rows: dict = defaultdict(list)
        for j in block:
            by_token_rows[int(n_tokens[j])].append(j)
        by_token_launches: dict = defaultdict(list)
        for p in item:
            by_token_launches[int(t_tokens[p])].append(p)
        for tok, ps in by_token_launches.items():
            js = by_token_rows[tok]
            if len(ps) == 1 or len({int(chain[p]) for p in ps}) == 1:
                pairs += list(zip(js, ps))
            else:
                undecided_rows += js
                undecided_launches += ps
    return pairs, undecided_rows, undecided_launches


def concurrent_launches(kernels: pd.DataFrame, ranges: pd.DataFrame | None) -> np.ndarray:
    """Per kernel: whether its launch call was made while another thread of its process was active, i.e. the
    launch call overlaps (or starts at the same time as) another thread's launch call, or lies inside another
    thread's dispatcher op (``aten::mm``,
    from ``ranges``). Launches of threads that hand over (one waits while the other launches) have neither, so
    their order is the program's; without ranges only overlapping launch calls count."""
    n = len(kernels)
    out = np.zeros(n, dtype=bool)
    if n == 0 or "launch_tid" not in kernels.columns or "launch_start_ns" not in kernels.columns:
        return out
    tid = pd.array(kernels["launch_tid"], dtype="Int64")
    start = pd.array(kernels["launch_start_ns"], dtype="Int64")
    end = pd.array(kernels["launch_end_ns"], dtype="Int64") if "launch_end_ns" in kernels.columns else start
    known = ~(tid.isna() | start.isna() | end.isna())
    frame = pd.DataFrame({"row": np.arange(n), "pid": kernels["pid"].to_numpy(), "tid": tid, "start": start,
                          "end": end})[np.asarray(known)]
    if frame["tid"].nunique() < 2:
        return out
    frame = frame.sort_values(["pid", "start", "row"], kind="stable")
    # a launch call overlapping the one before it, of another thread of the process (running max of ends)
    for _, g in frame.groupby("pid", sort=False):
        starts, ends = g["start"].to_numpy(np.int64), g["end"].to_numpy(np.int64)
        tids, rows = g["tid"].to_numpy(np.int64), g["row"].to_numpy()
        if len(g) > 1:
            # equal starts (integer-µs timestamps) tell nothing about which thread came first
            hit = ((starts[1:] < ends[:-1]) | (starts[1:] == starts[:-1])) & (tids[1:] != tids[:-1])
            out[rows[1:][hit]] = True
            out[rows[:-1][hit]] = True
    if ranges is None or not len(ranges):
        return out
    from ..timeline.model import DISPATCHER_OP

    ops = ranges[ranges["end_ns"].notna() & ranges["name"].astype(str).str.match(DISPATCHER_OP)]
    for (pid, op_tid), g in ops.groupby(["pid", "tid"], sort=False):
        spans = _union(g["start_ns"].astype("int64").to_numpy(), g["end_ns"].astype("int64").to_numpy())
        mine = frame[(frame["pid"] == pid) & (frame["tid"] != op_tid)]
        if not len(mine) or not len(spans):
            continue
        t = mine["start"].to_numpy(np.int64)
        pos = np.searchsorted(spans[:, 0], t, side="right") - 1
        inside = (pos >= 0) & (t < spans[np.maximum(pos, 0), 1])
        out[mine["row"].to_numpy()[inside]] = True
    return out


def _union(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Disjoint, sorted ``[start, end]`` rows covering the given intervals."""
    order = np.argsort(starts, kind="stable")
    merged: list[list[int]] = []
    for s, e in zip(starts[order].tolist(), ends[order].tolist()):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return np.array(merged, dtype=np.int64).reshape(-1, 2)
