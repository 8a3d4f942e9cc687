"""Where a workflow run's wall time goes, per rule: start-up, imports, work.

    python benchmarks/bench_workflow_jobs.py                    # read the finished run in the current folder
    python benchmarks/bench_workflow_jobs.py --run --cores 2    # run `snakemake --cores 2` first (timed), then read
    python benchmarks/bench_workflow_jobs.py --dir /path/to/checkout --time-imports

Per job it reads Snakemake's benchmark file (``results/<workload>/benchmarks/<rule>.tsv``, column ``s``: the
job's wall seconds as Snakemake measured it) and the last ``job phases:`` line of the job's log
(``logs/<rule>/<workload>.log``), which ``operator_profiler.rule_runner`` writes at the end of every job
(``operator_profiler.job_phases``): start-up (the process's age when the script's first line ran: the
interpreter and Snakemake's script preamble), imports (from there to the rule's work: the package modules the
script imports), work (the rest, lazy imports inside the work included; the line names the packages first
imported there, e.g. torch). "outside" is the benchmark's wall time less the three: Snakemake's own cost
around the process. "share" is the rule's total start-up share: (start-up + imports + outside) / wall, what
the rule's jobs spent on anything but their work, summed over its jobs (the total row: over all rules). A job
whose log has no such line (a failed job, or a run before the line existed) counts
in "jobs" and "wall" only. ``--time-imports`` also times, each in a fresh interpreter, the import of every
package some job imported during its work, so a lazy import's share of "work" can be read off.

    python benchmarks/bench_workflow_jobs.py --compare REV [--rounds 2] [--cores 2]

runs instead the whole default workflow (``snakemake --cores N``, from no results) alternately in two fresh clones of
the checkout's repository, its HEAD and ``REV`` (e.g. the commit before a speed change), each with its own ``src``
on ``PYTHONPATH``, ``--rounds`` times each, and prints each run's wall seconds with the load average at its start
and end, and per round the ratio HEAD / REV (the other processes' load moves a run by tens of seconds, so only the
alternated pairs compare). The clones stay under the system's temp folder only while it runs.

    python benchmarks/bench_workflow_jobs.py --script-imports [--src DIR ...] [--repeat 5]

times instead, for every ``scripts/*.py``, its module-level imports (the job's import phase) in a fresh
interpreter with ``PYTHONPATH=DIR`` (the package to measure; several ``--src`` are measured alternately, e.g. a
checkout of the previous commit's ``src`` beside this one), and prints the least wall and CPU seconds of
``--repeat`` runs (CPU time is less sensitive to other processes on the cores), with the heavy packages the
imports pulled in.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

PHASES = re.compile(r"^job phases: start-up (?P<startup>[\d.]+|\?) s, imports (?P<imports>[\d.]+) s, "
                    r"work (?P<work>[\d.]+) s(?:; imported during the work: (?P<late>.*))?$")


def read_wall_s(tsv: Path) -> float | None:
    """The ``s`` column of a Snakemake benchmark file (first data row), or None when unreadable."""
    try:
        header, row = tsv.read_text().splitlines()[:2]
        return float(dict(zip(header.split("\t"), row.split("\t")))["s"])
    except (OSError, ValueError, KeyError):
        return None


def log_of(tsv: Path, root: Path) -> tuple[str, Path]:
    """(rule, log path) for a benchmark file: ``results/W/benchmarks/R.tsv`` -> ``logs/R/W.log``,
    ``results/W/benchmarks/R/C.tsv`` -> ``logs/R/W/C.log``, ``results/ceilings/benchmarks/R.D.tsv`` ->
    ``logs/R/D.log`` (the workflow's log and benchmark directives)."""
    workload = tsv.relative_to(root / "results").parts[0]
    parts = tsv.relative_to(root / "results" / workload / "benchmarks").with_suffix("").parts
    rule = parts[0].split(".")[0]
    if workload == "ceilings" and "." in parts[0]:
        return rule, root / "logs" / rule / (parts[0].split(".", 1)[1] + ".log")
    return rule, root / "logs" / rule / Path(workload, *parts[1:]).with_suffix(".log")


def phases(log: Path) -> dict | None:
    """The last ``job phases:`` line of a job's log, parsed; None when there is none."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        m = PHASES.match(line.strip())
        if m:
            late = [p.strip() for p in (m["late"] or "").split(",") if p.strip()]
            return {"startup": None if m["startup"] == "?" else float(m["startup"]), "imports": float(m["imports"]),
                    "work": float(m["work"]), "late": late}
    return None


def import_seconds(package: str) -> float | None:
    """Seconds ``import package`` takes in a fresh interpreter (this one's), or None when it fails."""
    code = f"import time; t = time.perf_counter(); import {package}; print(time.perf_counter() - t)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        return float(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


HEAVY = ("torch", "sympy", "plotly", "jsonschema", "yaml", "scipy", "matplotlib", "jinja2", "pandas", "pyarrow")
PROBE = """
import resource, sys, time
t = time.perf_counter()
{imports}
wall = time.perf_counter() - t
usage = resource.getrusage(resource.RUSAGE_SELF)
print(wall, usage.ru_utime + usage.ru_stime, ",".join(m for m in {heavy!r} if m in sys.modules))
"""


def script_imports(script: Path) -> str:
    """The module-level import statements of a rule script (the job's import phase), as source."""
    import ast

    tree = ast.parse(script.read_text())
    return "\n".join(ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))


def time_script_imports(root: Path, sources: list[Path], repeat: int) -> None:
    scripts = sorted((root / "scripts").glob("*.py"))
    print(f"{'script':<28}" + "".join(f"{str(src)[-28:]:>30}" for src in sources) + "   (least of "
          f"{repeat}: wall s / CPU s, including the interpreter's start)")
    for script in scripts:
        code = PROBE.format(imports=script_imports(script), heavy=HEAVY)
        best = {src: (float("inf"), float("inf"), "") for src in sources}
        for _ in range(repeat):
            for src in sources:  # alternately, so that a change of load hits both alike
                env = {**os.environ, "PYTHONPATH": str(src)}
                proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                      check=False, cwd=root)
                try:
                    wall, cpu, heavy = (proc.stdout.split() + [""])[:3]
                except ValueError:
                    continue
                if proc.returncode == 0:
                    w, c = min(best[src][0], float(wall)), min(best[src][1], float(cpu))
                    best[src] = (w, c, heavy)
        cells = "".join(f"{best[s][0]:>13.2f} / {best[s][1]:5.2f} s{'':>7}" for s in sources)
        print(f"{script.name:<28}{cells}   " + " | ".join(best[s][2] for s in sources))


def run_default(clone: Path, cores: int) -> dict:
    """``snakemake --cores N`` in ``clone`` from no results, its own ``src`` first on PYTHONPATH: wall seconds, exit
    status and the 1-minute load average at start and end."""
    import shutil

    for leftover in ("results", "logs", ".snakemake"):
        shutil.rmtree(clone / leftover, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(clone / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores)], cwd=clone, env=env,
                          capture_output=True, text=True)
    return {"wall_s": time.perf_counter() - t0, "returncode": proc.returncode, "load": (load0, os.getloadavg()[0]),
            "stderr": proc.stderr[-2000:]}


def pair_lines(runs: dict[str, list[dict]], names: tuple[str, str]) -> list[str]:
    """One line per round: each side's wall seconds and load (start -> end), and the ratio second / first."""
    first, second = names
    lines = []
    for k, (a, b) in enumerate(zip(runs[first], runs[second]), 1):
        ratio = b["wall_s"] / a["wall_s"] if a["wall_s"] > 0 else float("nan")
        lines.append(f"round {k}: {first} {a['wall_s']:.1f} s (load {a['load'][0]:.1f} -> {a['load'][1]:.1f}), "
                     f"{second} {b['wall_s']:.1f} s (load {b['load'][0]:.1f} -> {b['load'][1]:.1f}): "
                     f"{second} / {first} = {ratio:.2f} ({100 * (ratio - 1):+.0f} %)")
    return lines


def compare(root: Path, rev: str, rounds: int, cores: int) -> None:
    """The default run of ``rev`` and of HEAD, alternated (module docstring, ``--compare``)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_workflow_jobs-") as tmp:
        clones = {}
        for name, commit in ((rev, rev), ("HEAD", "HEAD")):
            clone = Path(tmp) / ("rev" if name == rev else "head")
            subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
            subprocess.run(["git", "-C", str(clone), "checkout", "-q",
                            subprocess.run(["git", "-C", str(root), "rev-parse", commit], check=True,
                                           capture_output=True, text=True).stdout.strip()], check=True)
            clones[name] = clone
        runs = {rev: [], "HEAD": []}
        for k in range(rounds):
            for name in (rev, "HEAD"):
                done = run_default(clones[name], cores)
                print(f"round {k + 1} {name}: exit {done['returncode']}, {done['wall_s']:.1f} s", flush=True)
                if done["returncode"] != 0:
                    raise SystemExit(f"snakemake failed in the {name} clone: {done['stderr']}")
                runs[name].append(done)
        print("\n".join(pair_lines(runs, (rev, "HEAD"))))


def share(row) -> str:
    """The start-up share of a rule's (or the total's) timed jobs: (start-up + imports + outside) / wall, in %."""
    if not row.get("timed_wall"):
        return "?"
    return f"{100 * (row['startup'] + row['imports'] + row['outside']) / row['timed_wall']:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="the workflow folder (results/, logs/)")
    parser.add_argument("--run", action="store_true", help="run snakemake there first (timed)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--time-imports", action="store_true",
                        help="time the import of each package imported during some job's work")
    parser.add_argument("--script-imports", action="store_true",
                        help="time each scripts/*.py's module-level imports instead (see above)")
    parser.add_argument("--src", type=Path, action="append", help="with --script-imports: PYTHONPATH to measure")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compare", metavar="REV", help="the default run of REV and of HEAD, alternated (see above)")
    parser.add_argument("--rounds", type=int, default=2, help="with --compare: runs of each side")
    parser.add_argument("snakemake_args", nargs="*", help="extra snakemake arguments with --run (targets, --config)")
    args = parser.parse_args()
    root = args.dir.resolve()

    print(f"load average at start: {os.getloadavg()}")
    if args.compare:
        compare(root, args.compare, args.rounds, args.cores)
        print(f"load average at end: {os.getloadavg()}")
        return
    if args.script_imports:
        time_script_imports(root, [p.resolve() for p in (args.src or [root / "src"])], args.repeat)
        print(f"load average at end: {os.getloadavg()}")
        return
    if args.run:
        cmd = ["snakemake", "--cores", str(args.cores), *args.snakemake_args]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=root, check=False, capture_output=True, text=True)
        total = time.perf_counter() - t0
        print(f"{' '.join(cmd)}: exit {proc.returncode}, {total:.1f} s wall")
        if proc.returncode != 0:
            print(proc.stderr[-3000:])

    rows = collections.defaultdict(lambda: {"jobs": 0, "wall": 0.0, "timed": 0, "startup": 0.0, "imports": 0.0,
                                            "work": 0.0, "late": collections.Counter()})
    for tsv in sorted((root / "results").glob("*/benchmarks/**/*.tsv")):
        wall = read_wall_s(tsv)
        if wall is None:
            continue
        rule, log = log_of(tsv, root)
        row = rows[rule]
        row["jobs"] += 1
        row["wall"] += wall
        found = phases(log)
        if found and found["startup"] is not None:
            row["timed"] += 1
            row["timed_wall"] = row.get("timed_wall", 0.0) + wall
            for key in ("startup", "imports", "work"):
                row[key] += found[key]
            row["outside"] = row.get("outside", 0.0) + wall - found["startup"] - found["imports"] - found["work"]
            row["late"].update(found["late"])
    if not rows:
        raise SystemExit(f"{root}/results: no benchmark files (results/<workload>/benchmarks/*.tsv); run the "
                         "workflow first, or pass --run")

    print(f"{'rule':<24}{'jobs':>5}{'wall s':>9}{'start-up':>10}{'imports':>9}{'work':>8}{'outside':>9}"
          f"{'share':>7}  imported during the work")
    totals = collections.Counter()
    for rule, row in sorted(rows.items(), key=lambda kv: -kv[1]["wall"]):
        totals["jobs"] += row["jobs"]
        totals["wall"] += row["wall"]
        if row["timed"]:
            split = "".join(f"{row[k]:>{w}.1f}" for k, w in (("startup", 10), ("imports", 9), ("work", 8),
                                                            ("outside", 9)))
            for k in ("startup", "imports", "work", "outside"):
                totals[k] += row[k]
            totals["timed_wall"] += row["timed_wall"]
            split += f"{share(row):>7}"
            untimed = row["jobs"] - row["timed"]
            late = ", ".join(f"{p} ({n})" for p, n in row["late"].most_common())
            note = late + (f"  [{untimed} job(s) without a phases line]" if untimed else "")
        else:
            split, note = f"{'?':>10}{'?':>9}{'?':>8}{'?':>9}{'?':>7}", "(no phases line in the logs)"
        print(f"{rule:<24}{row['jobs']:>5}{row['wall']:>9.1f}{split}  {note}")
    print(f"{'total':<24}{totals['jobs']:>5}{totals['wall']:>9.1f}{totals['startup']:>10.1f}{totals['imports']:>9.1f}"
          f"{totals['work']:>8.1f}{totals['outside']:>9.1f}{share(totals) if totals['timed_wall'] else '?':>7}")
    if args.time_imports:
        late = sorted(set().union(*(set(r["late"]) for r in rows.values())))
        for package in late:
            seconds = import_seconds(package)
            print(f"import {package}: {'failed' if seconds is None else f'{seconds:.2f} s'} (fresh interpreter)")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
