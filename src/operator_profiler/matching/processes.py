"""Which timeline process an ncu process is: never guessed (DESIGN.md §4, matching step 1)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pandas as pd

from .align import embed, token_positions
from .names import NameIndex, name_triples


def map_processes(tl, rows, ncu_pids, window, process_map: dict, hints: list, src):
    """ncu pid -> ``(timeline pid or None, how, candidates)``: by ``process_map``, the window's recorded process,
    the only process on both sides, or the one timeline process whose launches contain all of the ncu process's
    rows in order (then one-to-one: :func:`_one_to_one`); two ncu processes never share a timeline process.
    Ambiguity adds a hint."""
    tl_pids = sorted(set(tl["pid"].tolist()))
    out: dict = {}
    for p in ncu_pids:
        mine = rows[rows["_pid"].isna()] if p is None else rows[rows["_pid"] == p]
        if p is not None and p in process_map:
            q = process_map[p]
            out[p] = (q, "process_map", []) if q in tl_pids else (None, "process_map", [])
            if q not in tl_pids:
                hints.append(f"--process-map {p}={q}: the timeline has no process {q} (its processes: {tl_pids})")
            continue
        if window.pid is not None:
            out[p] = (window.pid, "replay_record", []) if window.pid in tl_pids else (None, "replay_record", [])
            continue
        if len(tl_pids) == 1 and len(ncu_pids) == 1:
            out[p] = (tl_pids[0], "single_process", [])
            continue
        # Device ordinals do not tell processes apart: each process numbers the GPUs it sees
        # (CUDA_VISIBLE_DEVICES), and the two tools may not number them alike across processes.
        candidates = tl_pids
        how = "launch_sequence"
        sequence_fit = [q for q in candidates if _contains_sequence(tl[tl["pid"] == q], mine)]
        if sequence_fit:
            candidates = sequence_fit
        elif len(ncu_pids) > 1 and len(tl_pids) == 1:
            # more ncu processes than timeline processes: one whose rows fit nowhere (a helper process the ncu
            # run caught with --target-processes all) is not the timeline's process
            candidates = []
        out[p] = (None, how, list(candidates))
    return _one_to_one(out, hints, src)


def _one_to_one(out: dict, hints: list, src) -> dict:
    """Settle the candidate lists: an ncu process left with one candidate takes it, and that timeline process
    leaves every other list (each ncu process is one OS process of the ncu run, each timeline process one of the
    timeline's), until nothing changes. Two ncu processes whose only candidate is the same timeline process are
    both refused; so is every process still left with several."""
    fixed = {p: q for p, (q, how, _) in out.items() if q is not None}
    open_ = {p: set(cands) - set(fixed.values()) for p, (q, _, cands) in out.items() if q is None and cands}
    changed = True
    while changed:
        changed = False
        single = Counter(next(iter(c)) for c in open_.values() if len(c) == 1)
        for p, cands in list(open_.items()):
            if len(cands) == 1 and single[next(iter(cands))] == 1:
                q = next(iter(cands))
                fixed[p] = q
                out[p] = (q, out[p][1], [])
                del open_[p]
                for other in open_.values():
                    other.discard(q)
                changed = True
                break
    for p, cands in open_.items():
        out[p] = (None, out[p][1], sorted(cands))
    taken = Counter(q for q, how, _ in out.values() if q is not None and how != "process_map")
    for p, (q, how, cands) in list(out.items()):
        if q is not None and how != "process_map" and taken[q] > 1:  # two ncu processes, one timeline process
            out[p] = (None, how, [q])
    if any(q is None and cands for q, _, cands in out.values()):
        hints.append(f"{src}: ncu processes that cannot be mapped to one timeline process each are refused "
                     "(process_ambiguous); name the pairs with --process-map NCU_PID=TIMELINE_PID")
    return out


def _contains_sequence(process: pd.DataFrame, rows: pd.DataFrame) -> bool:
    """Whether every row resolves in the process and the rows of each device form a subsequence of its launches."""
    devices = sorted(set(process["device"].tolist()))
    ncu_devices = set(rows["_device"].dropna().astype(int).tolist())
    for d, group in rows.groupby(rows["_device"].fillna(-2), sort=False):
        if int(d) == -2 or (len(devices) == 1 and len(ncu_devices) == 1):
            scope = process  # no device, or one on each side: the same GPU whatever its ordinal
        else:
            scope = process[process["device"] == int(d)]
        index = NameIndex.build(name_triples(scope))
        keys = []
        for name in group["name"]:
            key, _, _ = index.resolve(str(name))
            if key is None:
                return False
            keys.append(key)
        codes = {k: i for i, k in enumerate(dict.fromkeys(scope["match_key"]))}
        t = np.array([codes[k] for k in scope["match_key"]], dtype=np.int64)
        n = np.array([codes[k] for k in keys], dtype=np.int64)
        if embed(n, token_positions(t), forward=True) is None:
            return False
    return True


def parse_process_map(specs: list[str]) -> dict[int, int]:
    """``--process-map NCU_PID=TIMELINE_PID`` values -> ``{ncu_pid: timeline_pid}``.

    Raises:
        ValueError: a value that is not two integers joined by ``=``, or an ncu pid given twice.
    """
    out: dict[int, int] = {}
    for spec in specs:
        m = re.fullmatch(r"\s*(\d+)\s*=\s*(\d+)\s*", spec)
        if m is None:
            raise ValueError(f"--process-map {spec!r}: expected NCU_PID=TIMELINE_PID (two process ids, e.g. 4711=123)")
        ncu_pid, tl_pid = int(m.group(1)), int(m.group(2))
        if ncu_pid in out and out[ncu_pid] != tl_pid:
            raise ValueError(f"--process-map {spec!r}: ncu process {ncu_pid} is already mapped to {out[ncu_pid]}")
        out[ncu_pid] = tl_pid
    return out
