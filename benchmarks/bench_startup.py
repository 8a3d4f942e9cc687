"""Start-up as users run it: ``opprof --help``, a no-op workflow job and each rule script's import phase, each in a
fresh interpreter (a subprocess), as the shell and Snakemake start them.

    python benchmarks/bench_startup.py                                  # this checkout's src/
    python benchmarks/bench_startup.py --src /old/src --src src --repeat 7

Per entry point and ``--src`` (several are run alternately, so that a change of the machine's load hits them
alike) it prints:

- wall: the median wall seconds of ``--repeat`` runs of the whole process (interpreter start included);
- imports: the median of the seconds ``python -X importtime`` reports for the imports (the sum of its top-level
  entries' cumulative microseconds, interpreter start-up modules included; importtime's own bookkeeping makes
  this a little larger than without it);
- the heavy packages (``HEAVY``) the process imported.

Entry points:

- ``opprof --help``: ``python -m operator_profiler.cli --help``.
- ``no-op job``: the workflow's ``select_clocks`` job on a CPU run (``python -m operator_profiler.gpu_jobs
  select_clocks ...``: nothing to lock, it writes ``clocks/target.json``), the way the workflow's ``shell:``
  rule starts it; the whole job, not only its imports.
- ``script <name>``: a ``scripts/*.py`` rule script's module-level imports (the job's import phase, as in
  ``bench_workflow_jobs.py --script-imports``); what its work imports later is not counted here.

The figures depend on the machine's load: the load average at start and end is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_workflow_jobs import script_imports  # noqa: E402  (the benchmarks folder is no package)

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pandas", "pyarrow", "numpy", "jsonschema", "yaml", "sympy", "scipy", "plotly", "jinja2",
         "orjson")


def noop_job_argv(workdir: Path) -> list[str]:
    """The argv of a CPU run's ``select_clocks`` job (workflow/clocks.smk: ``gpu_shell("select_clocks")``)."""
    params = json.dumps({"clocks": json.dumps({}), "device": "cpu"}, sort_keys=True)
    files = json.dumps({"wildcards": {"workload": "noop"}, "input": {},
                        "output": {"target": str(workdir / "target.json")}}, sort_keys=True)
    return ["-m", "operator_profiler.gpu_jobs", "select_clocks", params, files, str(workdir / "select_clocks.log")]


def entry_points(workdir: Path) -> dict[str, list[str]]:
    """Name -> the interpreter arguments that start it."""
    points = {"opprof --help": ["-m", "operator_profiler.cli", "--help"], "no-op job": noop_job_argv(workdir)}
    for script in sorted((ROOT / "scripts").glob("*.py")):
        points[f"script {script.stem}"] = ["-c", script_imports(script)]
    return points


def import_seconds(importtime_stderr: str) -> float:
    """Seconds of imports in a ``-X importtime`` report: the sum of its top-level entries' cumulative times.

    A top-level entry's name has exactly one space after the ``|`` (nested ones are indented further)."""
    total_us = 0
    for line in importtime_stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line.split("|")
        if len(parts) == 3 and parts[2].startswith(" ") and not parts[2].startswith("  "):
            try:
                total_us += int(parts[1])
            except ValueError:  # the header line ("cumulative")
                pass
    return total_us / 1e6


def heavy_imported(importtime_stderr: str) -> list[str]:
    """The ``HEAVY`` packages a ``-X importtime`` report shows imported (at any depth)."""
    names = {line.split("|")[-1].strip() for line in importtime_stderr.splitlines() if line.startswith("import time:")}
    return [name for name in HEAVY if name in names]


def run_once(argv: list[str], src: Path, importtime: bool) -> tuple[float, str]:
    """(wall seconds, stderr) of one run of ``python [-X importtime] ARGV`` with ``PYTHONPATH=src``.

    Raises:
        RuntimeError: the process failed (its stderr's tail in the message)."""
    import time

    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}: {proc.stderr[-800:]}")
    return wall, proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, action="append",
                        help="PYTHONPATH of the package to measure (repeatable; default: this checkout's src/)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per entry point and --src (median)")
    parser.add_argument("--only", action="append", help="entry points whose name contains this (repeatable)")
    args = parser.parse_args()
    sources = [p.resolve() for p in (args.src or [ROOT / "src"])]

    print(f"load average at start: {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} CPU(s)")
    width = max(len(str(s)) for s in sources)
    print(f"{'entry point':<32}{'PYTHONPATH':<{width}}  {'wall s':>7}{'imports s':>11}   heavy packages imported   "
          f"(medians of {args.repeat})")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for name, argv in entry_points(Path(tmp)).items():
            if args.only and not any(o in name for o in args.only):
                continue
            walls = {s: [] for s in sources}
            imports = {s: [] for s in sources}
            heavy = {s: [] for s in sources}
            for _ in range(args.repeat):
                for src in sources:  # alternately
                    walls[src].append(run_once(argv, src, importtime=False)[0])
                    stderr = run_once(argv, src, importtime=True)[1]
                    imports[src].append(import_seconds(stderr))
                    heavy[src] = heavy_imported(stderr)
            for i, src in enumerate(sources):
                print(f"{name if i == 0 else '':<32}{str(src):<{width}}  {statistics.median(walls[src]):>7.2f}"
                      f"{statistics.median(imports[src]):>11.2f}   {','.join(heavy[src]) or '-'}")
    print(f"load average at end: {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
