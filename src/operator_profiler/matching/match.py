"""Invocation-order matching of Nsight Compute rows to timeline kernels, as a scoped alignment (DESIGN.md §4).

An ncu row and a timeline kernel are the same launch only when the input pins it; timestamps are never used (the
ncu run is another process, serialised by replay). The steps, per ncu file:

1. **Scopes.** Rows are split by ncu ``Process ID`` and ``Device``; each ncu process is mapped to one timeline
   process (an explicit ``process_map``, the replay record's process, the only process on both sides, the device
   set, or the one timeline process whose launch sequence contains all the ncu process's rows); a mapping that is
   not unique is refused (``process_ambiguous``), never guessed. Devices pair by CUDA ordinal; rows without a
   device in a process that used several devices are refused (``device_unknown``). Nothing crosses a scope.
2. **Window.** The timeline launches the file covers: a replay's planned ``kernel_ids``; a declared launch window
   (``launch_skip``/``launch_count`` over the process's launches in ``kernel_id`` order, optionally only launches of
   one ``kernel``, as ``ncu -k NAME -s N -c M`` counts them); ``contiguous`` (an ncu run of consecutive launches,
   start unknown: placed where the row sequence occurs exactly, only if it occurs once); or unknown (the whole
   process: the rows may be any subsequence, as with kernel filters).
3. **Names.** Each row's name resolves to one timeline kernel name of the scope on the ladder of
   :mod:`.names`, or is refused (``name_unmatched``, ``name_ambiguous``).
4. **Alignment.** Row and launch tokens (resolved name, and grid/block where both sides know them) are aligned
   (:mod:`.align`); only pinned pairs carry counters. Launch order inside a CUDA-graph replay spread over several
   streams, and between threads whose launches interleave, is not fixed from run to run: such *bags* are matched
   by token (a token repeated on several streams/threads of one bag is refused as ``order_ambiguous``).

Every row and every kernel of a window that did not get a partner gets a machine-readable reason (:data:`REASONS`);
``diagnostics["counters"]`` sums them up per key for the reports.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..naming import COMMUNICATION
from .align import AMBIGUOUS, PINNED, pin
from .names import NameIndex, names_agree

KERNEL_COLUMNS = ("source", "ncu_id", "pid", "device", "name", "match_key", "occurrence", "stream", "grid", "block")

#: Why an ncu row or a timeline kernel has no partner. "Refused" reasons mean the input held a measurement the
#: join could not place with certainty; the others that there was nothing to place.
REASONS = {
    # refused
    "count_mismatch": "the ncu file and the timeline have different numbers of launches of this kernel in the "
                      "window, and the launch order does not say which launches ncu profiled",
    "order_ambiguous": "the launches of this kernel can pair in more than one way (launch order that differs between "
                       "runs: CUDA-graph nodes on several streams, interleaving threads, or a reordered sequence)",
    "unplaced_window": "the ncu file's launch window is unknown and its rows fit the timeline at more than one "
                       "place; declare the window (--window FILE=SKIP:COUNT, or FILE=contiguous)",
    "name_ambiguous": "the ncu name fits several timeline kernel names of the scope on the first rung it matches",
    "process_ambiguous": "the ncu process cannot be mapped to one timeline process (several fit); pass "
                         "--process-map NCU_PID=TIMELINE_PID",
    "device_unknown": "the ncu file has no Device column but the timeline process used several devices",
    "replay_window_mismatch": "our own ncu replay profiled other kernels than planned at this position",
    # nothing to place
    "name_unmatched": "no timeline kernel of the scope has this name on any rung",
    "process_unmatched": "no timeline process fits this ncu process",
    "device_unmatched": "the mapped timeline process has no kernel on this ncu device",
    "likely_autotune_or_benchmark": "the kernel is in the timeline but never with this launch configuration "
                                    "(autotuning or cudnn.benchmark candidates inside the ncu range)",
    "not_in_timeline": "no timeline launch of the window pairs with this row (an extra launch in the ncu run)",
    "outside_window": "the kernel name is in the timeline, but not inside this file's window",
    "measured_twice": "another ncu file already gave this kernel its counters",
    "not_in_ncu": "the ncu file(s) covering this kernel have no row for it (filtered out or not profiled)",
    "communication_not_profiled": "communication (NCCL) kernel: ncu does not profile them",
    "launched_on_other_thread": "none of this kernel's launches are in ncu and it was launched from a thread none of "
                                "the matched kernels came from (an ncu NVTX include filter sees only the launching "
                                "thread's push/pop ranges)",
}
REFUSED = frozenset({"count_mismatch", "order_ambiguous", "unplaced_window", "name_ambiguous", "process_ambiguous",
                     "device_unknown", "replay_window_mismatch"})


@dataclass
class Window:
    """The launches one ncu file covers (module docstring, step 2)."""

    kind: str = "unknown"  # kernel_ids | launches | contiguous | unknown
    kernel_ids: list[int] | None = None
    launch_skip: int = 0
    launch_count: int | None = None
    kernel: str | None = None  # launches: count only launches of this kernel (function name, or regex:...)
    pid: int | None = None  # the timeline process (our replays record it)

    @classmethod
    def from_spec(cls, spec: dict | None) -> Window:
        if not spec:
            return cls()
        if spec.get("kernel_ids") is not None:
            return cls("kernel_ids", kernel_ids=[int(k) for k in spec["kernel_ids"]],
                       pid=None if spec.get("pid") is None else int(spec["pid"]))
        if spec.get("contiguous"):
            return cls("contiguous", pid=None if spec.get("pid") is None else int(spec["pid"]))
        if spec.get("launch_skip") is not None or spec.get("launch_count") is not None:
            count = spec.get("launch_count")
            return cls("launches", launch_skip=int(spec.get("launch_skip") or 0),
                       launch_count=None if count is None else int(count), kernel=spec.get("kernel"),
                       pid=None if spec.get("pid") is None else int(spec["pid"]))
        return cls(pid=None if spec.get("pid") is None else int(spec["pid"]))

    def describe(self) -> dict:
        if self.kind == "kernel_ids":
            return {"kind": self.kind, "kernels": len(self.kernel_ids or [])}
        if self.kind == "launches":
            return {"kind": self.kind, "launch_skip": self.launch_skip, "launch_count": self.launch_count,
                    **({"kernel": self.kernel} if self.kernel else {})}
        return {"kind": self.kind}


@dataclass
class _Outcome:
    """What happened to every ncu row (by row label) and every timeline kernel (by kernel_id)."""

    pairs: dict = field(default_factory=dict)  # kernel_id -> (row label, rung)
    row_reason: dict = field(default_factory=dict)  # row label -> reason
    kernel_reason: dict = field(default_factory=dict)  # kernel_id -> reason (refusals and not_in_ncu)
    row_key: dict = field(default_factory=dict)  # row label -> timeline match_key it resolved to (or its name)
    covered: set = field(default_factory=set)  # kernel ids inside some file's window
    scopes: list = field(default_factory=list)
    hints: list = field(default_factory=list)
    name_disagreements: list = field(default_factory=list)

    def refuse_kernel(self, kernel_id: int, reason: str) -> None:
        old = self.kernel_reason.get(kernel_id)
        if old is None or old == "not_in_ncu" or (old not in REFUSED and reason in REFUSED):
            self.kernel_reason[kernel_id] = reason


# ----------------------------------------------------------------------------------------------- entry point

def match_invocations(kernels: pd.DataFrame, ncu: pd.DataFrame, window: dict | None = None,
                      process_map: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """Match ncu rows (``ncu/{cls}.parquet``) to timeline kernels (``timeline/kernels.parquet``).

    Args:
        kernels: timeline kernels (``kernel_id, pid, name, match_key``; optional ``device, mangled_name, grid,
            block, launch_tid, launch_api, correlation_id, stream, duration_ns, activity``).
        ncu: parsed ncu rows (``stages.parse_ncu_files``: ``source, ncu_id, pid, device, name, grid, block`` and
            metric columns); each ``source`` file is matched on its own, rows in ``ncu_id`` order.
        window: the launches the files cover: one window for every file, or ``{"sources": {name: window}}`` per
            file (looked up by the source as given, its file name, or its stem: ``ncu/{cls}.csv`` -> ``cls``).
            A window is ``{"kernel_ids": [...], "pid": p}`` (a replay's planned kernels),
            ``{"launch_skip": N, "launch_count": M[, "kernel": NAME]}`` (counted over the mapped process's launches),
            ``{"contiguous": true}``, or empty (unknown).
        process_map: ``{ncu_pid: timeline_pid}``, for captures whose processes cannot be told apart.

    Returns:
        ``matched`` (``kernel_id, ncu_id, ncu_source, name_rung``, then the metric columns; one row per pinned
        kernel; ``attrs["units"]`` copied) and ``diagnostics`` (module docstring; DESIGN.md §3 "Matching").
    """
    metrics = [c for c in ncu.columns if c not in KERNEL_COLUMNS]
    tl = _timeline(kernels)
    outcome = _Outcome()
    per_source = (window or {}).get("sources") if isinstance(window, dict) else None
    process_map = {int(k): int(v) for k, v in (process_map or {}).items()}
    sources = ncu["source"].unique().tolist() if "source" in ncu.columns and len(ncu) else ([None] if len(ncu) else [])
    for source in sources:
        part = ncu if source is None else ncu[ncu["source"] == source]
        part = part.sort_values("ncu_id", kind="stable")
        spec = _source_window(per_source, source) if per_source is not None else window
        _match_file(tl, part, source, Window.from_spec(spec), process_map, outcome)
    return _results(tl, ncu, metrics, outcome, per_source is not None or bool(window))


# --------------------------------------------------------------------------------------------------- timeline

def _timeline(kernels: pd.DataFrame) -> pd.DataFrame:
    tl = kernels
    if "activity" in tl.columns:  # nsys <cuda_graph N> rows are not launches ncu profiles one by one
        tl = tl[tl["activity"].fillna("kernel") != "graph"]
    tl = tl.sort_values("kernel_id", kind="stable").reset_index(drop=True).copy()
    tl["kernel_id"] = tl["kernel_id"].astype("int64")
    if "pid" not in tl.columns:
        tl["pid"] = 0
    tl["pid"] = pd.array(tl["pid"], dtype="Int64").fillna(-1).astype("int64")
    tl["device"] = (pd.array(tl["device"], dtype="Int64").fillna(-1).astype("int64") if "device" in tl.columns
                    else np.int64(-1))
    for col in ("mangled_name", "grid", "block", "launch_tid", "launch_api", "correlation_id", "stream"):
        if col not in tl.columns:
            tl[col] = None
    tl["config"] = _configs(tl)
    return tl


def _configs(frame: pd.DataFrame) -> list:
    out = []
    for g, b in zip(frame["grid"], frame["block"]):
        if isinstance(g, str) and isinstance(b, str) and g.strip() and b.strip():
            out.append(g.replace(" ", "") + "|" + b.replace(" ", ""))
        else:
            out.append(None)
    return out


def _source_window(windows: dict, source) -> dict | None:
    text = "" if source is None else str(source)
    name = text.replace("\\", "/").rsplit("/", 1)[-1]
    for key in (text, name, name.rsplit(".", 1)[0]):
        if key in windows:
            return windows[key]
    return None


# ------------------------------------------------------------------------------------------------ one file

def _match_file(tl: pd.DataFrame, rows: pd.DataFrame, source, window: Window, process_map: dict,
                outcome: _Outcome) -> None:
    src = None if source is None else str(source)
    rows = rows.copy()
    rows["_label"] = [(src, int(i)) for i in rows["ncu_id"]]
    rows["_pid"] = pd.array(rows["pid"], dtype="Int64") if "pid" in rows.columns else pd.array([None] * len(rows),
                                                                                                dtype="Int64")
    rows["_device"] = (pd.array(rows["device"], dtype="Int64") if "device" in rows.columns
                       else pd.array([None] * len(rows), dtype="Int64"))
    rows["config"] = _configs(rows) if {"grid", "block"} <= set(rows.columns) else None
    ncu_pids = list(dict.fromkeys(None if pd.isna(p) else int(p) for p in rows["_pid"]))
    mapping = _map_processes(tl, rows, ncu_pids, window, process_map, outcome, src)
    for p in ncu_pids:
        mine = rows[rows["_pid"].isna()] if p is None else rows[rows["_pid"] == p]
        q, how, candidates = mapping[p]
        if q is None:
            reason = "process_ambiguous" if candidates else "process_unmatched"
            for label in mine["_label"]:
                outcome.row_reason[label] = reason
            for cand in candidates:  # the kernels the rows could have measured are refused, visibly
                _refuse_names(tl[tl["pid"] == cand], mine["name"], outcome, reason)
            outcome.scopes.append({"source": src, "ncu_pid": p, "timeline_pid": None, "mapped_by": None,
                                   "candidates": candidates, "rows": len(mine), "matched": 0,
                                   "window": window.describe()})
            continue
        process = tl[tl["pid"] == q]
        segment = _window_segment(process, window)
        outcome.covered.update(segment["kernel_id"].tolist())
        devices = sorted(set(process["device"].tolist()))
        for d in list(dict.fromkeys(None if pd.isna(x) else int(x) for x in mine["_device"])):
            scoped_rows = mine[mine["_device"].isna()] if d is None else mine[mine["_device"] == d]
            entry = {"source": src, "ncu_pid": p, "ncu_device": d, "timeline_pid": q, "mapped_by": how,
                     "rows": len(scoped_rows), "window": window.describe()}
            if d is None and len(devices) > 1:
                reason, device = "device_unknown", None
            elif d is not None and d not in devices and not (devices == [-1]):
                reason, device = "device_unmatched", None
            else:
                reason, device = None, (devices[0] if d is None or devices == [-1] else d)
            if reason is not None:
                for label in scoped_rows["_label"]:
                    outcome.row_reason[label] = reason
                if reason == "device_unknown":
                    _refuse_names(process, scoped_rows["name"], outcome, reason)
                outcome.scopes.append({**entry, "device": None, "matched": 0, "refused": reason})
                continue
            scope = process[process["device"] == device]
            seg = segment[segment["device"] == device]
            matched = _match_scope(scope, seg, scoped_rows, window, outcome, src)
            outcome.scopes.append({**entry, "device": device, "window_kernels": len(seg), "matched": matched})


def _refuse_names(kernels: pd.DataFrame, names, outcome: _Outcome, reason: str) -> None:
    index = NameIndex.build(_name_triples(kernels))
    keys = set()
    for name in set(names):
        key, _, cands = index.resolve(str(name))
        keys.update([key] if key is not None else cands)
    for kid in kernels.loc[kernels["match_key"].isin(keys), "kernel_id"].tolist():
        outcome.refuse_kernel(int(kid), reason)


def _name_triples(kernels: pd.DataFrame):
    sub = kernels[["match_key", "name", "mangled_name"]].drop_duplicates()
    return [(k, n if isinstance(n, str) else None, m if isinstance(m, str) else None)
            for k, n, m in zip(sub["match_key"], sub["name"], sub["mangled_name"])]


def _window_segment(process: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The process's launches the file covers (kernel_id order)."""
    if window.kind == "kernel_ids":
        return process[process["kernel_id"].isin(set(window.kernel_ids or []))]
    if window.kind == "launches":
        cand = process
        if window.kernel:
            cand = process[[_kernel_filter(window.kernel, n, m) for n, m in zip(process["name"], process["mangled_name"])]]
        end = None if window.launch_count is None else window.launch_skip + window.launch_count
        return cand.iloc[window.launch_skip:end]
    return process


def _kernel_filter(pattern: str, name, mangled) -> bool:
    """ncu ``-k`` semantics on the function base: ``regex:<expr>`` searches it, anything else must equal it."""
    from .names import base_name

    base = base_name(name if isinstance(name, str) else mangled)
    if pattern.startswith("regex:"):
        return re.search(pattern[len("regex:"):], base) is not None
    return pattern in (base, name, mangled)


# ---------------------------------------------------------------------------------------------- processes

def _map_processes(tl, rows, ncu_pids, window: Window, process_map: dict, outcome: _Outcome, src):
    """ncu pid -> (timeline pid or None, how, candidates)."""
    tl_pids = sorted(set(tl["pid"].tolist()))
    out: dict = {}
    for p in ncu_pids:
        mine = rows[rows["_pid"].isna()] if p is None else rows[rows["_pid"] == p]
        if p is not None and p in process_map:
            q = process_map[p]
            out[p] = (q, "process_map", []) if q in tl_pids else (None, "process_map", [])
            if q not in tl_pids:
                outcome.hints.append(f"--process-map {p}={q}: the timeline has no process {q} "
                                     f"(its processes: {tl_pids})")
            continue
        if window.pid is not None:
            out[p] = (window.pid, "replay_record", []) if window.pid in tl_pids else (None, "replay_record", [])
            continue
        if len(tl_pids) == 1 and len(ncu_pids) == 1:
            out[p] = (tl_pids[0], "single_process", [])
            continue
        candidates = tl_pids
        how = "launch_sequence"
        ncu_devices = {int(d) for d in mine["_device"].dropna()}
        if ncu_devices:
            fitting = [q for q in candidates if ncu_devices <= set(tl.loc[tl["pid"] == q, "device"].tolist())]
            if len(fitting) < len(candidates):
                how = "devices"
            candidates = fitting
        if len(candidates) > 1:
            sequence_fit = [q for q in candidates if _contains_sequence(tl[tl["pid"] == q], mine)]
            if sequence_fit:
                how = "launch_sequence"
                candidates = sequence_fit
        out[p] = (candidates[0], how, []) if len(candidates) == 1 else (None, how, candidates)
    taken = Counter(q for q, how, _ in out.values() if q is not None and how != "process_map")
    for p, (q, how, cands) in list(out.items()):
        if q is not None and how != "process_map" and taken[q] > 1:  # two ncu processes, one timeline process
            out[p] = (None, how, [q])
    if any(q is None and cands for q, _, cands in out.values()):
        outcome.hints.append(f"{src}: ncu processes that fit several timeline processes are refused "
                             "(process_ambiguous); name the pairs with --process-map NCU_PID=TIMELINE_PID")
    return out


def _contains_sequence(process: pd.DataFrame, rows: pd.DataFrame) -> bool:
    """Whether every row resolves in the process and the rows of each device form a subsequence of its launches."""
    from .align import _embed, _positions

    for d, group in rows.groupby(rows["_device"].fillna(-2), sort=False):
        scope = process if int(d) == -2 else process[process["device"] == int(d)]
        index = NameIndex.build(_name_triples(scope))
        keys = []
        for name in group["name"]:
            key, _, _ = index.resolve(str(name))
            if key is None:
                return False
            keys.append(key)
        codes = {k: i for i, k in enumerate(dict.fromkeys(scope["match_key"]))}
        t = np.array([codes[k] for k in scope["match_key"]], dtype=np.int64)
        n = np.array([codes[k] for k in keys], dtype=np.int64)
        if _embed(n, _positions(t), forward=True) is None:
            return False
    return True


# --------------------------------------------------------------------------------------------------- a scope

def _match_scope(scope: pd.DataFrame, seg: pd.DataFrame, rows: pd.DataFrame, window: Window, outcome: _Outcome,
                 src) -> int:
    """Match one file's rows of one (process, device) against the window segment; returns the pinned count."""
    index = NameIndex.build(_name_triples(scope))
    labels = rows["_label"].tolist()
    names = rows["name"].astype(str).tolist()
    seg_ids = seg["kernel_id"].to_numpy(dtype=np.int64)
    if window.kind == "kernel_ids" and _positional(seg, rows, labels, names, outcome):
        return len(labels)
    resolved: list[str | None] = []
    rungs: list[str | None] = []
    for label, name in zip(labels, names):
        key, how, cands = index.resolve(name)
        resolved.append(key)
        rungs.append(how if key is not None else None)
        outcome.row_key[label] = key if key is not None else name
        if key is None:
            outcome.row_reason[label] = how
            if how == "name_ambiguous":
                for kid in seg.loc[seg["match_key"].isin(cands), "kernel_id"].tolist():
                    outcome.refuse_kernel(int(kid), "name_ambiguous")
    ok = [i for i, k in enumerate(resolved) if k is not None]
    row_cfg = rows["config"].tolist() if "config" in rows.columns else [None] * len(rows)
    use_config = all(row_cfg[i] is not None for i in ok) and all(c is not None for c in seg["config"])
    codes: dict = {}

    def code(key, cfg):
        return codes.setdefault((key, cfg if use_config else None), len(codes))

    t_tokens = np.array([code(k, c) for k, c in zip(seg["match_key"], seg["config"])], dtype=np.int64)
    n_tokens = np.array([code(resolved[i], row_cfg[i]) for i in ok], dtype=np.int64)
    if window.kind == "contiguous":
        alignment = _contiguous(t_tokens, n_tokens)
    else:
        alignment = pin(t_tokens, n_tokens)
    n_to_t, n_state, t_state = alignment.n_to_t.copy(), alignment.n_state.copy(), alignment.t_state.copy()
    bag_rows, bag_launches = _bags(seg, t_tokens, n_tokens, n_to_t, n_state, t_state)
    if not alignment.exhaustive:
        outcome.hints.append(f"{src}: {len(n_tokens):,} rows x {len(t_tokens):,} launches is too large to align "
                             "without a window: declare it (--window FILE=SKIP:COUNT)")

    t_count = Counter(t_tokens.tolist())
    n_count = Counter(n_tokens.tolist())
    seg_keys = set(seg["match_key"])
    scope_keys = set(scope["match_key"])
    placed = window.kind in ("kernel_ids", "launches")
    pinned = 0
    for pos, i in enumerate(ok):
        label, tok = labels[i], int(n_tokens[pos])
        if n_state[pos] == PINNED:
            kid = int(seg_ids[n_to_t[pos]])
            if kid in outcome.pairs:
                outcome.row_reason[label] = "measured_twice"
            else:
                outcome.pairs[kid] = (label, rungs[i])
                pinned += 1
            continue
        if n_state[pos] == AMBIGUOUS:
            outcome.row_reason[label] = _ambiguity(tok, t_count, n_count, placed, pos in bag_rows)
        elif resolved[i] not in seg_keys:
            outcome.row_reason[label] = "outside_window" if resolved[i] in scope_keys else "name_unmatched"
        elif use_config and row_cfg[i] not in set(seg.loc[seg["match_key"] == resolved[i], "config"]):
            outcome.row_reason[label] = "likely_autotune_or_benchmark"
        else:
            outcome.row_reason[label] = "not_in_timeline"
    n_of_t = {int(n_to_t[p]) for p in range(len(n_to_t)) if n_to_t[p] >= 0}
    for p in np.flatnonzero(t_state == AMBIGUOUS).tolist():
        if p not in n_of_t:
            outcome.refuse_kernel(int(seg_ids[p]), _ambiguity(int(t_tokens[p]), t_count, n_count, placed,
                                                              p in bag_launches))
    return pinned


def _ambiguity(tok: int, t_count: Counter, n_count: Counter, placed: bool, in_bag: bool) -> str:
    if in_bag:
        return "order_ambiguous"
    if t_count[tok] == n_count[tok]:
        return "order_ambiguous"
    if not placed and t_count[tok] > n_count[tok]:
        return "unplaced_window"
    return "count_mismatch"


def _positional(seg: pd.DataFrame, rows: pd.DataFrame, labels, names, outcome: _Outcome) -> bool:
    """A replay window whose rows agree with the planned kernels position by position: the identity is then the
    only alignment pairing every row (DESIGN.md §5, ncu replay). Returns False (nothing recorded) otherwise."""
    if len(seg) != len(rows):
        return False
    rungs = []
    row_cfg = rows["config"].tolist() if "config" in rows.columns else [None] * len(rows)
    for position, ((kid, name, mangled, key, cfg), row_name, rcfg, label) in enumerate(zip(
            seg[["kernel_id", "name", "mangled_name", "match_key", "config"]].itertuples(index=False), names,
            row_cfg, labels)):
        rung = names_agree(name, mangled if isinstance(mangled, str) else None, row_name)
        if rung is None or (cfg is not None and rcfg is not None and cfg != rcfg):
            outcome.name_disagreements.append({
                "source": label[0], "key": str(key), "position": position, "kernel_id": int(kid),
                "ncu_id": int(label[1]), "timeline_name": str(name), "ncu_name": row_name,
                "what": "name" if rung is None else "launch configuration",
                **({} if rung is None else {"timeline_config": cfg, "ncu_config": rcfg})})
            return False
        rungs.append(rung)
    for kid, label, rung, key in zip(seg["kernel_id"].tolist(), labels, rungs, seg["match_key"].tolist()):
        outcome.row_key[label] = key
        if int(kid) in outcome.pairs:
            outcome.row_reason[label] = "measured_twice"
        else:
            outcome.pairs[int(kid)] = (label, rung)
    return True


def _contiguous(t: np.ndarray, n: np.ndarray):
    """A contiguous window of unknown start: pinned where ``n`` occurs exactly once as a run of ``t``."""
    from .align import Alignment

    k, m = len(n), len(t)
    n_to_t = np.full(k, -1, dtype=np.int64)
    starts = _occurrences(t, n) if 0 < k <= m else []
    if len(starts) == 1:
        s = starts[0]
        n_to_t[:] = np.arange(s, s + k)
        t_state = np.zeros(m, dtype=np.int8)
        t_state[s:s + k] = PINNED
        return Alignment(n_to_t, np.full(k, PINNED, dtype=np.int8), t_state, k)
    if not starts:  # not a run of the timeline: fall back to the general alignment (as if unknown)
        return pin(t, n)
    t_state = np.zeros(m, dtype=np.int8)
    for s in starts:
        t_state[s:s + k] = AMBIGUOUS
    return Alignment(n_to_t, np.full(k, AMBIGUOUS, dtype=np.int8), t_state, k)


def _occurrences(t: np.ndarray, n: np.ndarray) -> list[int]:
    """Start positions of ``n`` as a contiguous run of ``t`` (bytes.find on fixed-width codes)."""
    hay, needle = t.astype(">i8").tobytes(), n.astype(">i8").tobytes()
    out, at = [], hay.find(needle)
    while at >= 0:
        if at % 8 == 0:
            out.append(at // 8)
        at = hay.find(needle, at + 1)
    return out


# ------------------------------------------------------------------------------------------------------- bags

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


def _bags(seg, t_tokens, n_tokens, n_to_t, n_state, t_state) -> tuple[set, set]:
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


# ---------------------------------------------------------------------------------------------------- results

def _results(tl: pd.DataFrame, ncu: pd.DataFrame, metrics: list, outcome: _Outcome, windowed: bool):
    labels = list(zip(ncu["source"].astype(str) if "source" in ncu.columns else [None] * len(ncu),
                      ncu["ncu_id"].astype("int64")))
    if "source" not in ncu.columns:
        labels = [(None, int(i)) for i in ncu["ncu_id"]]
    row_of = {lab: i for i, lab in enumerate(labels)}
    matched_ids = set(outcome.pairs)
    pair_rows = sorted(outcome.pairs.items())
    records = []
    for kid, (label, rung) in pair_rows:
        r = ncu.iloc[row_of[label]]
        records.append({"kernel_id": int(kid), "ncu_id": int(r["ncu_id"]),
                        "ncu_source": str(r["source"]) if "source" in ncu.columns else None, "name_rung": rung,
                        **{m: r[m] for m in metrics}})
    matched = pd.DataFrame(records, columns=["kernel_id", "ncu_id", "ncu_source", "name_rung", *metrics])
    matched["kernel_id"] = matched["kernel_id"].astype("int64")
    matched["ncu_id"] = matched["ncu_id"].astype("int64")
    for m in metrics:
        if str(ncu[m].dtype).startswith("float"):
            matched[m] = matched[m].astype("float64")
    matched.attrs = {"units": dict(ncu.attrs.get("units", {}))}

    # kernels without counters: refused, or not measured (with why)
    by_id = tl.set_index("kernel_id", drop=False)
    matched_tids = set(by_id.loc[list(matched_ids), "launch_tid"].dropna()) if matched_ids else set()
    ncu_keys = {outcome.row_key.get(lab) for lab in labels}
    timeline_only = []
    considered = outcome.covered | set(outcome.kernel_reason)
    for kid in sorted(considered - matched_ids):
        k = by_id.loc[kid]
        reason = outcome.kernel_reason.get(kid, "not_in_ncu")
        if reason == "not_in_ncu":
            if COMMUNICATION.search(str(k["name"])) or COMMUNICATION.search(str(k["match_key"])):
                reason = "communication_not_profiled"
            elif k["match_key"] not in ncu_keys and matched_tids and pd.notna(k["launch_tid"]) \
                    and k["launch_tid"] not in matched_tids:
                reason = "launched_on_other_thread"
        timeline_only.append({"kernel_id": int(kid), "name": str(k["name"]), "match_key": str(k["match_key"]),
                              "reason": reason})
    ncu_only = []
    for lab in labels:
        if lab in outcome.row_reason:
            r = ncu.iloc[row_of[lab]]
            ncu_only.append({"ncu_id": int(lab[1]), "source": lab[0], "name": str(r["name"]),
                             "reason": outcome.row_reason[lab]})

    per_key = _per_key(tl, labels, outcome, timeline_only, matched_ids)
    diag = {
        "matched": len(pair_rows),
        "ncu_only": len(ncu_only),
        "timeline_only": len(timeline_only),
        "outside_window": int(len(tl) - len(considered | matched_ids)) if windowed else 0,
        "name_disagreements": outcome.name_disagreements,
        "per_key": per_key,
        "hints": list(dict.fromkeys(outcome.hints)),
        "ncu_only_rows": ncu_only,
        "timeline_only_kernels": timeline_only,
        "timeline_only_reasons": _count(timeline_only),
        "ncu_only_reasons": _count(ncu_only),
        "scopes": outcome.scopes,
        "name_rungs": dict(Counter(rung for _, rung in outcome.pairs.values())),
    }
    if diag["timeline_only_reasons"].get("launched_on_other_thread"):
        diag["hints"].append("kernels launched on another thread have no ncu rows: an ncu --nvtx-include filter "
                             "matches push/pop ranges of the launching thread only")
    if diag["timeline_only_reasons"].get("communication_not_profiled"):
        diag["hints"].append("communication (NCCL) kernels are not profiled by ncu")
    for key, entry in per_key.items():
        if entry["status"] == "count_mismatch":
            diag["hints"].append(f"{key}: ncu has {entry['ncu']} launches, the timeline {entry['timeline']}, and the "
                                 "launch order cannot tell which were profiled: warm up (autotuning, cudnn.benchmark) "
                                 "before the ncu range, or declare the window (--launch-skip)")
            break
    diag["coverage_by_name"] = _coverage_by_name(tl, matched_ids)
    diag["counters_coverage"] = _time_coverage(tl, matched_ids)
    diag["counters"] = counters_summary(len(tl), matched_ids, timeline_only, per_key)
    return matched, diag


def _count(items) -> dict:
    return dict(Counter(it["reason"] for it in items))


def _per_key(tl, labels, outcome: _Outcome, timeline_only, matched_ids) -> dict:
    """Per timeline kernel name (``match_key``): launches in the windows, ncu rows, matched, status, reasons."""
    keys_of = dict(zip(tl["kernel_id"].tolist(), tl["match_key"].tolist()))
    out: dict = {}

    def entry(key):
        return out.setdefault(str(key), {"timeline": 0, "ncu": 0, "matched": 0, "status": "ok", "reasons": Counter()})

    for kid in outcome.covered | matched_ids | set(outcome.kernel_reason):
        entry(keys_of[kid])["timeline"] += 1
    for kid in matched_ids:
        entry(keys_of[kid])["matched"] += 1
    for lab in labels:
        key = outcome.row_key.get(lab)
        if key is None:
            continue
        e = entry(key)
        e["ncu"] += 1
        if lab in outcome.row_reason:
            e["reasons"][outcome.row_reason[lab]] += 1
    for k in timeline_only:
        if k["reason"] in REFUSED:
            entry(k["match_key"])["reasons"][k["reason"]] += 1
    for e in out.values():
        refused = {r: n for r, n in e["reasons"].items() if r in REFUSED}
        if refused:
            e["status"] = max(refused, key=lambda r: (refused[r], r))
        elif e["reasons"] and set(e["reasons"]) == {"likely_autotune_or_benchmark"}:
            e["status"] = "ncu_surplus"
        elif e["ncu"] and not e["matched"]:
            e["status"] = max(e["reasons"], key=lambda r: (e["reasons"][r], r)) if e["reasons"] else "ok"
        e["reasons"] = dict(e["reasons"])
    return out


def counters_summary(kernels: int, matched_ids, timeline_only: list, per_key: dict) -> dict:
    """How many kernels got counters, how many were refused and why (per key), how many were not measured."""
    refused = [k for k in timeline_only if k["reason"] in REFUSED]
    keys: dict = {}
    for k in refused:
        e = keys.setdefault((k["match_key"], k["reason"]), {"key": k["match_key"], "name": k["name"],
                                                            "reason": k["reason"], "refused": 0})
        e["refused"] += 1
    for e in keys.values():
        info = per_key.get(e["key"], {})
        e["timeline"], e["ncu"] = info.get("timeline", 0), info.get("ncu", 0)
    return {
        "kernels": int(kernels),
        "with_counters": len(matched_ids),
        "refused": len(refused),
        "not_measured": int(kernels) - len(matched_ids) - len(refused),
        "refused_reasons": _count(refused),
        "refused_keys": sorted(keys.values(), key=lambda e: (-e["refused"], e["key"], e["reason"])),
    }


def _coverage_by_name(tl: pd.DataFrame, matched_ids: set) -> dict:
    out = {}
    for name, g in tl.groupby("name", sort=True):
        out[str(name)] = f"{int(g['kernel_id'].isin(matched_ids).sum())}/{len(g)}"
    return out


def _time_coverage(tl: pd.DataFrame, matched_ids: set) -> dict:
    """Kernel time with counters: overall, compute, communication."""
    if "duration_ns" not in tl.columns:
        return {}
    comm = tl["name"].astype(str).str.contains(COMMUNICATION) | tl["match_key"].astype(str).str.contains(COMMUNICATION)
    got = tl["kernel_id"].isin(matched_ids)
    dur = tl["duration_ns"].fillna(0).astype("int64")
    out = {}
    for label, mask in (("overall", comm | ~comm), ("compute", ~comm), ("communication", comm)):
        total, with_counters = int(dur[mask].sum()), int(dur[mask & got].sum())
        out[label] = {"time_ns": total, "with_counters_ns": with_counters,
                      "fraction": (with_counters / total) if total else None}
    return out


# ------------------------------------------------------------------------------------------ command-line specs

_WINDOW_SPEC = re.compile(r"^(?P<name>.+?)=(?:(?P<contiguous>contiguous)|(?P<skip>\d+):(?P<count>\d+)(?::(?P<kernel>.+))?)$")


def parse_window_specs(specs: list[str]) -> dict:
    """``--window`` values -> the ``window`` argument of :func:`match_invocations`.

    ``NAME=SKIP:COUNT`` (the ncu run's ``--launch-skip``/``--launch-count``), ``NAME=SKIP:COUNT:KERNEL`` (with
    ``-k KERNEL``: only that kernel's launches are counted), ``NAME=contiguous`` (consecutive launches, start
    unknown); NAME is the ncu CSV's path, file name or stem.

    Raises:
        ValueError: a value in none of these forms, or one file given two windows (the message says which).
    """
    sources: dict = {}
    for spec in specs:
        m = _WINDOW_SPEC.match(spec.strip())
        if m is None:
            raise ValueError(f"--window {spec!r}: expected NAME=SKIP:COUNT, NAME=SKIP:COUNT:KERNEL or NAME=contiguous "
                             "(NAME: the ncu CSV's path, file name or stem; SKIP/COUNT: the ncu run's --launch-skip "
                             "and --launch-count), or a JSON file")
        name = m.group("name")
        if name in sources:
            raise ValueError(f"--window {spec!r}: {name} already has a window")
        if m.group("contiguous"):
            sources[name] = {"contiguous": True}
        else:
            sources[name] = {"launch_skip": int(m.group("skip")), "launch_count": int(m.group("count")),
                             **({"kernel": m.group("kernel")} if m.group("kernel") else {})}
    return {"sources": sources}


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
