"""The ``opprof`` commands as users run them, each in a process of its own: wall time, CPU time and peak RSS.

Shared by ``bench_kineto_vs_hta.py`` and ``bench_nsys_attribution.py``, which print these command-level figures
beside their in-process ones. Each command runs under a small Python wrapper process that starts it and reads
``getrusage(RUSAGE_CHILDREN)`` after it ends: the peak RSS is then the command's own (``ru_maxrss`` of the one
child; Linux carries the high-water mark across fork+exec, so the floor is the wrapper's ~10 MB, not the
benchmark's), and the wall time includes the interpreter's start and the command's imports, as a user sees them.

Bytecode as an installed package has it: the package's modules are compiled once (``compileall``, as ``pip install``
does, and as Python's first import does for an editable install) and ``PYTHONDONTWRITEBYTECODE`` is not passed on (a
sandbox that sets it would otherwise have each command compile the package's ~100 modules from source: ~0.08 s).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs argv[1:], then prints the child's wall seconds, CPU seconds (user + system) and peak RSS (MB) as JSON.
WRAPPER = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
                  "returncode": proc.returncode, "stderr": proc.stderr.decode(errors="replace")[-3000:]}))
"""


def run_command(args: list[str], python: str = sys.executable, src: Path = ROOT / "src") -> dict:
    """``python -m operator_profiler.cli ARGS`` in a process of its own, with ``src`` (default: this checkout's)
    first on ``PYTHONPATH``: ``{"wall_s", "cpu_s", "peak_rss_mb", "returncode", "stderr"}`` (seconds, MB).

    Raises:
        SystemExit: the command failed (its stderr's tail in the message)."""
    _compile_once(python, src)
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [python, "-m", "operator_profiler.cli", *args]
    proc = subprocess.run([python, "-c", WRAPPER, *argv], capture_output=True, text=True, env=env, check=False)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise SystemExit(f"opprof {' '.join(args)}: the wrapper failed: {proc.stderr[-2000:]}") from None
    if result["returncode"] != 0:
        raise SystemExit(f"opprof {' '.join(args)} exited {result['returncode']}: {result['stderr']}")
    return result


@functools.cache
def _compile_once(python: str, src: Path) -> None:
    """The package's bytecode, as an installed package has it (``__pycache__`` beside the sources; see the module's
    docstring). A folder that cannot be written to leaves the commands compiling as they go."""
    subprocess.run([python, "-m", "compileall", "-q", str(Path(src) / "operator_profiler")],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def timeline_and_attribute(trace: Path, kind: str, workdir: Path, src: Path = ROOT / "src") -> dict[str, dict]:
    """``opprof timeline --{kind} TRACE --out WORKDIR/timeline`` then ``opprof attribute --timeline ... --out
    WORKDIR/attribution.parquet``, as a user runs them: ``{"timeline": ..., "attribute": ..., "both": ...}``
    (:func:`run_command`'s figures; ``both``: the walls and CPU times summed, the larger peak RSS).

    ``kind``: ``kineto`` or ``nsys``; ``src``: the package to run (:func:`run_command`)."""
    timeline = Path(workdir) / "timeline"
    first = run_command(["timeline", f"--{kind}", str(trace), "--out", str(timeline)], src=src)
    second = run_command(["attribute", "--timeline", str(timeline),
                          "--out", str(Path(workdir) / "attribution.parquet")], src=src)
    both = {"wall_s": first["wall_s"] + second["wall_s"], "cpu_s": first["cpu_s"] + second["cpu_s"],
            "peak_rss_mb": max(first["peak_rss_mb"], second["peak_rss_mb"])}
    return {"timeline": first, "attribute": second, "both": both}


def describe(runs: dict[str, dict], kind: str) -> list[str]:
    """One line per command and one for both, for the benchmarks' output."""
    names = {"timeline": f"opprof timeline --{kind}", "attribute": "opprof attribute", "both": "both commands"}
    return [f"  {names[key]:<26} {r['wall_s']:7.2f} s wall {r['cpu_s']:7.2f} s CPU   "
            f"peak RSS {r['peak_rss_mb']:7,.0f} MB" for key, r in runs.items()]
