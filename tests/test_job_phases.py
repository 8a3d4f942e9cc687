"""Where a workflow job's wall time goes: the ``job phases:`` line every job's log ends with,
and ``benchmarks/bench_workflow_jobs.py``, which sums those lines and Snakemake's benchmark files per rule."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from operator_profiler import job_phases
from operator_profiler.rule_runner import run_rule

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_workflow_jobs", ROOT / "benchmarks" / "bench_workflow_jobs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_phases_line_names_what_the_work_imported(tmp_path):
    # A fresh interpreter: yaml is imported after the work started, so the line must name it (and
    # not json, a standard-library module), with the times the bench tool parses.
    code = ("from operator_profiler import job_phases as j; j.script_started(); import numpy; j.work_started(); "
            "import json, yaml; print(j.phases_line())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    parsed = _bench().PHASES.match(out)
    assert parsed, out
    assert parsed["late"] == "yaml"
    assert float(parsed["imports"]) > 0  # numpy was imported between the two marks
    if Path("/proc/self/stat").exists():
        assert 0 < float(parsed["startup"]) < 60


def test_run_rule_ends_the_log_with_the_phases_line_only_in_a_job(tmp_path):
    log = tmp_path / "job.log"
    run_rule(str(log), lambda: None)  # a rule function run in a test's process: no marks, no line
    assert job_phases.PHASES_PREFIX not in log.read_text()
    job_phases.script_started()
    try:
        run_rule(str(log), lambda: None)
    finally:
        job_phases._marks.clear()
    assert log.read_text().splitlines()[-1].startswith(job_phases.PHASES_PREFIX)


def test_the_bench_tool_sums_benchmarks_and_phases_per_rule(tmp_path):
    def job(rule: str, workload: str, wall: float, phases: str | None, cls: str | None = None):
        tsv = tmp_path / "results" / workload / "benchmarks" / (f"{rule}/{cls}.tsv" if cls else f"{rule}.tsv")
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text(f"s\th:m:s\tmax_rss\n{wall}\t0:00:0{int(wall)}\t100\n")
        log = tmp_path / "logs" / rule / (f"{workload}/{cls}.log" if cls else f"{workload}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("INFO something\n" + (phases + "\n" if phases else ""))

    job("attribute", "gpt2", 2.5, "job phases: start-up 0.50 s, imports 1.00 s, work 0.50 s")
    job("attribute", "lstm", 3.5, "job phases: start-up 0.50 s, imports 1.00 s, work 1.50 s; imported during the work: torch")
    job("parse_ncu", "gpt2", 4.0, "job phases: start-up 0.25 s, imports 0.75 s, work 2.00 s", cls="Block-1")
    job("report", "gpt2", 1.0, None)  # a run before the line existed: counted, not split
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_workflow_jobs.py"), "--dir", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split() and line.split()[0] in
            ("attribute", "parse_ncu", "report", "total")}
    # attribute: 2 jobs, 6.0 s wall = start-up 1.0 + imports 2.0 + work 2.0 + outside 1.0
    assert rows["attribute"][1:7] == ["2", "6.0", "1.0", "2.0", "2.0", "1.0"]
    assert rows["attribute"][7] == "67%"  # start-up share: (1.0 + 2.0 + 1.0) / 6.0
    assert "torch (1)" in " ".join(rows["attribute"][8:])
    assert rows["parse_ncu"][1:7] == ["1", "4.0", "0.2", "0.8", "2.0", "1.0"]  # logs/parse_ncu/gpt2/Block-1.log
    assert rows["report"][1:3] == ["1", "1.0"] and rows["report"][3] == "?"
    assert rows["total"][1:3] == ["4", "11.0"]
    assert rows["total"][-1] == "60%"  # (4.0 + 2.0) / 10.0 s: the timed jobs only


def test_a_finished_job_exits_0_with_its_log_atexit_handlers_and_output_flushed(tmp_path):
    # exit_finished_job skips only the interpreter's teardown: the log is complete, an atexit handler runs,
    # buffered stdout reaches the pipe, the status is 0.
    log = tmp_path / "job.log"
    code = ("import atexit, sys; from operator_profiler import job_phases as j; j.script_started(); "
            "from operator_profiler.rule_runner import exit_finished_job, run_rule; "
            "atexit.register(lambda: print('atexit ran')); "
            f"run_rule({str(log)!r}, lambda: print('work done', end='')); print(' (buffered)', end=''); "
            "exit_finished_job(); print('not reached')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "work done (buffered)atexit ran\n"
    assert log.read_text().splitlines()[-1].startswith(job_phases.PHASES_PREFIX)


def test_a_finished_job_with_an_idle_thread_pool_exits(tmp_path):
    """A thread pool left running with idle workers (Inductor's C++ compile leaves one after a kernel-cache miss)
    does not keep a finished job alive: its workers are told to stop as on a normal exit, and a non-daemon thread
    still doing work is waited for."""
    log = tmp_path / "job.log"
    code = ("import concurrent.futures, threading, time; from operator_profiler import job_phases as j; "
            "j.script_started(); from operator_profiler.rule_runner import exit_finished_job, run_rule; "
            "pool = concurrent.futures.ThreadPoolExecutor(2); [pool.submit(time.sleep, 0.01) for _ in range(4)]; "
            "threading.Thread(target=lambda: (time.sleep(0.3), print('worker finished'))).start(); "
            f"run_rule({str(log)!r}, lambda: print('work done')); exit_finished_job()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["work done", "worker finished"]


def test_compare_prints_each_rounds_walls_loads_and_ratio():
    bench = _bench()
    runs = {"abc123": [{"wall_s": 100.0, "load": (3.0, 4.0)}, {"wall_s": 80.0, "load": (2.0, 2.5)}],
            "HEAD": [{"wall_s": 50.0, "load": (4.0, 3.5)}, {"wall_s": 60.0, "load": (2.5, 2.0)}]}
    lines = bench.pair_lines(runs, ("abc123", "HEAD"))
    assert lines == [
        "round 1: abc123 100.0 s (load 3.0 -> 4.0), HEAD 50.0 s (load 4.0 -> 3.5): HEAD / abc123 = 0.50 (-50 %)",
        "round 2: abc123 80.0 s (load 2.0 -> 2.5), HEAD 60.0 s (load 2.5 -> 2.0): HEAD / abc123 = 0.75 (-25 %)"]


def test_a_compared_run_starts_from_no_results_with_the_clones_own_package(tmp_path):
    """run_default removes what an earlier run left and puts the clone's src first on PYTHONPATH (a real
    snakemake on a one-rule Snakefile that writes what it sees)."""
    clone = tmp_path / "clone"
    (clone / "src").mkdir(parents=True)
    (clone / "results").mkdir()
    (clone / "results" / "old.txt").write_text("from an earlier run")
    (clone / "Snakefile").write_text(
        'rule all:\n    output:\n        "results/seen.txt",\n    shell:\n'
        '        "ls results > {output}.tmp && echo $PYTHONPATH >> {output}.tmp && mv {output}.tmp {output}"\n')
    done = _bench().run_default(clone, 1)
    assert done["returncode"] == 0, done["stderr"]
    listing, pythonpath = (clone / "results" / "seen.txt").read_text().split("\n")[:2]
    assert listing == "seen.txt.tmp"  # the earlier run's old.txt was removed
    assert pythonpath.split(":")[0] == str(clone / "src")
    assert done["wall_s"] > 0 and len(done["load"]) == 2
