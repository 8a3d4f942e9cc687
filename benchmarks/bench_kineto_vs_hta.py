"""Our Kineto path against Holistic Trace Analysis (HTA) on the same trace: wall time and peak memory.

    python benchmarks/bench_kineto_vs_hta.py [--trace PATH] [--sizes 1,3,10] [--cache-dir DIR]
                                             [--hta-python PYTHON | --install-hta]

Sides, each in its own subprocess (so that each peak RSS, ``ru_maxrss`` of that process, is its own;
Linux keeps ``ru_maxrss`` across fork+exec, so the parent never loads a trace itself):

* **ours** — what ``opprof timeline --kineto`` does (``read_kineto`` + ``write_timeline`` to a temporary
  folder) followed by attribution path (a): ``kernel_layer_classes(kernels, ranges, [])`` and
  ``attribute(kernels, ranges, kernel_layers, None)``, in one process, holding for the attribution what
  ``opprof attribute`` loads (the kernels and ranges tables; the launch calls and memcpy rows are dropped
  after writing). Run as the two commands (the **commands** side), the second re-reads the tables from parquet
  instead, whose decoding has a peak of its own.
* **HTA** — ``hta.common.trace.Trace(...).parse_traces(use_multiprocessing=False)`` (HTA's parser:
  the trace as a DataFrame) and ``hta.common.call_stack.CallGraph(trace)`` (its call stacks by time
  enclosure: the counterpart of our range nesting + kernel-to-operator attribution).
* **commands** — ``opprof timeline --kineto TRACE`` then ``opprof attribute`` on its folder, each a process of its
  own as a user runs them (``command_runs.py``): wall and CPU time of the whole process (interpreter start,
  imports, the parquet round trip between the two), the larger of the two peak RSS. Goals on the x10 trace, the
  two commands together: >= 6x faster than HTA's whole process, faster than ``orjson.loads``, peak RSS <= 1/4
  of HTA's.

HolisticTraceAnalysis 0.5.0 (PyPI) runs with pandas 3 (checked), but it brings Jupyter, plotly and
more, so it is not installed into the project's environment: ``--hta-python`` names an interpreter that
has it, or ``--install-hta`` creates a venv under ``<cache-dir>/hta-venv`` (once; needs PyPI).

Also timed, each in its own subprocess: ``orjson.loads`` of the whole decompressed document (the floor
set for the reader: it must beat one parse of the JSON into Python objects; garbage collector as Python
leaves it) and gzip decompression alone (8 MB reads).

Traces: the largest real Kineto trace (``../shared/data/real/kineto/hta_df_index_resolver.json.gz``,
53.7 MB JSON, 216k events, 19,370 kernels) and copies replicated ``--sizes`` times (events shifted in time by
the trace's span, with fresh correlation / ``External id`` / flow ids, so launches still join their kernels),
written once into the cache dir. Time = the work in the child after its imports (``import`` time is reported
separately), wall and CPU (user + system: the machine is shared, so CPU time is the steadier figure); the
load average is printed at the start and the end. Goals: on the x10 trace ours >= 6x faster than
HTA and faster than ``orjson.loads``, peak RSS <= 1/4 of HTA's and growing less than linearly with the trace;
on the real trace >= 3x faster than HTA. HTA is not installed here by default: without ``--hta-python`` or
``--install-hta`` (or ``hta`` importable by this interpreter) its side is skipped and said so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from command_runs import describe, timeline_and_attribute  # noqa: E402  (the benchmarks folder is no package)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "data" / "real" / "kineto" / "hta_df_index_resolver.json.gz"
HTA_REQUIREMENT = "HolisticTraceAnalysis==0.5.0"

OURS = r"""
import json, resource, sys, tempfile, time
t0 = time.perf_counter()
from operator_profiler.attribution.merge import attribute
from operator_profiler.layers import kernel_layer_classes
from operator_profiler.timeline.kineto import read_kineto
from operator_profiler.timeline.model import write_timeline
t1 = time.perf_counter()
c1 = resource.getrusage(resource.RUSAGE_SELF)
timeline = read_kineto(sys.argv[1])
with tempfile.TemporaryDirectory() as out:
    write_timeline(timeline, out)
rows, warnings = len(timeline.kernels) + len(timeline.launches) + len(timeline.ranges), len(timeline.warnings)
# What `opprof attribute` loads: the kernels and ranges (launch calls and memcpy rows are the timeline's business)
kernels, ranges = timeline.kernels, timeline.ranges
del timeline
t2 = time.perf_counter()
kernel_layers = kernel_layer_classes(kernels, ranges, [])
attributed = attribute(kernels, ranges, kernel_layers, None)
t3 = time.perf_counter()
c3 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"import_s": t1 - t0, "parse_s": t2 - t1, "stacks_s": t3 - t2, "work_s": t3 - t1,
                  "cpu_s": c3.ru_utime + c3.ru_stime - c1.ru_utime - c1.ru_stime,
                  "rows": rows, "kernels": len(kernels), "warnings": warnings,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

HTA = r"""
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.common.call_stack import CallGraph
from hta.common.trace import Trace
t1 = time.perf_counter()
c1 = resource.getrusage(resource.RUSAGE_SELF)
trace = Trace(trace_files={0: sys.argv[1]}, trace_dir="")
trace.parse_traces(use_multiprocessing=False)
t2 = time.perf_counter()
graph = CallGraph(trace)
t3 = time.perf_counter()
c3 = resource.getrusage(resource.RUSAGE_SELF)
df = trace.get_trace(0)
print(json.dumps({"import_s": t1 - t0, "parse_s": t2 - t1, "stacks_s": t3 - t2, "work_s": t3 - t1,
                  "cpu_s": c3.ru_utime + c3.ru_stime - c1.ru_utime - c1.ru_stime,
                  "rows": len(df), "kernels": int((df["stream"] > 0).sum()), "warnings": 0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def replicate(src: Path, dst: Path, copies: int) -> None:
    """Write ``copies`` time-shifted copies of ``src``'s events as one valid trace (compact JSON, gzip)."""
    import orjson

    with gzip.open(src, "rb") as fh:
        trace = orjson.loads(fh.read())
    events = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    lo = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - lo + 1000  # µs
    ids = [v for e in events for v in ((e.get("args") or {}).get("correlation"), (e.get("args") or {}).get("External id"),
                                        e.get("id")) if isinstance(v, int)]
    stride = max(ids, default=0) + 1
    tmp = dst.with_suffix(".tmp")
    with gzip.open(tmp, "wb", compresslevel=1) as out:
        out.write(orjson.dumps(trace)[:-1] + b', "traceEvents": [')
        first = True
        for k in range(copies):
            chunk = []
            for e in events:
                if k and e.get("ph") == "M":
                    continue  # metadata events once
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + k * span
                if isinstance(e.get("id"), int):
                    e["id"] += k * stride
                args = e.get("args")
                if isinstance(args, dict):
                    args = e["args"] = dict(args)
                    for key in ("correlation", "External id"):
                        if isinstance(args.get(key), int) and args[key] > 0:
                            args[key] += k * stride
                chunk.append(orjson.dumps(e))
            out.write((b"" if first else b", ") + b", ".join(chunk))
            first = False
        out.write(b"]}")
    tmp.rename(dst)


ORJSON = r"""
import gzip, json, resource, sys, time
t0 = time.perf_counter()
import orjson
t1 = time.perf_counter()
with gzip.open(sys.argv[1], "rb") as fh:
    text = fh.read()
t2 = time.perf_counter()
c2 = resource.getrusage(resource.RUSAGE_SELF)
doc = orjson.loads(text)
t3 = time.perf_counter()
c3 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"import_s": t1 - t0, "parse_s": t3 - t2, "stacks_s": 0.0, "work_s": t3 - t2,
                  "cpu_s": c3.ru_utime + c3.ru_stime - c2.ru_utime - c2.ru_stime,
                  "rows": len(doc["traceEvents"]), "kernels": 0, "warnings": 0, "decompressed_mb": len(text) / 1e6,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

GUNZIP = r"""
import gzip, json, resource, sys, time
t0 = time.perf_counter()
c0 = resource.getrusage(resource.RUSAGE_SELF)
n = 0
with gzip.open(sys.argv[1], "rb") as fh:
    while block := fh.read(8 << 20):
        n += len(block)
t1 = time.perf_counter()
c1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"import_s": 0.0, "parse_s": t1 - t0, "stacks_s": 0.0, "work_s": t1 - t0, "rows": 0,
                  "cpu_s": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime,
                  "kernels": 0, "warnings": 0, "decompressed_mb": n / 1e6,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def hta_python(cache: Path, given: str | None, install: bool) -> str | None:
    """An interpreter that imports ``hta``: ``given``, this one, the cached venv, or (``install``) a new venv;
    None when there is none (the HTA side is then skipped and said so)."""
    if given:
        return given
    probe = subprocess.run([sys.executable, "-c", "import hta"], capture_output=True)
    if probe.returncode == 0:
        return sys.executable
    env = cache / "hta-venv"
    python = env / "bin" / "python"
    if not python.exists():
        if not install:
            return None
        print(f"creating {env} with {HTA_REQUIREMENT} (once) ...", flush=True)
        venv.create(env, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", HTA_REQUIREMENT], check=True)
    return str(python)


def run(python: str, script: str, trace: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-c", script, str(trace)], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise SystemExit(f"{python} failed on {trace}: {lines[-1] if lines else 'no message'}"
                         + ("" if "Error: " in (lines[-1] if lines else "") and "Traceback" not in lines[-1] else
                            f"\n{proc.stderr[-3000:]}"))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


def replica(cache: Path, trace: Path, copies: int) -> Path:
    big = cache / f"{trace.name.removesuffix('.json.gz')}_x{copies}.json.gz"
    if not big.exists():
        print(f"writing {big} ...", flush=True)
        # in a child: ru_maxrss survives fork+exec, so this (small) process must stay small
        done = subprocess.run([sys.executable, __file__, "--write-replica", str(trace), str(big), str(copies)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise SystemExit(f"--trace {trace}: cannot be replicated ({lines[-1] if lines else 'no message'}); "
                             "give a gzipped torch.profiler (Kineto) trace")
    return big


def load() -> str:
    return "load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    if sys.argv[1:2] == ["--write-replica"]:
        replicate(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--sizes", default="1,3,10", help="replica counts to measure (1: the trace itself)")
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                        / "operator_profiler" / "bench")
    parser.add_argument("--hta-python", help="interpreter with HolisticTraceAnalysis installed")
    parser.add_argument("--install-hta", action="store_true",
                        help=f"create <cache-dir>/hta-venv with {HTA_REQUIREMENT} when no interpreter has it (needs PyPI)")
    args = parser.parse_args()
    if not args.trace.is_file():
        raise SystemExit(f"trace not found: {args.trace}")
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--sizes {args.sizes!r}: give replica counts of 1 or more, comma-separated (e.g. 1,3,10)")
    try:
        args.cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"--cache-dir {args.cache_dir}: cannot be used as a folder ({exc})") from None
    traces = [(k, args.trace if k == 1 else replica(args.cache_dir, args.trace, k)) for k in sizes]
    hta = hta_python(args.cache_dir, args.hta_python, args.install_hta)
    print(f"start: {load()}")
    if hta is None:
        print("HTA: not importable here (no --hta-python, no cached venv; --install-hta creates one): HTA side skipped")

    met = commands_met = True
    peaks: dict[int, float] = {}
    print(f"\n{'trace':30s} {'side':12s} {'import s':>8s} {'parse s':>8s} {'stacks s':>8s} {'work s':>8s} "
          f"{'work cpu s':>10s} {'process s':>9s} {'peak RSS MB':>11s} {'rows':>9s} {'kernels':>8s}")
    for k, trace in traces:
        sides = [("ours", run(sys.executable, OURS, trace)), ("orjson.loads", run(sys.executable, ORJSON, trace)),
                 ("gunzip", run(sys.executable, GUNZIP, trace))]
        if hta is not None:
            sides.append(("HTA", run(hta, HTA, trace)))
        r = dict(sides)
        for side, x in sides:
            print(f"{trace.name[:30]:30s} {side:12s} {x['import_s']:8.2f} {x['parse_s']:8.2f} {x['stacks_s']:8.2f} "
                  f"{x['work_s']:8.2f} {x['cpu_s']:10.2f} {x['process_s']:9.2f} {x['peak_rss_mb']:11.0f} {x['rows']:9d} {x['kernels']:8d}")
        ours = r["ours"]
        peaks[k] = ours["peak_rss_mb"]
        line = (f"  x{k} ({r['gunzip']['decompressed_mb']:.0f} MB JSON): ours / orjson.loads time "
                f"{ours['work_s'] / r['orjson.loads']['work_s']:.2f} (CPU time {ours['cpu_s'] / r['orjson.loads']['cpu_s']:.2f}; "
                f"goal < 1 at x10)")
        ok = k != 10 or ours["work_s"] < r["orjson.loads"]["work_s"]
        if "HTA" in r:
            theirs = r["HTA"]
            speed = theirs["work_s"] / ours["work_s"]
            memory = ours["peak_rss_mb"] / theirs["peak_rss_mb"]
            # the goals: >= 6x and <= 1/4 of HTA's memory on the x10 trace, >= 3x on the real (x1) trace; the
            # memory goal is not applied at x1/x3, where both sides' fixed cost (the imports) dominates
            goal = {10: 6, 1: 3}.get(k)
            line += (f"; HTA/ours time {speed:.2f}x (CPU time {theirs['cpu_s'] / ours['cpu_s']:.2f}x, whole process "
                     f"{theirs['process_s'] / ours['process_s']:.2f}x, goal {f'>= {goal}x' if goal else 'none at this size'}), "
                     f"ours/HTA peak RSS {memory:.2f} (goal {'<= 0.25' if k == 10 else 'at x10 only'})")
            ok &= speed >= (goal or 0) and (k != 10 or memory <= 0.25)
        else:
            line += "; HTA n/a"
        met &= ok
        print(line + f" -> {'MET' if ok else 'NOT MET'}")
        with tempfile.TemporaryDirectory(prefix="bench-kineto-commands-") as work:
            commands = timeline_and_attribute(trace, "kineto", Path(work))
        print("\n".join(describe(commands, "kineto")))
        both = commands["both"]
        line = (f"  x{k} as users run it: commands / orjson.loads time "
                f"{both['wall_s'] / r['orjson.loads']['work_s']:.2f} (goal < 1 at x10); commands / ours in one "
                f"process {both['wall_s'] / ours['process_s']:.2f}")
        ok = k != 10 or both["wall_s"] < r["orjson.loads"]["work_s"]
        if "HTA" in r:
            speed = r["HTA"]["process_s"] / both["wall_s"]
            memory = both["peak_rss_mb"] / r["HTA"]["peak_rss_mb"]
            line += (f"; HTA's process / commands {speed:.2f}x (goal >= 6x at x10), commands/HTA peak RSS "
                     f"{memory:.2f} (goal <= 0.25 at x10)")
            ok &= k != 10 or (speed >= 6 and memory <= 0.25)
        else:
            line += "; HTA n/a"
        commands_met &= ok
        print(line + f" -> {'MET' if ok else 'NOT MET'}")
    if len(peaks) > 1:
        first = min(peaks)
        growth = ", ".join(f"x{k}: {peaks[k] / peaks[first]:.2f}" for k in sorted(peaks))
        sub = all(peaks[k] / peaks[first] < k / first for k in peaks if k != first)
        met &= sub
        print(f"\nours peak RSS relative to x{first} ({growth}): {'less than linear' if sub else 'NOT less than linear'}")
    print(f"end: {load()}")
    print(f"\ngoals measured here {'MET' if met else 'NOT MET'}" + ("" if hta else " (HTA goals not measured)"))
    if 10 in sizes:
        print(f"command-level goals measured here {'MET' if commands_met else 'NOT MET'}"
              + ("" if hta else " (HTA goals not measured)"))
    else:
        print("command-level goals: NOT JUDGED (they are set for the x10 trace; --sizes has no 10)")


if __name__ == "__main__":
    main()
