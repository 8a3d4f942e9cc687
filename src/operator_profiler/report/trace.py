"""The timeline as a Chrome/Perfetto trace (``trace.json``): every kernel with its attribution and counters in
its ``args``, CPU ranges and launches nested per thread, so a user can see what the tables summarise.
Details: docs/modules.md#report-trace."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pandas as pd

GPU_PID_BASE = 1 << 23  # > Linux PID_MAX_LIMIT (2^22): a GPU process id never equals an OS pid
FLOW_CAT = "launch"
ATTRIBUTION_ARGS = ("operator", "forward_operator", "module", "layer", "layer_class", "path", "fused_ops",
                    "source_nodes")
_NOT_COUNTERS = {"kernel_id", "ncu_id", "ncu_source", "name_rung", "counters_from"}


def _value(v):
    """A table cell as a JSON value (NA/NaN -> None, numpy scalars/arrays -> Python)."""
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_value(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) else float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def _int_or_none(v):
    v = _value(v)
    return None if v is None else int(v)


class _Clock:
    def __init__(self, zero_ns: int):
        self.zero = int(zero_ns)

    def us(self, t_ns: int) -> float:
        return (int(t_ns) - self.zero) / 1000.0


def _zero_ns(kernels: pd.DataFrame, ranges: pd.DataFrame, *others: pd.DataFrame | None) -> int:
    starts = [kernels["start_ns"], ranges["start_ns"]]
    starts += [other["start_ns"] for other in others if other is not None]
    values = [int(s.dropna().min()) for s in starts if len(s.dropna())]
    return min(values) if values else 0


def _attribution_args(attribution: pd.DataFrame) -> dict[int, dict]:
    args = {}
    cols = [c for c in (*ATTRIBUTION_ARGS, "reason", "phase") if c in attribution.columns]
    for row in attribution[["kernel_id", *cols]].itertuples(index=False):
        rec = dict(zip(cols, (_value(v) for v in row[1:])))
        for optional in ("reason", "phase"):  # a partial answer's reason; the train-step phase
            if rec.get(optional) is None:
                rec.pop(optional, None)
        args[int(row[0])] = rec
    return args


def _counter_args(counters: pd.DataFrame | None) -> dict[int, dict]:
    if counters is None or not len(counters):
        return {}
    metrics = [c for c in counters.columns if c not in _NOT_COUNTERS]
    out = {}
    for rec in counters.to_dict("records"):
        values = {m: _value(rec[m]) for m in metrics}
        values = {m: v for m, v in values.items() if v is not None}
        if "counters_from" in rec and _value(rec["counters_from"]) is not None:
            values["counters_from"] = _value(rec["counters_from"])
        out[int(rec["kernel_id"])] = values
    return out


def _nest(events: list[dict], stats: dict) -> list[dict]:
    """Make the X events of one thread nest: sort by (start, longer first), clip an event that ends
    after the enclosing one to that end (counted in ``stats['ranges_clipped']``)."""
    events.sort(key=lambda e: (e["_start"], -e["_end"], e["_order"]))
    stack: list[int] = []
    for e in events:
        while stack and stack[-1] <= e["_start"]:
            stack.pop()
        if stack and e["_end"] > stack[-1]:
            e["args"]["clipped_end_ns"] = e["_end"]
            e["_end"] = stack[-1]
            stats["ranges_clipped"] += 1
        stack.append(e["_end"])
    return events


def _lanes(events: list[dict]) -> list[list[dict]]:
    """Split the kernels of one stream into lanes in which they nest (first lane that fits)."""
    events.sort(key=lambda e: (e["_start"], -e["_end"], e["_order"]))
    lanes: list[list[dict]] = []
    stacks: list[list[int]] = []
    for e in events:
        for lane, stack in zip(lanes, stacks):
            while stack and stack[-1] <= e["_start"]:
                stack.pop()
            if not stack or e["_end"] <= stack[-1]:
                lane.append(e)
                stack.append(e["_end"])
                break
        else:
            lanes.append([e])
            stacks.append([e["_end"]])
    return lanes


def build_trace(kernels: pd.DataFrame, ranges: pd.DataFrame, attribution: pd.DataFrame,
                counters: pd.DataFrame | None = None, launches: pd.DataFrame | None = None,
                activities: pd.DataFrame | None = None) -> dict:
    """The trace as a JSON-ready dict (module docstring: events, units, nesting rules).

    Args:
        kernels: ``timeline/kernels.parquet`` (DESIGN.md §3; times int ns).
        ranges: ``timeline/ranges.parquet`` (nsys: with ``effective_end_ns`` for unclosed ranges).
        attribution: ``attribution/kernels.parquet``: one row per kernel of ``kernels``.
        counters: ``matched/kernel_metrics.parquet`` (``kernel_id``, ``ncu_id``, ``counters_from``,
            metrics in base units), or None.
        launches: ``timeline/launches.parquet`` (launch calls as ``X`` events), or None.
        activities: ``timeline/gpu_activities.parquet`` (memcpy/memset rows, ``timeline.model.ACTIVITY_COLUMNS``),
            or None.

    Raises:
        ValueError: the attribution does not list exactly the timeline's kernel ids.
    """
    k_ids = set(int(x) for x in kernels["kernel_id"])
    a_ids = set(int(x) for x in attribution["kernel_id"])
    if k_ids != a_ids:
        raise ValueError(f"the attribution lists {len(a_ids)} kernels, the timeline {len(k_ids)} "
                         f"({len(k_ids ^ a_ids)} ids differ): they come from different timelines")
    clock = _Clock(_zero_ns(kernels, ranges, launches, activities))
    attr = _attribution_args(attribution)
    ctr = _counter_args(counters)
    stats = {"ranges_clipped": 0, "ranges_unclosed_skipped": 0, "kernels_in_overlap_lanes": 0, "gpu_activities": 0}

    cpu_threads: dict[tuple[int, int], list[dict]] = defaultdict(list)
    gpu_streams: dict[tuple[int, int, int], list[dict]] = defaultdict(list)
    order = 0

    def x_event(name, cat, start, end, args):
        nonlocal order
        order += 1
        return {"name": name, "cat": cat, "ph": "X", "_start": int(start), "_end": int(end), "_order": order,
                "args": args}

    replaced_ranges: set[int] = set()
    flows = []  # (flow id, pid, launch tid, launch start ns, GPU start ns)
    for k in kernels.to_dict("records"):
        kid = int(k["kernel_id"])
        args = {"kernel_id": kid, **attr.get(kid, {})}
        args["duration_ns"] = int(k["duration_ns"])
        device = int(k["device"])
        if device < 0:  # a CPU kernel: written in place of its op's range on its thread
            args["self_ns"] = args.pop("duration_ns")
            if _int_or_none(k.get("range_id")) is not None:
                replaced_ranges.add(int(k["range_id"]))
                args["range_id"] = int(k["range_id"])
            tid = _int_or_none(k.get("launch_tid"))
            cpu_threads[(int(k["pid"]), tid if tid is not None else int(k["pid"]))].append(
                x_event(k["name"], "cpu_kernel", k["start_ns"], k["end_ns"], args))
            continue
        for col in ("grid", "block", "correlation_id", "launch_api"):
            if col in k and _value(k[col]) is not None:
                args[col] = _value(k[col])
        if kid in ctr:
            args["counters"] = ctr[kid]
        gpu_streams[(device, int(k["stream"]), int(k["pid"]))].append(
            x_event(k["name"], "kernel", k["start_ns"], k["end_ns"], args))
        launch_tid, launch_ts = _int_or_none(k.get("launch_tid")), _int_or_none(k.get("launch_start_ns"))
        if launch_tid is not None and launch_ts is not None:
            flows.append((kid, int(k["pid"]), launch_tid, launch_ts, int(k["start_ns"])))
    # memcpy/memset on their stream, between the kernels; flow ids continue after the kernel ids
    next_flow = max(k_ids, default=-1) + 1
    for a in (activities.to_dict("records") if activities is not None else ()):
        device, stream, pid = (_int_or_none(a.get(c)) for c in ("device", "stream", "pid"))
        if device is None or stream is None or pid is None:
            continue
        args = {"flow_id": next_flow, "duration_ns": int(a["end_ns"]) - int(a["start_ns"])}
        for col in ("bytes", "copy_kind", "correlation_id", "launch_api"):
            if _value(a.get(col)) is not None:
                args[col] = _value(a[col])
        name = "Memcpy " + str(args.get("copy_kind", "")) if a["kind"] == "memcpy" else "Memset"
        gpu_streams[(device, stream, pid)].append(x_event(name.strip(), str(a["kind"]), a["start_ns"], a["end_ns"],
                                                          args))
        launch_tid, launch_ts = _int_or_none(a.get("launch_tid")), _int_or_none(a.get("launch_start_ns"))
        if launch_tid is not None and launch_ts is not None:
            flows.append((next_flow, pid, launch_tid, launch_ts, int(a["start_ns"])))
        next_flow += 1
        stats["gpu_activities"] += 1

    effective = "effective_end_ns" in ranges.columns
    for r in ranges.to_dict("records"):
        rid = int(r["range_id"])
        if rid in replaced_ranges:
            continue
        end = _int_or_none(r["end_ns"])
        args = {"range_id": rid, "kind": _value(r["kind"])}
        for col in ("domain", "seq", "layer", "iteration"):
            if _value(r.get(col)) is not None:
                args[col] = _value(r[col])
        if end is None:
            end = _int_or_none(r["effective_end_ns"]) if effective else None
            if end is None:
                stats["ranges_unclosed_skipped"] += 1
                continue
            args["unclosed"] = True
        cpu_threads[(int(r["pid"]), int(r["tid"]))].append(
            x_event(r["name"], _value(r["kind"]) or "range", r["start_ns"], end, args))
    if launches is not None:
        for c in launches.to_dict("records"):
            args = {"launch_id": int(c["launch_id"])}
            if _value(c.get("correlation_id")) is not None:
                args["correlation_id"] = int(c["correlation_id"])
            cpu_threads[(int(c["pid"]), int(c["tid"]))].append(
                x_event(c["api"], "cuda_api", c["start_ns"], c["end_ns"], args))

    out: list[dict] = []
    meta: list[dict] = []

    def named(pid, tid, process, thread, p_sort, t_sort):
        if ("p", pid) not in seen:
            seen.add(("p", pid))
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                         "args": {"sort_index": p_sort}})
        if ("t", pid, tid) not in seen:
            seen.add(("t", pid, tid))
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"sort_index": t_sort}})

    seen: set = set()
    # flows start on a thread whose events are written: make sure every launch thread is named
    for pid, launch_tid in sorted({(f[1], f[2]) for f in flows}):
        cpu_threads.setdefault((pid, launch_tid), [])
    for p_index, (pid, tid) in enumerate(sorted(cpu_threads)):
        named(pid, tid, f"CPU process {pid}", f"thread {tid}", pid, tid)
        for e in _nest(cpu_threads[(pid, tid)], stats):
            out.append(_finish(e, pid, tid, clock))
    kernel_track: dict[int, tuple[int, int]] = {}
    by_device: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for device, stream, pid in sorted(gpu_streams):
        by_device[device].append((stream, pid))
    for device, keys in sorted(by_device.items()):
        gpid = GPU_PID_BASE + device
        pids = {pid for _, pid in keys}
        next_tid = max(stream for stream, _ in keys) + 1
        for stream, pid in keys:
            label = f"stream {stream}" + (f" (pid {pid})" if len(pids) > 1 else "")
            for lane_no, lane in enumerate(_lanes(gpu_streams[(device, stream, pid)])):
                first = lane_no == 0 and pid == min(p for s, p in keys if s == stream)
                if first:
                    tid = stream
                else:
                    tid, next_tid = next_tid, next_tid + 1
                    stats["kernels_in_overlap_lanes"] += len(lane) if lane_no else 0
                name = label + (f" (overlap {lane_no})" if lane_no else "")
                named(gpid, tid, f"GPU {device}", name, GPU_PID_BASE + device, stream * 100 + lane_no)
                for e in lane:
                    kernel_track[e["args"].get("kernel_id", e["args"].get("flow_id"))] = (gpid, tid)
                    out.append(_finish(e, gpid, tid, clock))
    flow_events = []
    for kid, pid, launch_tid, launch_ns, kernel_ns in flows:
        gpid, tid = kernel_track[kid]
        common = {"name": "launch", "cat": FLOW_CAT, "id": kid}
        flow_events.append({**common, "ph": "s", "pid": pid, "tid": launch_tid, "ts": clock.us(launch_ns)})
        flow_events.append({**common, "ph": "f", "bp": "e", "pid": gpid, "tid": tid, "ts": clock.us(kernel_ns)})
    return {
        "traceEvents": meta + out + flow_events,
        "displayTimeUnit": "ns",
        "otherData": {"producer": "operator_profiler", "time_zero_ns": str(clock.zero), "time_unit": "us",
                      "kernels": len(kernels), "flows": len(flows), **stats},
    }


def _finish(e: dict, pid: int, tid: int, clock: _Clock) -> dict:
    start, end = e.pop("_start"), e.pop("_end")
    e.pop("_order")
    if "clipped_end_ns" in e["args"]:
        e["args"]["clipped_end_us"] = clock.us(e["args"].pop("clipped_end_ns"))
    e.update(pid=pid, tid=tid, ts=clock.us(start), dur=(end - start) / 1000.0)
    return e


def dumps(trace: dict) -> str:
    """Compact JSON text of a trace (``allow_nan=False``: a NaN would make the file unreadable).

    Raises:
        ValueError: a NaN or infinity in an argument.
    """
    return json.dumps(trace, separators=(",", ":"), allow_nan=False)
