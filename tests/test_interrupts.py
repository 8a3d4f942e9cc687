"""Ctrl-C (SIGINT) or SIGTERM in a job is one line, a non-zero exit and no partial output.

A real child process runs a job the way the workflow's jobs do (operator_profiler.interrupts.watch_job first,
then rule_runner.run_rule) and gets a real signal. The workflow-level case (Snakemake and a real capture / script
job) is in tests/test_workflow.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# argv: case, output folder, log path. Writes one output, prints "ready", then waits to be interrupted.
JOB = textwrap.dedent('''\
    import sys, time
    from pathlib import Path
    from operator_profiler.interrupts import watch_job
    case, out, log = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    outputs = [out / "first.parquet", out / "classes"]
    watch_job("aggregate", {"workload": "lstm"}, [str(p) for p in outputs], log)
    if case == "imports":  # the signal comes while the job is still importing, before run_rule
        outputs[0].write_text("partial")
        print("ready", flush=True)
        time.sleep(30)
    from operator_profiler.rule_runner import run_rule

    def work():
        outputs[0].write_text("partial")
        outputs[1].mkdir()
        (outputs[1] / "a.json").write_text("{}")
        print("ready", flush=True)
        if case == "swallowed":  # a library's bare except: the KeyboardInterrupt never reaches run_rule
            try:
                time.sleep(30)
            except BaseException:
                pass
            return
        time.sleep(30)

    run_rule(log, work)
    print("not reached", flush=True)
''')


@pytest.mark.parametrize("case, sig, status", [
    ("run_rule", signal.SIGINT, 130),
    ("run_rule", signal.SIGTERM, 143),
    ("swallowed", signal.SIGINT, 130),
    ("imports", signal.SIGINT, 130),
])
def test_an_interrupted_job_prints_one_line_and_leaves_no_output(tmp_path, case, sig, status):
    out, log = tmp_path / "out", tmp_path / "job.log"
    out.mkdir()
    child = subprocess.Popen([sys.executable, "-c", JOB, case, str(out), str(log)],
                             env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(sig)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    line = "interrupted: aggregate lstm; re-run snakemake to redo it"
    assert child.returncode == status, stderr
    assert stderr.strip() == line and "not reached" not in stdout
    assert list(out.iterdir()) == []  # the job's outputs, a directory output too, are removed
    assert log.read_text().strip().splitlines()[-1] == line


def test_the_interrupted_line_is_one_write(monkeypatch):
    """The line goes to the terminal in one write: stderr writes through, so print()'s two writes (text, then
    newline) let Snakemake's "Terminating processes..." land on our line (seen in a workflow test)."""
    from operator_profiler import interrupts

    writes = []

    class Terminal:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "__stderr__", Terminal())
    assert interrupts.interrupted(2) == 130
    assert writes == ["interrupted: job; re-run snakemake to redo it\n"]
