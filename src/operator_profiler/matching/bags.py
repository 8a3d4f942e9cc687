"""Launches whose order is not fixed from run to run (CUDA-graph replays over several streams, interleaving
threads) and how they are matched: by token, inside the gap their pinned neighbours leave (DESIGN.md §4)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from .align import AMBIGUOUS, PINNED

_INTERLEAVE_BLOCKS = 8


def bag_labels(seg: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per launch of the segment: its bag (-1: ordered launch) and its chain inside the bag.

    A bag is a run of launches whose order is not fixed from run to run: the node kernels of one CUDA-graph replay
    (same ``cudaGraphLaunch`` correlation id) spread over several streams (chain = stream: nodes captured on one
    stream form a dependency chain and keep their order), or a region where two threads' launches interleave
    (thread X, Y, X, Y within a few thread switches of one measured iteration; chain = thread: each thread keeps
    its program order). A hand-over between threads (forward on the main thread, backward on the autograd thread,
    optimizer on the main thread: X, Y, X) is ordered by the program and stays out of bags; so do switches across
    measured iterations (``iteration``), whose ranges the harness closes on one thread."""
    m = len(seg)
    bag = np.full(m, -1, dtype=np.int64)
    chain = np.full(m, -1, dtype=np.int64)
    next_bag = 0
    tids = pd.array(seg["launch_tid"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
    iterations = (pd.array(seg["iteration"], dtype="Int64").fillna(-1).to_numpy(dtype=np.int64)
                  if "iteration" in seg.columns else np.full(m, -1, dtype=np.int64))
    # threads: blocks of consecutive launches of one thread (a new block at each measured iteration too: each
    # iteration's hand-over forward -> backward -> optimizer is ordered by the program)
    if m and len(set(tids.tolist())) > 1:
        starts = np.flatnonzero(np.r_[True, (tids[1:] != tids[:-1]) | (iterations[1:] != iterations[:-1])])
        ends = np.r_[starts[1:], m]
        threads = tids[starts]
        regions = []
        block_iteration = iterations[starts]
        for last in range(len(starts)):
            for first in range(max(0, last - _INTERLEAVE_BLOCKS), last - 2):
                x, y = threads[first], threads[last]
                if x == y or block_iteration[first] != block_iteration[last]:
                    continue
                middle = threads[first + 1:last]
                # x ... y ... x ... y: x and y alternate twice
                xs = np.flatnonzero(middle == x)
                ys = np.flatnonzero(middle == y)
                if len(xs) and len(ys) and ys.min() < xs.max():
                    regions.append((int(starts[first]), int(ends[last])))
        for lo, hi in _merge(regions):
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
