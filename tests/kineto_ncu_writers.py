"""Small writers of a torch.profiler (Kineto) trace and an ncu ``--csv --page raw``-style details CSV for tests
with hand-made launch sequences (test support, not a test). Each launch gets correlation id ``1000 + index``;
each ncu row's ``dram__bytes.sum`` is ``1_000_000 + launch index``, so an attached counter names its launch."""

from __future__ import annotations

import csv
import io
import json

PID = 4242
NCU_HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
              "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]


def launch(tid, name, ts_us, stream=7, grid=(64, 1, 1), block=(128, 1, 1), op=None, launch_dur=4, dur=5):
    return dict(tid=tid, name=name, ts_us=ts_us, stream=stream, grid=grid, block=block, op=op,
                launch_dur=launch_dur, dur=dur)


def write_kineto(path, launches, steps=()):
    """``steps``: ``(n, start_us, end_us)`` ProfilerStep#n annotations on the first launch's thread."""
    ev = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "python3"}}]
    for n, lo, hi in steps:
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": PID,
                   "tid": launches[0]["tid"], "ts": lo, "dur": hi - lo, "args": {}})
    gpu_free: dict = {}
    for i, k in enumerate(launches):
        corr, ts, ext = 1000 + i, k["ts_us"], 5000 + i
        if k["op"]:
            ev.append({"ph": "X", "cat": "cpu_op", "name": k["op"], "pid": PID, "tid": k["tid"], "ts": ts - 1,
                       "dur": k["launch_dur"] + 2, "args": {"External id": ext}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": k["tid"],
                   "ts": ts, "dur": k["launch_dur"], "args": {"correlation": corr, "External id": ext}})
        start = max(ts + 10, gpu_free.get(k["stream"], 0))
        gpu_free[k["stream"]] = start + k["dur"] + 1
        ev.append({"ph": "X", "cat": "kernel", "name": k["name"], "pid": 0, "tid": k["stream"], "ts": start,
                   "dur": k["dur"], "args": {"External id": ext, "device": 0, "stream": k["stream"],
                                             "correlation": corr, "grid": list(k["grid"]),
                                             "block": list(k["block"])}})
    json.dump({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "computeMajor": 9,
                                                         "computeMinor": 0, "numSms": 132}],
               "traceEvents": ev}, open(path, "w"))


def write_ncu_csv(path, launches, order, header=NCU_HEADER, names=None, values=None, grids=None):
    """Rows in ``order`` (launch indices); ``names``/``grids``/``values``: per row overrides of the kernel name,
    the grid and the ``dram__bytes.sum`` text."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(header)
    for rid, x in enumerate(order):
        k = launches[x]
        grid = (grids or {}).get(rid, k["grid"])
        for metric, unit, val in (("dram__bytes.sum", "byte", f"{1_000_000 + x:,}"),
                                  ("gpu__time_duration.sum", "nsecond", "500")):
            if metric == "dram__bytes.sum" and values and rid in values:
                val = values[rid]
            row = {"ID": str(rid), "Process ID": "7001", "Process Name": "python3", "Host Name": "h",
                   "Kernel Name": (names or {}).get(rid, k["name"]), "Context": "1", "Stream": str(k["stream"]),
                   "Block Size": "(%d, %d, %d)" % tuple(k["block"]), "Grid Size": "(%d, %d, %d)" % tuple(grid),
                   "Device": "0", "CC": "9.0", "Section Name": "Command line profiler metrics",
                   "Metric Name": metric, "Metric Unit": unit, "Metric Value": val}
            w.writerow([row.get(h, "") for h in header])
    open(path, "w").write(buf.getvalue())
