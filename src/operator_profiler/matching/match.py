"""Invocation-order matching of Nsight Compute rows to timeline kernels, as a scoped alignment: per ncu
process and window, a kernel gets a row's counters only when the alignment pins the pair; timestamps are
never used (ncu's replayed run is another process on another clock).
Details: docs/modules.md#matching-match."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .align import AMBIGUOUS, PINNED, Alignment, pin
from .bags import bag_labels, concurrent_launches, measured_iterations, repair_bags
from .diagnostics import REFUSED, results
from .names import ORDER_RUNG, NameIndex, name_triples, names_agree
from .processes import map_processes
from .windows import Window, source_window, window_segment

KERNEL_COLUMNS = ("source", "ncu_id", "pid", "device", "name", "match_key", "occurrence", "stream", "grid", "block")

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
    conflicts: set = field(default_factory=set)  # kernel ids that two files pinned
    row_candidates: dict = field(default_factory=dict)  # row label -> kernel names it may be (an unplaced row)

    def settle_conflicts(self) -> None:
        """A kernel two files pinned gets neither file's counters (which measurement would it be?)."""
        for kid in self.conflicts:
            label, _ = self.pairs.pop(kid, (None, None))
            if label is not None:
                self.row_reason[label] = "measured_twice"
            self.kernel_reason[kid] = "measured_twice"

    def refuse_kernel(self, kernel_id: int, reason: str) -> None:
        old = self.kernel_reason.get(kernel_id)
        if old is None or old == "not_in_ncu" or (old not in REFUSED and reason in REFUSED):
            self.kernel_reason[kernel_id] = reason


# ----------------------------------------------------------------------------------------------- entry point

def match_invocations(kernels: pd.DataFrame, ncu: pd.DataFrame, window: dict | None = None,
                      process_map: dict | None = None, ranges: pd.DataFrame | None = None
                      ) -> tuple[pd.DataFrame, dict]:
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
        ranges: the timeline's ranges (``timeline/ranges.parquet``), optional: their dispatcher ops
            show which launches were made while another thread was busy in an op (:func:`.bags.concurrent_launches`).

    Returns:
        ``matched`` (``kernel_id, ncu_id, ncu_source, name_rung``, then the metric columns; one row per pinned
        kernel; ``attrs["units"]`` copied) and ``diagnostics`` (module docstring; DESIGN.md §3 "Matching").
    """
    metrics = [c for c in ncu.columns if c not in KERNEL_COLUMNS]
    tl = _timeline(kernels, ranges)
    outcome = _Outcome()
    per_source = (window or {}).get("sources") if isinstance(window, dict) else None
    process_map = {int(k): int(v) for k, v in (process_map or {}).items()}
    sources = ncu["source"].unique().tolist() if "source" in ncu.columns and len(ncu) else ([None] if len(ncu) else [])
    for source in sources:
        part = ncu if source is None else ncu[ncu["source"] == source]
        part = part.sort_values("ncu_id", kind="stable")
        spec = source_window(per_source, source) if per_source is not None else window
        _match_file(tl, part, source, Window.from_spec(spec), process_map, outcome)
    outcome.settle_conflicts()
    return results(tl, ncu, metrics, outcome, per_source is not None or bool(window))


# --------------------------------------------------------------------------------------------------- timeline

def _timeline(kernels: pd.DataFrame, ranges: pd.DataFrame | None = None) -> pd.DataFrame:
    tl = kernels.assign(concurrent=concurrent_launches(kernels, ranges), iteration=measured_iterations(kernels, ranges))
    if "activity" in tl.columns:  # nsys <cuda_graph N> rows are not launches ncu profiles one by one
        tl = tl[tl["activity"].fillna("kernel") != "graph"]
    # Launch order: the kernel_id order of launched kernels; kernels without a launch record (launched before the
    # trace began) come first, in GPU start order (on one stream that is their launch order; across streams it is
    # not known: bags.bag_labels keeps them unordered there).
    orphan = (pd.array(tl["launch_start_ns"], dtype="Int64").isna() if "launch_start_ns" in tl.columns
              else np.zeros(len(tl), dtype=bool))
    tl = tl.assign(orphan=np.asarray(orphan, dtype=bool))
    tl["_order"] = np.where(tl["orphan"], pd.array(tl["start_ns"], dtype="Int64").fillna(0).to_numpy(dtype=np.int64)
                            if "start_ns" in tl.columns else 0, 0)
    tl = tl.sort_values(["orphan", "_order", "kernel_id"], ascending=[False, True, True], kind="stable")
    tl = tl.drop(columns="_order").reset_index(drop=True).copy()
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


def _configs(frame: pd.DataFrame) -> pd.Series:
    """``"grid|block"`` per row (spaces removed), None where either is unknown."""
    grid = frame["grid"].astype(object)
    block = frame["block"].astype(object)
    text = grid.map(lambda v: v.replace(" ", "") if isinstance(v, str) else "") + "|" + \
        block.map(lambda v: v.replace(" ", "") if isinstance(v, str) else "")
    known = grid.map(lambda v: isinstance(v, str) and bool(v.strip())) & \
        block.map(lambda v: isinstance(v, str) and bool(v.strip()))
    return pd.Series([t if k else None for t, k in zip(text.tolist(), known.tolist())], index=frame.index,
                     dtype=object)


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
    mapping = map_processes(tl, rows, ncu_pids, window, process_map, outcome.hints, src)
    for p in ncu_pids:
        mine = rows[rows["_pid"].isna()] if p is None else rows[rows["_pid"] == p]
        q, how, candidates = mapping[p]
        if q is None:
            reason = "process_ambiguous" if candidates else "process_unmatched"
            for label in mine["_label"]:
                outcome.row_reason[label] = reason
            for cand in candidates:  # the kernels of the window the rows could have measured are refused, visibly
                _refuse_names(window_segment(tl[tl["pid"] == cand], window), mine, outcome, reason)
            outcome.scopes.append({"source": src, "ncu_pid": p, "timeline_pid": None, "mapped_by": None,
                                   "candidates": candidates, "rows": len(mine), "matched": 0,
                                   "window": window.describe()})
            continue
        process = tl[tl["pid"] == q]
        segment = window_segment(process, window)
        outcome.covered.update(segment["kernel_id"].tolist())
        devices = sorted(set(process["device"].tolist()))
        for d in list(dict.fromkeys(None if pd.isna(x) else int(x) for x in mine["_device"])):
            scoped_rows = mine[mine["_device"].isna()] if d is None else mine[mine["_device"] == d]
            entry = {"source": src, "ncu_pid": p, "ncu_device": d, "timeline_pid": q, "mapped_by": how,
                     "rows": len(scoped_rows), "window": window.describe()}
            ncu_devices = set(mine["_device"].dropna().astype(int).tolist())
            if d is None and len(devices) > 1:
                reason, device = "device_unknown", None
            elif d is not None and d not in devices and not (devices == [-1]):
                # one device on each side is the same GPU whatever each tool calls it; else the ordinals must agree
                single = len(devices) == 1 and len(ncu_devices) == 1
                reason, device = (None, devices[0]) if single else ("device_unmatched", None)
            else:
                reason, device = None, (devices[0] if d is None or devices == [-1] else d)
            if reason is not None:
                for label in scoped_rows["_label"]:
                    outcome.row_reason[label] = reason
                _refuse_names(segment, scoped_rows, outcome, reason)
                outcome.scopes.append({**entry, "device": None, "matched": 0, "refused": reason})
                continue
            scope = process[process["device"] == device]
            seg = segment[segment["device"] == device]
            matched = _match_scope(scope, seg, scoped_rows, window, outcome, src)
            outcome.scopes.append({**entry, "device": device, "window_kernels": len(seg), "matched": matched})


def _refuse_names(kernels: pd.DataFrame, rows: pd.DataFrame, outcome: _Outcome, reason: str) -> None:
    """Rows that cannot be placed: the kernels of ``kernels`` their names resolve to are refused, and each row
    counts toward those kernel names (``candidates``) in the per-key summary."""
    index = NameIndex.build(name_triples(kernels))
    keys = set()
    for label, name in zip(rows["_label"], rows["name"]):
        key, _, cands = index.resolve(str(name))
        mine = [key] if key is not None else cands
        outcome.row_candidates.setdefault(label, set()).update(mine)
        keys.update(mine)
    for kid in kernels.loc[kernels["match_key"].isin(keys), "kernel_id"].tolist():
        outcome.refuse_kernel(int(kid), reason)


# --------------------------------------------------------------------------------------------------- a scope

def _match_scope(scope: pd.DataFrame, seg: pd.DataFrame, rows: pd.DataFrame, window: Window, outcome: _Outcome,
                 src) -> int:
    """Match one file's rows of one (process, device) against the window segment; returns the pinned count."""
    index = NameIndex.build(name_triples(scope))
    labels = rows["_label"].tolist()
    names = rows["name"].astype(str).tolist()
    seg_ids = seg["kernel_id"].to_numpy(dtype=np.int64)
    disagreement = None
    if window.kind == "kernel_ids":
        done, disagreement = _positional(seg, rows, labels, names, outcome)
        if done:
            return len(labels)
    resolved: list[str | None] = []
    rungs: list[str | None] = []
    ambiguous: dict[int, list] = {}  # row position -> the timeline keys its name fits
    for i, (label, name) in enumerate(zip(labels, names)):
        key, how, cands = index.resolve(name)
        resolved.append(key)
        rungs.append(how if key is not None else None)
        outcome.row_key[label] = key if key is not None else name
        if key is None:
            outcome.row_reason[label] = how
            if how == "name_ambiguous":
                ambiguous[i] = cands
    row_cfg = rows["config"].tolist() if "config" in rows.columns else [None] * len(rows)
    # Bare function names that fit several kernels (--print-kernel-base function): such a family's rows are
    # aligned with its launches as one name, and kept only when every row of it pins (_order_families)
    families = _order_families(index, names, resolved, ambiguous, seg)
    seg_keys_list = seg["match_key"].tolist()
    while True:
        keys = [families.get(i, resolved[i]) for i in range(len(labels))]
        ok = [i for i, k in enumerate(keys) if k is not None]
        family_of_key = {k: tok for i, tok in families.items() for k in ambiguous[i]}
        t_keys = [family_of_key.get(k, k) for k in seg_keys_list]
        # Launch configurations are compared wherever both sides know them; a row or launch without one (when the
        # other side has them) pairs with nothing: one blank cell must not switch the check off for the whole file.
        use_config = any(row_cfg[i] is not None for i in ok) and any(c is not None for c in seg["config"])
        t_tokens, n_tokens = _tokens(t_keys, seg["config"].tolist(), [keys[i] for i in ok], [row_cfg[i] for i in ok],
                                     use_config)
        alignment = _contiguous(t_tokens, n_tokens) if window.kind == "contiguous" else pin(t_tokens, n_tokens)
        n_to_t, n_state, t_state = alignment.n_to_t.copy(), alignment.n_state.copy(), alignment.t_state.copy()
        bag_rows, bag_launches = repair_bags(seg, t_tokens, n_tokens, n_to_t, n_state, t_state)
        unsettled = {families[i] for pos, i in enumerate(ok) if i in families and n_state[pos] != PINNED}
        if not unsettled:
            break
        families = {i: tok for i, tok in families.items() if tok not in unsettled}
    resolved = keys
    for i, cands in ambiguous.items():
        label = labels[i]
        if i in families:  # paired below, by the order
            outcome.row_reason.pop(label, None)
            rungs[i] = ORDER_RUNG
            continue
        outcome.row_candidates[label] = set(cands)
        for kid in seg.loc[seg["match_key"].isin(cands), "kernel_id"].tolist():
            outcome.refuse_kernel(int(kid), "name_ambiguous")
    if not use_config and ok and any(c is not None for c in seg["config"]):
        outcome.hints.append(f"{src}: the ncu file has no launch configurations (Grid/Block Size, missing in the 2021 "
                             "layout): a run of another input, or of another program that launches some of the same "
                             "kernels, cannot be told apart; make sure the file belongs to this timeline")
    if not alignment.exhaustive:
        outcome.hints.append(f"{src}: {len(n_tokens):,} rows x {len(t_tokens):,} launches is too large to align "
                             "without a window: declare it (--window FILE=SKIP:COUNT)")
    claim_broken = (window.kind == "launches" and not _fills_window(n_to_t, n_state, len(ok), len(labels))) or (
        window.kind == "contiguous" and (len(ok) != len(labels) or (len(n_tokens) and alignment.lcs == 0)))
    if claim_broken:
        # a declared window is a precise claim: the rows are those launches (a prefix of them when the program
        # ended first). Rows that are not, say the window or the file is another one: nothing is attached.
        for label in labels:
            outcome.row_reason[label] = "window_mismatch"
        # the kernels the rows could have measured: a launch window's launches are what the file claims; a
        # contiguous window's start is unknown, so the launches with a token (name, configuration) of a row
        could_be = seg_ids if window.kind == "launches" else seg_ids[np.isin(t_tokens, n_tokens)]
        for kid in could_be.tolist():
            outcome.refuse_kernel(int(kid), "window_mismatch")
        check = ("that the ncu run profiled consecutive launches (no kernel filter)" if window.kind == "contiguous"
                 else "--launch-skip/--launch-count of the ncu run (counted over this process's launches in the "
                      "timeline)")
        outcome.hints.append(f"{src}: its rows are not the launches of its declared window {window.describe()}: "
                             f"check {check} and that the file belongs to this timeline")
        return 0
    unknown_names = sum(1 for k in resolved if k is None) - sum(1 for label in labels
                                                                if outcome.row_reason.get(label) == "name_ambiguous")
    if window.kind == "unknown" and unknown_names * 2 > len(labels):
        # most rows name kernels this process never ran: a run of another program, where a few names that both
        # happen to launch once would pin each other's counters
        for label in labels:
            outcome.row_reason[label] = "file_does_not_fit"
        outcome.hints.append(f"{src}: {unknown_names} of its {len(labels)} rows name kernels the timeline process "
                             "never launched: it looks like a run of another program, so nothing is attached")
        return 0

    t_count = Counter(t_tokens.tolist())
    n_count = Counter(n_tokens.tolist())
    seg_keys = set(seg["match_key"])
    scope_keys = set(scope["match_key"])
    placed = window.kind in ("kernel_ids", "launches")
    pinned = 0
    foreign_config: list = []
    for pos, i in enumerate(ok):
        label, tok = labels[i], int(n_tokens[pos])
        if n_state[pos] == PINNED:
            kid = int(seg_ids[n_to_t[pos]])
            if i in families:
                outcome.row_key[label] = seg_keys_list[n_to_t[pos]]
            if kid in outcome.pairs:
                outcome.row_reason[label] = "measured_twice"
                outcome.conflicts.add(kid)
            else:
                outcome.pairs[kid] = (label, rungs[i])
                pinned += 1
            continue
        if n_state[pos] == AMBIGUOUS:
            outcome.row_reason[label] = _ambiguity(tok, t_count, n_count, placed, pos in bag_rows)
        elif resolved[i] not in seg_keys:
            outcome.row_reason[label] = "outside_window" if resolved[i] in scope_keys else "name_unmatched"
        elif use_config and row_cfg[i] is None:
            outcome.row_reason[label] = "launch_config_unknown"
            for p in np.flatnonzero((seg["match_key"] == resolved[i]).to_numpy() & (t_state != PINNED)).tolist():
                outcome.refuse_kernel(int(seg_ids[p]), "launch_config_unknown")
        elif use_config and row_cfg[i] not in set(seg.loc[seg["match_key"] == resolved[i], "config"]):
            outcome.row_reason[label] = "likely_autotune_or_benchmark"
            foreign_config.append((label, resolved[i]))
        else:
            outcome.row_reason[label] = "not_in_timeline"
    # Autotuning/cudnn.benchmark candidates run beside the real launch of the same kernel, which pairs; a kernel
    # none of whose rows pair has only configurations the timeline never launched: a run of other input shapes
    # (batch, sequence length) or another build, which the candidates' evidence cannot be told from
    paired_keys = {resolved[i] for pos, i in enumerate(ok) if n_state[pos] == PINNED}
    unpaired = [label for label, key in foreign_config if key not in paired_keys]
    for label in unpaired:
        outcome.row_reason[label] = "launch_config_not_in_timeline"
    if unpaired:
        outcome.hints.append(f"{src}: {len(unpaired)} of its {len(labels)} rows name kernels whose every row has a launch "
                             "configuration (grid/block) the timeline never launched them with: the ncu run likely used "
                             "other input shapes (batch, sequence length) or another build; profile the same input")
    if disagreement is not None and any(outcome.row_reason.get(label) not in (None, "order_ambiguous")
                                        for label in labels):
        # the alignment could not explain the positional disagreement (CUDA-graph nodes in another order can be)
        outcome.name_disagreements.append(disagreement)
    n_of_t = {int(n_to_t[p]) for p in range(len(n_to_t)) if n_to_t[p] >= 0}
    for p in np.flatnonzero(t_state == AMBIGUOUS).tolist():
        if p not in n_of_t:
            outcome.refuse_kernel(int(seg_ids[p]), _ambiguity(int(t_tokens[p]), t_count, n_count, placed,
                                                              p in bag_launches))
    return pinned


def _order_families(index: NameIndex, names: list, resolved: list, ambiguous: dict, seg: pd.DataFrame) -> dict:
    """The ambiguous rows whose launch order may tell them apart: ``{row position: family token}``.

    A family is the set of timeline keys one bare function name fits (:meth:`.names.NameIndex.family`). Its rows
    are aligned as one name only when the scope can hold nothing else for them: no row of the file names one of
    its kernels on its own (mixed naming), it shares no key with another family, and the window holds exactly as
    many launches of its kernels as the file has rows of the name (equal counts: every launch was profiled, so
    the order-preserving pairing is the only one). Whether every row then pins is decided by the alignment."""
    fams = {i: index.family(names[i]) for i in ambiguous}
    fams = {i: f for i, f in fams.items() if f is not None}
    distinct = set(fams.values())
    claimed = {k for k in resolved if k is not None}
    launches = Counter(seg["match_key"].tolist())
    rows_of = Counter(fams.values())
    out = {}
    for f in distinct:
        if f & claimed or any(f & g for g in distinct if g != f):
            continue
        if rows_of[f] != sum(launches[k] for k in f):
            continue
        token = "\x00function:" + "\x00".join(sorted(map(str, f)))  # no timeline key has it
        out.update({i: token for i, g in fams.items() if g == f})
    return out


def _tokens(t_keys: list, t_cfgs: list, n_keys: list, n_cfgs: list, use_config: bool) -> tuple[np.ndarray, ...]:
    """Integer tokens of launches and rows: the kernel name, and the launch configuration when ``use_config``
    (an item without one then gets a token of its own, which pairs with nothing)."""
    keys, _ = pd.factorize(pd.Series(t_keys + n_keys, dtype=object))
    if not use_config:
        codes = keys.astype(np.int64)
    else:
        cfgs, uniques = pd.factorize(pd.Series(t_cfgs + n_cfgs, dtype=object))  # None -> -1
        cfgs = cfgs.astype(np.int64)
        unknown = np.flatnonzero(cfgs < 0)
        cfgs[unknown] = len(uniques) + np.arange(len(unknown))  # each unknown configuration apart
        codes = keys.astype(np.int64) * (int(cfgs.max(initial=0)) + 1) + cfgs
    return codes[:len(t_keys)], codes[len(t_keys):]


def _fills_window(n_to_t: np.ndarray, n_state: np.ndarray, resolved: int, rows: int) -> bool:
    """Whether every row resolved, pinned, and the rows took the window's first launches without a gap."""
    if resolved != rows or (n_state != PINNED).any():
        return False
    return sorted(n_to_t.tolist()) == list(range(len(n_to_t)))


def _ambiguity(tok: int, t_count: Counter, n_count: Counter, placed: bool, in_bag: bool) -> str:
    if in_bag:
        return "order_ambiguous"
    if t_count[tok] == n_count[tok]:
        return "order_ambiguous"
    if not placed and t_count[tok] > n_count[tok]:
        return "unplaced_window"
    return "count_mismatch"


def _positional(seg: pd.DataFrame, rows: pd.DataFrame, labels, names, outcome: _Outcome) -> tuple[bool, dict | None]:
    """A replay window whose rows agree with the planned kernels position by position: the identity is then the
    only alignment pairing every row (DESIGN.md §5, ncu replay). Returns ``(True, None)`` after recording the
    pairs, else ``(False, the first position that disagrees)`` and records nothing."""
    if len(seg) != len(rows):
        return False, None
    rungs = []
    row_cfg = rows["config"].tolist() if "config" in rows.columns else [None] * len(rows)
    for position, ((kid, name, mangled, key, cfg), row_name, rcfg, label) in enumerate(zip(
            seg[["kernel_id", "name", "mangled_name", "match_key", "config"]].itertuples(index=False), names,
            row_cfg, labels)):
        rung = names_agree(name, mangled if isinstance(mangled, str) else None, row_name)
        if rung is None or (cfg is not None and rcfg is not None and cfg != rcfg):
            return False, {"source": label[0], "key": str(key), "position": position, "kernel_id": int(kid),
                           "ncu_id": int(label[1]), "timeline_name": str(name), "ncu_name": row_name,
                           "what": "name" if rung is None else "launch configuration",
                           **({} if rung is None else {"timeline_config": cfg, "ncu_config": rcfg})}
        rungs.append(rung)
    # inside a bag (a CUDA-graph replay over several streams, interleaving threads) position says nothing about a
    # kernel that the bag holds on several chains: those are refused, whatever the names say
    bag, chain = bag_labels(seg)
    tokens = (seg["match_key"].astype(str) + "\x00" + seg["config"].astype(str)).tolist()
    chains_of: dict = {}
    for b, c, tok in zip(bag.tolist(), chain.tolist(), tokens):
        if b >= 0:
            chains_of.setdefault((b, tok), set()).add(c)
    unordered = [b >= 0 and len(chains_of[(b, tok)]) > 1 for b, tok in zip(bag.tolist(), tokens)]
    for kid, label, rung, key, refuse in zip(seg["kernel_id"].tolist(), labels, rungs, seg["match_key"].tolist(),
                                             unordered):
        outcome.row_key[label] = key
        if refuse:
            outcome.row_reason[label] = "order_ambiguous"
            outcome.refuse_kernel(int(kid), "order_ambiguous")
            continue
        if int(kid) in outcome.pairs:
            outcome.row_reason[label] = "measured_twice"
            outcome.conflicts.add(int(kid))
        else:
            outcome.pairs[int(kid)] = (label, rung)
    return True, None


def _contiguous(t: np.ndarray, n: np.ndarray) -> Alignment:
    """A contiguous window of unknown start: pinned where ``n`` occurs exactly once as a run of ``t``; several
    runs: every row ambiguous; none: every row unaligned (the claim does not hold)."""
    k, m = len(n), len(t)
    n_to_t = np.full(k, -1, dtype=np.int64)
    starts = _occurrences(t, n) if 0 < k <= m else []
    t_state = np.zeros(m, dtype=np.int8)
    if len(starts) == 1:
        s = starts[0]
        n_to_t[:] = np.arange(s, s + k)
        t_state[s:s + k] = PINNED
        return Alignment(n_to_t, np.full(k, PINNED, dtype=np.int8), t_state, k)
    for s in starts:
        t_state[s:s + k] = AMBIGUOUS
    return Alignment(n_to_t, np.full(k, AMBIGUOUS if starts else 0, dtype=np.int8), t_state, k if starts else 0)


def _occurrences(t: np.ndarray, n: np.ndarray) -> list[int]:
    """Start positions of ``n`` as a contiguous run of ``t`` (bytes.find on fixed-width codes)."""
    hay, needle = t.astype(">i8").tobytes(), n.astype(">i8").tobytes()
    out, at = [], hay.find(needle)
    while at >= 0:
        if at % 8 == 0:
            out.append(at // 8)
        at = hay.find(needle, at + 1)
    return out


