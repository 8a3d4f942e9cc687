"""Speed of the Kineto reader and of attribution against the floor of merely parsing the JSON,
measured side by side.

    python benchmarks/bench_kineto_reader.py [--steps 2000]

Writes a synthetic CPU trace shaped like our captures (iteration range > layer range > compiled
region > C++ kernels and extern GEMMs with nested copies), then times ``json.load`` of it and
``read_kineto`` on it, and prints the ratio (reader time / parse time) and events per second.
Targets: the reader stays within a small constant factor (< 10x) of parsing; attribution (interval
trees per thread, one query per kernel) is reported the same way to watch its per-kernel cost.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path

from operator_profiler.attribution.merge import attribute
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.kineto import read_kineto


def synthetic_trace(steps: int) -> dict:
    events, ts = [], 0.0

    def x(cat, name, start, dur, **args):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": round(start, 3),
                       "dur": round(dur, 3), "args": args})

    for step in range(steps):
        x("user_annotation", f"opprof.iteration:{step}", ts, 100.0)
        for layer in range(4):
            base = ts + 1 + layer * 24
            x("user_annotation", f"opprof.layer:h.{layer}", base, 23.0)
            x("user_annotation", "## Call CompiledFxGraph None ##", base + 0.5, 22.0)
            x("cpu_op", "graph_0_cpp_fused_native_layer_norm_0", base + 1, 2.0)
            x("cpu_op", "aten::addmm", base + 4, 8.0)
            x("cpu_op", "aten::expand", base + 4.2, 0.5)
            x("cpu_op", "aten::as_strided", base + 4.3, 0.1)
            x("cpu_op", "aten::copy_", base + 5, 1.5)
            x("cpu_op", "graph_0_cpp_fused_gelu_1", base + 13, 3.0)
        ts += 101.0
    return {"schemaVersion": 1, "baseTimeNanoseconds": 1790857026000000000, "traceEvents": events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json.gz"
        trace = synthetic_trace(args.steps)
        with gzip.open(path, "wt") as fh:
            json.dump(trace, fh)
        n_events = len(trace["traceEvents"])
        del trace
        t0 = time.perf_counter()
        with gzip.open(path, "rt") as fh:
            json.load(fh)
        parse_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        timeline = read_kineto(path)
        read_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        layers = [{"path": f"h.{i}", "class": "Block", "param_shapes": {}} for i in range(4)]
        kernel_layers, _, _ = classify_layers(timeline.kernels, timeline.ranges, layers)
        attribute(timeline.kernels, timeline.ranges, kernel_layers, None)
        attribute_s = time.perf_counter() - t0
    print(f"events: {n_events}, kernels: {len(timeline.kernels)}")
    print(f"json.load: {parse_s:.2f} s   read_kineto: {read_s:.2f} s   ratio: {read_s / parse_s:.1f}x   "
          f"({n_events / read_s:,.0f} events/s)")
    print(f"classify + attribute: {attribute_s:.2f} s   ratio to json.load: {attribute_s / parse_s:.1f}x   "
          f"({len(timeline.kernels) / attribute_s:,.0f} kernels/s)")


if __name__ == "__main__":
    main()
