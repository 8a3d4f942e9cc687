"""What recording input shapes (torch.profiler ``record_shapes``, which the capture turns on for the work
per operator) costs in measured time, side by side in one run.

    python benchmarks/bench_record_shapes.py [--config config/config.yaml] [--rounds 6] [--iterations 10]

For each workload of the config (eager, and compiled where the config compiles it), rounds alternate a
profiled window of ``--iterations`` iterations with ``record_shapes=False``, one with ``True`` and one with
``True`` and PyTorch's execution trace beside it (what the capture's shapes iterations run, for the arguments
record_shapes leaves out: capture/op_inputs.py); each iteration is timed (wall, perf_counter). Prints per workload
the median iteration time of each setting, their ratios to the first, and the spread of the ratio over rounds: a
ratio inside the round-to-round spread is noise.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from operator_profiler.capture import op_inputs
from operator_profiler.capture.workloads import build_workload
from operator_profiler.config import validate_config


def window(step, shapes: bool, iterations: int, execution_trace: bool = False) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory() as folder:
        with (op_inputs.execution_trace(Path(folder) / "shapes") if execution_trace
              else contextlib.nullcontext(None)) as recording:
            with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes,
                         execution_trace_observer=recording.observer if recording else None):
                for _ in range(iterations):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    config = validate_config(yaml.safe_load(open(args.config)), args.config)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.iterations} iterations per setting")
    for name, workload in config["workloads"].items():
        if workload["kind"] == "custom":
            continue
        torch.manual_seed(0)
        model, inputs = build_workload(workload, "cpu")
        model.eval()
        fn = torch.compile(model) if workload.get("compile") else model

        def step():
            with torch.no_grad():
                fn(*inputs)

        for _ in range(3):  # compile and warm up outside the windows
            step()
        off, on, traced, ratios, traced_ratios = [], [], [], [], []
        for _ in range(args.rounds):
            a = window(step, False, args.iterations)
            b = window(step, True, args.iterations)
            c = window(step, True, args.iterations, execution_trace=True)
            off += a
            on += b
            traced += c
            ratios.append(statistics.median(b) / statistics.median(a))
            traced_ratios.append(statistics.median(c) / statistics.median(a))
        mode = "compiled" if workload.get("compile") else "eager"
        base = statistics.median(off)
        print(f"{name} ({mode}): median iteration {base * 1e3:.3f} ms without shapes, "
              f"{statistics.median(on) * 1e3:.3f} ms with: ratio {statistics.median(on) / base:.3f} "
              f"(per round {min(ratios):.3f} - {max(ratios):.3f}); with shapes and the execution trace "
              f"{statistics.median(traced) * 1e3:.3f} ms: ratio {statistics.median(traced) / base:.3f} "
              f"(per round {min(traced_ratios):.3f} - {max(traced_ratios):.3f})")


if __name__ == "__main__":
    main()
