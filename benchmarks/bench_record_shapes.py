"""What recording input shapes (torch.profiler ``record_shapes``, which the capture turns on for the work
per operator) costs in measured time, side by side in one run.

    python benchmarks/bench_record_shapes.py [--config config/config.yaml] [--rounds 6] [--iterations 10]

For each workload of the config (eager, and compiled where the config compiles it), rounds alternate a
profiled window of ``--iterations`` iterations with ``record_shapes=False`` and one with ``True``; each
iteration is timed (wall, perf_counter). Prints per workload the median iteration time of each setting, their
ratio, and the spread of the ratio over rounds: a ratio inside the round-to-round spread is noise.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import yaml
from torch.profiler import ProfilerActivity, profile

from operator_profiler.capture.workloads import build_workload
from operator_profiler.config import validate_config


def window(step, shapes: bool, iterations: int) -> list[float]:
    times = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes):
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
        off, on, ratios = [], [], []
        for _ in range(args.rounds):
            a = window(step, False, args.iterations)
            b = window(step, True, args.iterations)
            off += a
            on += b
            ratios.append(statistics.median(b) / statistics.median(a))
        mode = "compiled" if workload.get("compile") else "eager"
        print(f"{name} ({mode}): median iteration {statistics.median(off) * 1e3:.3f} ms without shapes, "
              f"{statistics.median(on) * 1e3:.3f} ms with: ratio {statistics.median(on) / statistics.median(off):.3f} "
              f"(per round {min(ratios):.3f} - {max(ratios):.3f})")


if __name__ == "__main__":
    main()
