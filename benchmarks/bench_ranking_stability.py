"""Is the operator ranking stable from run to run? Runs the README's main command several times and compares.

    python benchmarks/bench_ranking_stability.py [--runs 3] [--top 5] [--tolerance 0.10] [--out DIR]
    python benchmarks/bench_ranking_stability.py --analyze DIR      # only compare runs already kept in DIR

Run from the repository root with the venv's Python and the package importable (PYTHONPATH=src or an install).
Each run is ``snakemake --cores 1 --forcerun capture_timeline`` (a fresh capture of every workload of
config/config.yaml and everything after it, the compile step kept); its ``operators.parquet``, ``modules.parquet``,
``layer_classes.parquet``, ``coverage.json`` and ``capture/run.json`` are kept under ``DIR/run<i>/<workload>/``
(``opprof compare`` reads them), with the load average (/proc/loadavg, as ``uptime`` prints it) before and after,
the CPU steal time during the run (/proc/stat: time a virtual machine's host gave to other guests), the run's
wall time and a 10 s probe of the machine's own speed taken before it (:func:`machine_probe`) in
``DIR/run<i>/meta.json``.

Then per workload: the top ``--top`` operators of each run (operators.parquet's order: by per-iteration median)
must be the same operators in the same order in every run, and each one's ``iteration_median_ns`` may differ
between runs by less than ``--tolerance`` ((max - min) / min over the runs). Prints the figures and PASS/FAIL;
exit status 1 on FAIL. The machine's load matters: on shared cores the scheduler stretches single iterations,
which the medians absorb only while it stays a minority of iterations, but a run-long slowdown (another process
or guest on the same physical core: measured here as 20-30 % CPU steal) scales every median of that run alike,
which no statistic within one run can remove; quote the load, the steal and the machine probe with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

# enough for opprof compare DIR/run1/<workload> DIR/run2/<workload> too
KEPT = ("operators.parquet", "modules.parquet", "layer_classes.parquet", "coverage.json", "capture/run.json")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (``uptime``'s figures), or ``unknown``."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat ``cpu`` line, jiffies): user, nice, system, idle, iowait, irq,
    softirq, steal; empty when unreadable."""
    try:
        return [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return []


def steal_share(before: list[int], after: list[int]) -> float | None:
    """The share of CPU time the hypervisor gave to other guests (``steal``) between two :func:`cpu_times`."""
    if len(before) < 8 or len(after) < 8:
        return None
    delta = [b - a for a, b in zip(before, after)]
    return delta[7] / sum(delta) if sum(delta) else None


PROBE = "the median time of torch.mm on two 256x256 float32 matrices (one thread's worth of work on two)"


def machine_probe(seconds: float = 10.0) -> list[float]:
    """The machine's own speed, before a run: per 1 s window, :data:`PROBE` in µs (median of the window's calls).
    Nothing of the profiler runs meanwhile, so the spread of these figures, within one probe and between the
    runs' probes, is the floor under any run-to-run difference of the profiled medians on this machine."""
    import statistics

    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    windows: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        calls, window_end = [], time.perf_counter() + 1.0
        while time.perf_counter() < window_end:
            t = time.perf_counter()
            torch.mm(a, b)
            calls.append(time.perf_counter() - t)
        windows.append(round(statistics.median(calls) * 1e6, 2))
    return windows


def spread(values: list[float]) -> float:
    """(max - min) / min, the run-to-run difference measure of :func:`compare_runs`."""
    return (max(values) - min(values)) / min(values) if values and min(values) > 0 else float("nan")


def workloads_of(configfile: Path) -> list[str]:
    from operator_profiler.config import load_config

    return list(load_config(configfile)["workloads"])


def run_once(index: int, out: Path, workloads: list[str], cores: int, extra: list[str]) -> dict:
    """One run of the workflow with fresh captures, after a :func:`machine_probe`; its tables kept under
    ``out/run<index>/``."""
    probe = machine_probe()
    before, ticks = load_average(), cpu_times()
    start = time.perf_counter()
    argv = [sys.executable, "-m", "snakemake", "--cores", str(cores), "--forcerun", "capture_timeline", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"run {index}: snakemake failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    steal = steal_share(ticks, cpu_times())
    meta = {"run": index, "wall_s": round(wall, 1), "load_before": before, "load_after": load_average(),
            "cpu_steal": None if steal is None else round(steal, 3), "argv": argv, "probe": PROBE,
            "probe_windows_us": probe}
    folder = out / f"run{index}"
    for workload in workloads:
        for name in KEPT:
            target = folder / workload / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path("results") / workload / name, target)
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"run {index}: {wall:.0f} s, load average {before} before, {meta['load_after']} after"
          + ("" if steal is None else f", CPU steal {steal * 100:.0f}%")
          + f"; machine probe {min(probe):.0f}-{max(probe):.0f} µs", flush=True)
    return meta


def compare_runs(out: Path, top: int, tolerance: float) -> bool:
    """Print, per workload, each run's top operators with their medians and the run-to-run differences; True when
    every workload's top ``top`` are identical in order and each median differs by less than ``tolerance``."""
    runs = sorted((p for p in out.glob("run*") if p.is_dir()), key=lambda p: int(p.name[3:]))
    if len(runs) < 2:
        sys.exit(f"{out}: fewer than 2 kept runs (run<i>/ folders) to compare")
    for run in runs:
        meta_path = run / "meta.json"
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            steal = meta.get("cpu_steal")
            print(f"{run.name}: {meta['wall_s']} s, load average {meta['load_before']} before, "
                  f"{meta['load_after']} after" + ("" if steal is None else f", CPU steal {steal * 100:.0f}%"))
    probes = []
    for run in runs:
        meta_path = run / "meta.json"
        windows = json.loads(meta_path.read_text()).get("probe_windows_us") if meta_path.is_file() else None
        if windows:
            probes.append((run.name, windows))
    if probes:
        import statistics

        medians = [statistics.median(w) for _, w in probes]
        within = max(spread(w) for _, w in probes)
        print(f"machine probe ({PROBE}), before each run, 1 s windows: "
              + "; ".join(f"{name} {min(w):.0f}-{max(w):.0f} µs (median {statistics.median(w):.0f})"
                          for name, w in probes)
              + f". The machine alone differs by {spread(medians) * 100:.1f}% between the runs' probe medians and "
              f"by up to {within * 100:.1f}% between 1 s windows of one probe: a tolerance below that cannot be met "
              "here, whatever the profiler does.")
    workloads = sorted({p.parent.name for p in runs[0].glob("*/operators.parquet")})
    ok = True
    for workload in workloads:
        tables = [pd.read_parquet(run / workload / "operators.parquet") for run in runs]
        if any("iteration_median_ns" not in t for t in tables):
            print(f"\n{workload}: no per-iteration medians (aggregate.per_iteration off): nothing to compare")
            ok = False
            continue
        tops = [list(t["operator"].head(top)) for t in tables]
        same_order = all(t == tops[0] for t in tops)
        warmups = []
        for run in runs:
            record = json.loads((run / workload / "capture" / "run.json").read_text()).get("warmup") or {}
            warmups.append(f"{record.get('iterations', '?')}{' (not steady)' if record.get('steady') is False else ''}")
        iterations = json.loads((runs[0] / workload / "capture" / "run.json").read_text())["harness"]["iterations"]
        print(f"\n{workload}: {iterations} measured iterations; warm-up iterations per run: {', '.join(warmups)}")
        print(f"  top {top} identical in order in all {len(runs)} runs: {'yes' if same_order else 'NO'}")
        if not same_order:
            for run, names in zip(runs, tops):
                print(f"    {run.name}: {', '.join(names)}")
        names = list(dict.fromkeys(n for t in tops for n in t))
        medians = {n: [float(t.set_index("operator")["iteration_median_ns"].get(n, float("nan"))) / 1e6
                       for t in tables] for n in names}
        width = min(max(len(n) for n in names), 60)
        header = "".join(f"{r.name + ' ms':>11}" for r in runs)
        print(f"  {'rank':>4}  {'operator':<{width}}{header}  max diff")
        worst = 0.0
        for rank, name in enumerate(names, start=1):
            values = medians[name]
            diff = (max(values) - min(values)) / min(values) if min(values) > 0 else float("inf")
            worst = max(worst, diff)
            shown = name if len(name) <= width else name[:width - 1] + "…"
            print(f"  {rank:>4}  {shown:<{width}}" + "".join(f"{v:>11.4f}" for v in values)
                  + f"  {diff * 100:7.1f}%" + ("" if diff < tolerance else "  <- over tolerance"))
        # the shares (of the sum of medians) beside: a slowdown of the whole run moves medians, not shares
        shares = {n: [float(t.set_index("operator")["time_share"].get(n, float("nan"))) * 100 for t in tables]
                  for n in names}
        print("  shares (% of the sum of medians): " + "; ".join(
            f"{n if len(n) <= 30 else n[:29] + '…'} " + "/".join(f"{v:.1f}" for v in shares[n]) for n in names))
        stable = same_order and worst < tolerance
        print(f"  largest median difference among the top {top}: {worst * 100:.1f}% "
              f"(tolerance {tolerance * 100:g}%): {'PASS' if stable else 'FAIL'}")
        ok &= stable
    print(f"\n{'PASS' if ok else 'FAIL'}: {len(workloads)} workload(s), {len(runs)} runs")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="workflow runs (default 3)")
    parser.add_argument("--top", type=int, default=5, help="operators per workload that must keep their order")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="largest allowed run-to-run difference of a top operator's median, a fraction")
    parser.add_argument("--out", type=Path, default=Path("logs/stability"), help="where the runs' tables are kept")
    parser.add_argument("--cores", type=int, default=1, help="snakemake --cores (the README's command: 1)")
    parser.add_argument("--configfile", type=Path, default=Path("config/config.yaml"))
    parser.add_argument("--analyze", type=Path, help="compare the runs kept in this folder; run nothing")
    parser.add_argument("snakemake_args", nargs="*", help="passed to snakemake after --, e.g. -- --config ...")
    args = parser.parse_args()
    if args.analyze is None:
        if not Path("Snakefile").is_file():
            sys.exit("run this from the repository root (no Snakefile here)")
        os.environ.setdefault("PYTHONPATH", str(Path("src").resolve()))
        workloads = workloads_of(args.configfile)
        extra = ["--configfile", str(args.configfile), *args.snakemake_args]
        for index in range(1, args.runs + 1):
            run_once(index, args.out, workloads, args.cores, extra)
    sys.exit(0 if compare_runs(args.analyze or args.out, args.top, args.tolerance) else 1)


if __name__ == "__main__":
    main()
