"""`opprof timeline` writes all its files or none: a failed run removes the timeline files an earlier run left in
--out (they would look current), keeps the user's other files, and removes a folder it created; Ctrl-C ends with one
line and exit 130 (a real SIGINT to a real `opprof` process on a trace big enough to be interrupted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import REAL_DATA

from operator_profiler.cli import main

TRACE = REAL_DATA / "kineto" / "hta_critical_path_alexnet__trace.json.gz"


def test_a_failed_run_leaves_no_tables_of_an_earlier_trace(tmp_path, capsys):
    out = tmp_path / "timeline"
    assert main(["timeline", "--kineto", str(TRACE), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1,
                                                "ts": float("nan"), "dur": 1}]}))
    assert main(["timeline", "--kineto", str(bad), "--out", str(out)]) == 1
    assert "has no valid ts/dur" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    fresh = tmp_path / "fresh"
    assert main(["timeline", "--kineto", str(bad), "--out", str(fresh)]) == 1
    assert not fresh.exists()


def test_ctrl_c_is_one_line_exit_130_and_no_partial_output(tmp_path):
    # The trace is a FIFO that this test fills slowly: the reader is certainly mid-read when SIGINT comes.
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "operator_profiler.cli", "timeline", "--kineto", str(fifo),
                             "--out", str(out)], stderr=subprocess.PIPE, text=True)
    event = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1})
    with open(fifo, "w") as writer:
        writer.write('{"traceEvents": [' + ", ".join([event] * 2000) + ", ")
        writer.flush()
        time.sleep(2.0)  # the reader has the first events and waits for more
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "opprof timeline: interrupted"
    assert "Traceback" not in err
    assert not out.exists()
