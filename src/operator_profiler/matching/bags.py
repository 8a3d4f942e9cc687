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
    program order). Threads that hand over (forward on the main thread while the autograd thread waits, backward
    while the main thread waits in ``backward()``) are ordered by the program and stay out of bags."""
    m = len(seg)
    bag = np.full(m, -1, dtype=np.int64)
    chain = np.full(m, -1, dtype=np.int64)
    next_bag = 0
    tids = pd.array(seg["launch_tid"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    concurrent = seg["concurrent"].to_numpy(dtype=bool) if "concurrent" in seg.columns else np.zeros(m, dtype=bool)
    # threads: around a launch made while another thread was active, the blocks of consecutive launches of one
    # thread just before and after it (a swap of two blocks between runs is what concurrency can cause)
    if m and concurrent.any():
        starts = np.flatnonzero(np.r_[True, tids[1:] != tids[:-1]])
        ends = np.r_[starts[1:], m]
        block_of = np.repeat(np.arange(len(starts)), ends - starts)
        regions = []
        for k in np.flatnonzero(concurrent).tolist():
            b = int(block_of[k])
            lo, hi = max(0, b - 1), min(len(starts) - 1, b + 1)
            regions.append((int(starts[lo]), int(ends[hi])))
        for lo, hi in _merge(regions):
            if len(set(tids[lo:hi].tolist())) < 2:
                continue
            bag[lo:hi] = next_bag
            chain[lo:hi] = tids[lo:hi]
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


def _merge(regions):
    out = []
    for lo, hi in sorted(regions):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def repair_bags(seg, t_tokens, n_tokens, n_to_t, n_state, t_state) -> tuple[set, set]:
    """Unpin same-token pairs a bag cannot order, then pair the bag's unpinned launches by token inside the gap
    between their pinned neighbours. In place; returns the ncu positions and timeline positions left unpinned by
    a bag (their reason is ``order_ambiguous``)."""
    bag, chain = bag_labels(seg)
    rows_left: set = set()
    launches_left: set = set()
    if not (bag >= 0).any():
        return rows_left, launches_left
    for b in np.unique(bag[bag >= 0]).tolist():
        members = np.flatnonzero(bag == b)
        by_token: dict = defaultdict(set)
        for p in members.tolist():
            by_token[int(t_tokens[p])].add(int(chain[p]))
        unordered = {tok for tok, chains in by_token.items() if len(chains) > 1}
        for j in np.flatnonzero(n_to_t >= 0).tolist():
            p = int(n_to_t[j])
            if bag[p] == b and int(t_tokens[p]) in unordered:
                n_to_t[j] = -1
                n_state[j] = AMBIGUOUS
                t_state[p] = AMBIGUOUS
        # gap repair: the rows between the pinned neighbours of the bag, paired by token
        lo, hi = int(members.min()), int(members.max())
        pinned_pairs = [(j, int(n_to_t[j])) for j in np.flatnonzero(n_to_t >= 0).tolist()]
        before = [(j, p) for j, p in pinned_pairs if p < lo]
        after = [(j, p) for j, p in pinned_pairs if p > hi]
        jl, pl = max(before) if before else (-1, -1)
        jh, ph = min(after) if after else (len(n_tokens), len(t_tokens))
        rows_by_token: dict = defaultdict(list)
        for j in range(jl + 1, jh):
            if n_to_t[j] < 0:
                rows_by_token[int(n_tokens[j])].append(j)
        launches_by_token: dict = defaultdict(list)
        for p in range(pl + 1, ph):
            if t_state[p] != PINNED:
                launches_by_token[int(t_tokens[p])].append(p)
        for tok, launches in launches_by_token.items():
            if not all(bag[p] == b for p in launches):
                continue  # the token also has ordered launches in the gap: the alignment's answer stands
            rows_tok = rows_by_token.get(tok, [])
            if not rows_tok:
                continue  # not measured at all: nothing to place
            chains = {int(chain[p]) for p in launches}
            if len(rows_tok) != len(launches) or (len(launches) > 1 and len(chains) > 1):
                for j in rows_tok:
                    n_state[j] = AMBIGUOUS
                    rows_left.add(j)
                for p in launches:
                    t_state[p] = AMBIGUOUS
                    launches_left.add(p)
                continue
            for j, p in zip(rows_tok, launches):
                n_to_t[j] = p
                n_state[j] = PINNED
                t_state[p] = PINNED
    return rows_left, launches_left


def concurrent_launches(kernels: pd.DataFrame, ranges: pd.DataFrame | None) -> np.ndarray:
    """Per kernel: whether its launch call was made while another thread of its process was active, i.e. the
    launch call overlaps another thread's launch call, or lies inside another thread's dispatcher op (``aten::mm``,
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
            hit = (starts[1:] < ends[:-1]) & (tids[1:] != tids[:-1])
            out[rows[1:][hit]] = True
            out[rows[:-1][hit]] = True
    if ranges is None or not len(ranges):
        return out
    from ..timeline.kineto import DISPATCHER_OP

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
