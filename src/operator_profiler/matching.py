"""Invocation-order matching of Nsight Compute rows to timeline kernels (issue #4 item 3, DESIGN.md §4).

A timeline kernel and an ncu row are the same launch when they have the same ``match_key`` and the same
position among the launches of that key inside the replayed window, never by timestamps (the ncu run is a
different process, serialised by replay). At every position the names must agree (:func:`names_agree`); the
first disagreement stops the matching of that key and is reported, together with everything after it.

Name normalization (ncu.md §1.8): ncu prints the demangled name by default, mangled with
``--print-kernel-base mangled`` and only the function name with ``function``, and its demangler style
changes between versions (``<(int)4, ...>`` vs ``<4, ...>``). Two names agree when they are equal, when both
are mangled and equal, or when their *base names* are equal: the function name without return type,
namespaces, template arguments and parameters (what ncu calls the ``function`` basis), taken from a
demangled string by stripping those parts and from an Itanium mangled name (``_Z...``) by reading its last
unqualified source name. Two mangled names are compared exactly. When both sides know the launch
configuration (``grid``/``block``, ``"x,y,z"``) it must agree too (ncu.md §1.8: Triton names repeat).

Per-case handling (``../shared/docs/cases.md``):

- C15: more ncu launches of a key than timeline launches (autotuning, ``cudnn.benchmark`` inside the ncu
  window). The ncu rows whose configuration matches no timeline launch of the key are ``ncu_only``
  (``likely_autotune_or_benchmark``); if the rest then has the timeline's count it is matched in order,
  otherwise the key is a ``count_mismatch``: nothing attached, hint to warm up or use launch-skip.
  Surplus rows are never shifted onto another key.
- C02 / C16: timeline kernels without an ncu row are ``timeline_only`` with a reason:
  ``communication_not_profiled`` (NCCL), ``launched_on_other_thread`` (none of the key is in ncu and it was
  launched from a thread none of the matched kernels was launched from: an NVTX include filter only sees
  push/pop ranges of the launching thread), ``not_in_ncu``, ``fewer_ncu_launches``, ``after_name_divergence``,
  ``count_mismatch``.
"""

from __future__ import annotations

import re

import pandas as pd

KERNEL_COLUMNS = ("source", "ncu_id", "pid", "name", "match_key", "occurrence", "stream", "grid", "block")
COMMUNICATION = re.compile(r"^(?:void )?nccl|ncclDevKernel|ncclKernel|_Z\d+nccl", re.IGNORECASE)


# ------------------------------------------------------------------------------------------- names

def is_mangled(name: str) -> bool:
    return isinstance(name, str) and name.startswith("_Z")


def _mangled_base(name: str) -> str | None:
    """Last unqualified source name of an Itanium mangled function name (``_ZN2at6native3fooIiEEvT_`` -> foo)."""
    s, i = name, 2
    if i < len(s) and s[i] == "L":
        i += 1
    nested = i < len(s) and s[i] == "N"
    if nested:
        i += 1
        while i < len(s) and s[i] in "rVKRO":
            i += 1
    last = None
    while i < len(s):
        if s.startswith("St", i):
            i += 2
            continue
        if s.startswith("12_GLOBAL__N_1", i):  # anonymous namespace
            i += 14
            continue
        m = re.match(r"\d+", s[i:])
        if not m:
            break
        n = int(m.group())
        i += len(m.group())
        last = s[i:i + n]
        i += n
        if not nested:
            break
        if i < len(s) and s[i] == "I":  # template arguments follow the function name
            break
        if i < len(s) and s[i] == "E":
            break
    return last


def _strip_balanced(s: str, open_: str, close: str) -> str:
    out, depth = [], 0
    for ch in s:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def base_name(name: str) -> str:
    """The function name without return type, namespaces, template arguments and parameters."""
    if not isinstance(name, str):
        return ""
    if is_mangled(name):
        return _mangled_base(name) or name
    s = name.replace("(anonymous namespace)", "anon").replace("<unnamed>", "anon")
    s = _strip_balanced(s, "<", ">")
    s = _strip_balanced(s, "(", ")")
    s = s.strip().split()[-1] if s.strip() else s
    return s.split("::")[-1]


def names_agree(timeline_name, timeline_mangled, ncu_name) -> bool:
    """Whether an ncu name and a timeline kernel's names denote the same function (module docstring)."""
    if not isinstance(ncu_name, str):
        return False
    if is_mangled(ncu_name) and isinstance(timeline_mangled, str) and timeline_mangled:
        return ncu_name == timeline_mangled
    for tl in (timeline_name, timeline_mangled):
        if isinstance(tl, str) and tl and (tl == ncu_name or base_name(tl) == base_name(ncu_name)):
            return True
    return False


def _config(row) -> tuple | None:
    g, b = row.get("grid"), row.get("block")
    if isinstance(g, str) and isinstance(b, str) and g and b:
        return (g.replace(" ", ""), b.replace(" ", ""))
    return None


# ---------------------------------------------------------------------------------------- matching

def _per_key(value, key, default):
    if isinstance(value, dict):
        return value.get(key, default)
    return default if value is None else value


def _window(kernels: pd.DataFrame, window: dict | None) -> tuple[pd.DataFrame, int]:
    """The timeline kernels inside the replayed window, with ``position`` (rank within the key)."""
    tl = kernels
    if "activity" in tl.columns:  # nsys <cuda_graph N> rows: never matched (DESIGN.md §3)
        tl = tl[tl["activity"].fillna("kernel") != "graph"]
    total = len(tl)
    window = window or {}
    if window.get("kernel_ids") is not None:
        tl = tl[tl["kernel_id"].isin(set(window["kernel_ids"]))]
    tl = tl.sort_values("kernel_id").copy()
    tl["position"] = tl.groupby("match_key", sort=False).cumcount()
    skip, count = window.get("launch_skip"), window.get("launch_count")
    if skip is not None or count is not None:
        keep = []
        for key, pos in zip(tl["match_key"], tl["position"]):
            s = int(_per_key(skip, key, 0) or 0)
            c = _per_key(count, key, None)
            keep.append(pos >= s and (c is None or pos < s + int(c)))
        tl = tl[keep].copy()
        tl["position"] = tl.groupby("match_key", sort=False).cumcount()
    return tl, total - len(tl)


def _source_window(windows: dict, source, union: pd.DataFrame) -> pd.DataFrame:
    """The timeline kernels of one ncu file's own window: looked up by the source as given, its file name,
    or its stem (``results/w/ncu/<cls>.csv`` -> ``<cls>``); a file without a window gets the union."""
    text = "" if source is None else str(source)
    name = text.replace("\\", "/").rsplit("/", 1)[-1]
    for key in (text, name, name.rsplit(".", 1)[0]):
        if key in windows:
            return windows[key]
    return union


def _resolve_keys(tl: pd.DataFrame, ncu_keys) -> dict:
    """ncu match_key -> timeline match_key (equal key, else a unique timeline key with that mangled or name)."""
    tl_keys = set(tl["match_key"])
    by_alias: dict[str, set] = {}
    for col in ("mangled_name", "name"):
        if col in tl.columns:
            for alias, key in zip(tl[col], tl["match_key"]):
                if isinstance(alias, str):
                    by_alias.setdefault(alias, set()).add(key)
    out = {}
    for k in ncu_keys:
        if k in tl_keys:
            out[k] = k
        elif len(by_alias.get(k, ())) == 1:
            out[k] = next(iter(by_alias[k]))
    return out


def match_invocations(kernels: pd.DataFrame, ncu: pd.DataFrame, window: dict | None = None
                      ) -> tuple[pd.DataFrame, dict]:
    """Match ncu rows (``ncu/{cls}.parquet``) to timeline kernels (``timeline/kernels.parquet``).

    Args:
        kernels: timeline kernels (``kernel_id, name, match_key``; optional ``mangled_name, grid, block,
            launch_tid, duration_ns, activity``).
        ncu: parsed ncu rows (``stages.parse_ncu_files``); ``occurrence`` orders the rows of a key, else
            ``ncu_id``. Several ``source`` files are matched independently.
        window: the replayed window: ``kernel_ids`` (the class instance / NVTX range replayed) and/or
            ``launch_skip`` / ``launch_count`` (an int, or ``{match_key: int}``), applied per key; or
            ``{"sources": {name: window}}``, one such window per ncu file (``source``, its file name or
            stem: the ncu replay's ``ncu/{cls}.csv`` -> ``cls``, :func:`operator_profiler.ncu.replay.match_window`),
            the rest of the timeline being outside the window.

    Returns:
        ``matched`` (``kernel_id, ncu_id, ncu_source``, then the metric columns; one row per matched kernel,
        ``attrs["units"]`` copied) and ``diagnostics`` (see the module docstring and DESIGN.md §4).
    """
    metrics = [c for c in ncu.columns if c not in KERNEL_COLUMNS]
    per_source = (window or {}).get("sources")
    if per_source is not None:  # one window per ncu file (a replay per layer class): the union is matched
        windows = {name: _window(kernels, w)[0] for name, w in per_source.items()}
        union = sorted({int(k) for w in windows.values() for k in w["kernel_id"]})
        tl, outside = _window(kernels, {"kernel_ids": union})
    else:
        tl, outside = _window(kernels, window)
    tl_by_id = tl.set_index("kernel_id", drop=False)
    diag = {"matched": 0, "ncu_only": 0, "timeline_only": 0, "outside_window": int(outside),
            "name_disagreements": [], "first_divergence": {}, "per_key": {}, "hints": [],
            "ncu_only_rows": [], "timeline_only_kernels": []}
    pairs: list[tuple[int, int]] = []  # (kernel_id, ncu row index)
    used_kernels: set = set()

    sources = ncu["source"].unique().tolist() if "source" in ncu.columns and len(ncu) else [None]
    for source in sources:
        part = ncu if source is None else ncu[ncu["source"] == source]
        order = ["occurrence", "ncu_id"] if "occurrence" in part.columns else ["ncu_id"]
        part = part.sort_values(order)
        src_tl = tl if per_source is None else _source_window(windows, source, tl)
        key_map = _resolve_keys(src_tl, part["match_key"].unique()) if len(part) else {}
        for nkey, rows in part.groupby("match_key", sort=False):
            tkey = key_map.get(nkey)
            if tkey is None:
                for idx, r in rows.iterrows():
                    _ncu_only(diag, r, "no_timeline_kernel_with_this_key", source)
                diag["per_key"][str(nkey)] = {"timeline": 0, "ncu": len(rows), "matched": 0, "status": "ncu_only"}
                continue
            cands = src_tl[(src_tl["match_key"] == tkey) & ~src_tl["kernel_id"].isin(used_kernels)]
            _match_key(diag, pairs, used_kernels, tkey, cands, rows, source)

    matched_ids = {k for k, _ in pairs}
    matched_tids = set(tl_by_id.loc[list(matched_ids), "launch_tid"].dropna()) if "launch_tid" in tl.columns else set()
    ncu_keys_present = {k for k, e in diag["per_key"].items() if e.get("ncu", 0)}
    for _, k in tl[~tl["kernel_id"].isin(matched_ids)].iterrows():
        reason = diag.setdefault("_reasons", {}).get(int(k["kernel_id"]))
        if reason is None:
            if COMMUNICATION.search(str(k.get("name", ""))) or COMMUNICATION.search(str(k["match_key"])):
                reason = "communication_not_profiled"
            elif k["match_key"] not in ncu_keys_present and "launch_tid" in tl.columns and matched_tids \
                    and pd.notna(k["launch_tid"]) and k["launch_tid"] not in matched_tids:
                reason = "launched_on_other_thread"
            else:
                reason = "not_in_ncu"
        diag["timeline_only_kernels"].append({"kernel_id": int(k["kernel_id"]), "name": str(k.get("name")),
                                              "match_key": str(k["match_key"]), "reason": reason})
    diag.pop("_reasons", None)
    diag["timeline_only"] = len(diag["timeline_only_kernels"])
    diag["matched"] = len(pairs)
    diag["ncu_only"] = len(diag["ncu_only_rows"])
    diag["timeline_only_reasons"] = _count(diag["timeline_only_kernels"])
    diag["ncu_only_reasons"] = _count(diag["ncu_only_rows"])
    if diag["timeline_only_reasons"].get("launched_on_other_thread"):
        diag["hints"].append("kernels launched on another thread have no ncu rows: an ncu --nvtx-include filter "
                             "matches push/pop ranges of the launching thread only (cases.md C02)")
    if diag["timeline_only_reasons"].get("communication_not_profiled"):
        diag["hints"].append("communication (NCCL) kernels are not profiled by ncu (cases.md C16)")
    diag["coverage_by_name"] = _coverage_by_name(tl, matched_ids)
    diag["counters_coverage"] = _time_coverage(tl, matched_ids)

    rows = []
    for kid, idx in pairs:
        r = ncu.loc[idx]
        rows.append({"kernel_id": int(kid), "ncu_id": int(r["ncu_id"]),
                     "ncu_source": str(r["source"]) if "source" in ncu.columns else None,
                     **{m: r[m] for m in metrics}})
    matched = pd.DataFrame(rows, columns=["kernel_id", "ncu_id", "ncu_source", *metrics])
    matched = matched.sort_values("kernel_id", ignore_index=True)
    matched["kernel_id"] = matched["kernel_id"].astype("int64")
    matched["ncu_id"] = matched["ncu_id"].astype("int64")
    for m in metrics:
        if m in ncu.columns and str(ncu[m].dtype).startswith("float"):
            matched[m] = matched[m].astype("float64")
    matched.attrs = {"units": dict(ncu.attrs.get("units", {}))}
    return matched, diag


def _ncu_only(diag, r, reason, source):
    diag["ncu_only_rows"].append({"ncu_id": int(r["ncu_id"]), "source": None if source is None else str(source),
                                  "name": str(r["name"]), "reason": reason})


def _count(items) -> dict:
    out: dict = {}
    for it in items:
        out[it["reason"]] = out.get(it["reason"], 0) + 1
    return out


def _match_key(diag, pairs, used, key, cands: pd.DataFrame, rows: pd.DataFrame, source):
    reasons = diag.setdefault("_reasons", {})
    entry = {"timeline": len(cands), "ncu": len(rows), "matched": 0, "status": "ok"}
    diag["per_key"][str(key)] = entry
    tl_rows = [r for _, r in cands.iterrows()]
    ncu_rows = list(rows.iterrows())
    if len(ncu_rows) > len(tl_rows):  # C15: surplus ncu launches of this key
        configs = {_config(r) for r in tl_rows} - {None}
        fitting = [(i, r) for i, r in ncu_rows if configs and _config(r) in configs]
        if configs and len(fitting) == len(tl_rows):
            for i, r in ncu_rows:
                if _config(r) not in configs:
                    _ncu_only(diag, r, "likely_autotune_or_benchmark", source)
            ncu_rows = fitting
            entry["status"] = "ncu_surplus"
        else:
            entry["status"] = "count_mismatch"
            diag["hints"].append(f"{key}: ncu has {len(ncu_rows)} launches, the timeline {len(tl_rows)}, and the "
                                 "launch configuration cannot tell them apart: warm up (autotuning, "
                                 "cudnn.benchmark) before the ncu range or use --launch-skip (cases.md C15)")
            for _, r in ncu_rows:
                _ncu_only(diag, r, "count_mismatch", source)
            for r in tl_rows:
                reasons[int(r["kernel_id"])] = "count_mismatch"
            return
    n = min(len(tl_rows), len(ncu_rows))
    for pos in range(n):
        t, (idx, c) = tl_rows[pos], ncu_rows[pos]
        ok_name = names_agree(t.get("name"), t.get("mangled_name"), c["name"])
        ct, cc = _config(t), _config(c)
        ok_conf = ct is None or cc is None or ct == cc
        if not (ok_name and ok_conf):
            div = {"key": str(key), "position": pos, "kernel_id": int(t["kernel_id"]), "ncu_id": int(c["ncu_id"]),
                   "timeline_name": str(t.get("name")), "ncu_name": str(c["name"]),
                   "what": "name" if not ok_name else "launch configuration"}
            if not ok_conf:
                div.update(timeline_config=list(ct), ncu_config=list(cc))
            diag["name_disagreements"].append(div)
            diag["first_divergence"][str(key)] = div
            entry["status"] = "diverged"
            for r in tl_rows[pos:]:
                reasons[int(r["kernel_id"])] = "after_name_divergence"
            for _, r in ncu_rows[pos:]:
                _ncu_only(diag, r, "after_name_divergence", source)
            return
        pairs.append((int(t["kernel_id"]), idx))
        used.add(int(t["kernel_id"]))
        entry["matched"] += 1
    for r in tl_rows[n:]:
        reasons[int(r["kernel_id"])] = "fewer_ncu_launches"
    for _, r in ncu_rows[n:]:
        _ncu_only(diag, r, "more_ncu_launches", source)


def _coverage_by_name(tl: pd.DataFrame, matched_ids: set) -> dict:
    out = {}
    for name, g in tl.groupby("name", sort=True):
        out[str(name)] = f"{int(g['kernel_id'].isin(matched_ids).sum())}/{len(g)}"
    return out


def _time_coverage(tl: pd.DataFrame, matched_ids: set) -> dict:
    """Kernel time with counters: overall, compute, communication (cases.md C16)."""
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


def broadcast_to_instances(matched: pd.DataFrame, kernels: pd.DataFrame, kernel_layers: pd.DataFrame
                           ) -> tuple[pd.DataFrame, dict]:
    """Layer-class dedup: counters measured on one instance of a class are copied to every kernel of
    the class at the same position (DESIGN.md §1, layer classes).

    Args:
        matched: ``kernel_id`` + metric columns of the kernels ncu measured (:func:`match_invocations`).
        kernels: timeline kernels (``kernel_id, match_key``).
        kernel_layers: ``kernel_id, layer_class, position`` from :func:`operator_profiler.layers.classify_layers`
            (position: index of the kernel within its layer instance and iteration, or within the
            iteration's kernels outside layers, class ``rest``).

    Returns:
        ``(counters, stats)``: one row per kernel that has counters, its own or its class's, with
        ``counters_from`` (the measured kernel id), that kernel's ``ncu_id``/``ncu_source`` and the metric columns (``attrs["units"]`` kept);
        ``stats`` per class: measured kernels, kernels filled by broadcast, kernels left without counters
        because no kernel at their position was measured or its ``match_key`` differs (reported, never
        guessed), and, where two or more instances were measured (``dedup.verify``),
        ``verify_max_relative_difference`` per metric (the first measured instance stays the source).
    """
    metrics = [c for c in matched.columns if c not in ("kernel_id", "ncu_id", "ncu_source")]
    layout = kernel_layers[["kernel_id", "layer_class", "position"]].merge(
        kernels[["kernel_id", "match_key"]], on="kernel_id", how="left")
    measured = layout[layout["kernel_id"].isin(matched["kernel_id"])]
    # The first measured kernel at each (class, position) is the source (the representative's).
    sources = measured.sort_values("kernel_id").drop_duplicates(["layer_class", "position"])[
        ["layer_class", "position", "kernel_id", "match_key"]].rename(
        columns={"kernel_id": "counters_from", "match_key": "source_key"})
    placed = layout.merge(sources, on=["layer_class", "position"], how="left")
    own = placed["kernel_id"].isin(matched["kernel_id"])
    placed.loc[own, "counters_from"] = placed.loc[own, "kernel_id"]
    agrees = own | (placed["counters_from"].notna() & (placed["match_key"] == placed["source_key"]))
    stats: dict = {}
    for cls, group in placed.groupby("layer_class", sort=False, dropna=False):
        ok = agrees[group.index]
        stats[str(cls)] = {
            "kernels": len(group), "measured": int(own[group.index].sum()),
            "filled": int((ok & ~own[group.index]).sum()),
            "without_counters": int((~ok).sum()),
            "name_mismatch": int((group["counters_from"].notna() & ~ok).sum()),
        }
    # dedup.verify: where ncu measured two or more instances of a class, how far apart they are
    # (the largest relative difference per metric over the class's positions).
    twice = measured[measured.duplicated(["layer_class", "position"], keep=False)]
    if len(twice) and metrics:
        values = twice.merge(matched[["kernel_id", *metrics]], on="kernel_id")
        by_position = values.groupby(["layer_class", "position"])[metrics]
        spread = (by_position.max() - by_position.min()) / by_position.agg(lambda v: v.abs().max())
        for cls, table in spread.groupby(level=0):
            worst = table.max()
            stats[str(cls)]["verify_max_relative_difference"] = {
                m: float(v) for m, v in worst.items() if pd.notna(v)}
    filled = placed[agrees][["kernel_id", "counters_from"]].astype({"counters_from": "int64"})
    carry = [c for c in ("ncu_id", "ncu_source") if c in matched.columns]  # the measured row (DESIGN.md §3)
    counters = filled.merge(matched[["kernel_id", *carry, *metrics]].rename(columns={"kernel_id": "counters_from"}),
                            on="counters_from", how="left").sort_values("kernel_id").reset_index(drop=True)
    counters.attrs = {"units": matched.attrs.get("units", {})}
    return counters, stats
