"""The machine's load during a measurement (capture.machine.other_cpu_load): the CPUs other processes kept busy,
from /proc/stat less this process's and its parent's CPU time (proc(5): the ``cpu`` line, /proc/PID/stat fields
14 and 15), judged busy above the CPUs spare beside the measurement's threads plus 0.5; recorded in run.json by
every capture (docs/outputs.md, ``machine_load``) and said in the report."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest
from conftest import torch_flags_kept

from operator_profiler.capture import harness, machine
from operator_profiler.report import markdown as report_md

TICK = os.sysconf("SC_CLK_TCK")


def test_a_process_cpu_time_is_read_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    # proc(5): pid (comm) state ppid ... field 14 utime, 15 stime, in clock ticks; comm may hold ") ("
    fields = ["S", "1", "42", "42", "0", "-1", "4194560", "100", "0", "0", "0", "250", "50", "0", "0"]
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_text("4242 (python ) (worker) " + " ".join(fields) + "\n")
    assert machine.process_cpu_seconds(4242, proc=tmp_path) == pytest.approx(300 / TICK)
    assert machine.process_cpu_seconds(4243, proc=tmp_path) is None


@pytest.fixture
def stand_ins(monkeypatch):
    """A clock, /proc/stat, os.times and the parent's CPU time under the test's control."""
    state = SimpleNamespace(wall=10.0, busy=100.0, own=1.0, parent=0.5, usable=2)
    monkeypatch.setattr(time, "perf_counter", lambda: state.wall)
    monkeypatch.setattr(machine, "cpu_busy_seconds", lambda: state.busy)
    monkeypatch.setattr(os, "times", lambda: os.times_result((state.own, 0.0, 0.0, 0.0, 0.0)))
    monkeypatch.setattr(machine, "process_cpu_seconds", lambda pid: state.parent)
    monkeypatch.setattr(machine, "usable_cpus", lambda: state.usable)
    return state


def test_other_processes_load_is_the_machine_busy_time_less_ours_and_our_parents(stand_ins):
    start = machine.load_window_start()
    # 2 s later: all CPUs busy 4 s more, this process 1 s of it, its parent (a profiler) 0.1 s
    stand_ins.wall, stand_ins.busy, stand_ins.own, stand_ins.parent = 12.0, 104.0, 2.0, 0.6
    two_threads = machine.other_cpu_load(start, threads=2)
    assert two_threads["other_cpu_load"] == pytest.approx((4.0 - 1.0 - 0.1) / 2.0)  # 1.45 CPUs
    # 2 usable CPUs, 2 threads: none spare, busy above 0.5
    assert two_threads["threshold"] == 0.5 and two_threads["busy"] is True and two_threads["window_s"] == 2.0
    one_thread = machine.other_cpu_load(start, threads=1)  # 1 spare: busy above 1.5
    assert one_thread["threshold"] == 1.5 and one_thread["busy"] is False


def test_a_window_too_short_or_without_proc_stat_gives_no_load(stand_ins):
    start = machine.load_window_start()
    stand_ins.wall, stand_ins.busy = 10.2, 100.5  # 0.2 s: under the 0.25 s the ticks allow
    short = machine.other_cpu_load(start, threads=2)
    assert short["other_cpu_load"] is None and short["busy"] is None and short["min_window_s"] == 0.25
    assert machine.other_cpu_load(start, threads=2, min_window_s=0.1)["other_cpu_load"] is not None
    stand_ins.busy = None
    stand_ins.wall = 20.0
    assert machine.other_cpu_load(start, threads=2)["other_cpu_load"] is None


GPT2_TINY = {"kind": "gpt2", "vocab_size": 64, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2,
             "batch_size": 1, "seq_len": 8, "compile": False, "mode": "inference"}


def test_a_capture_records_the_load_of_its_measured_iterations_and_the_report_says_when_it_was_busy(
        monkeypatch, tmp_path):
    """A real CPU capture while a stand-in /proc/stat has other processes keep 2.5 CPUs busy (the machine's busy
    time = this process's own CPU time + 2.5 x the wall time; the parent's held still): run.json's machine_load
    reads 2.5 CPUs, more than any thread count leaves spare on 2 usable CPUs (at most 1.5 + 0.5)."""
    def busy_seconds():
        own = os.times()
        return own.user + own.system + 2.5 * time.perf_counter()

    monkeypatch.setattr(machine, "cpu_busy_seconds", busy_seconds)
    monkeypatch.setattr(machine, "process_cpu_seconds", lambda pid: 0.0)
    monkeypatch.setattr(machine, "usable_cpus", lambda: 2)
    with torch_flags_kept():
        run = harness.run_capture(GPT2_TINY, {"seed": 0, "warmup": 1, "warmup_max": 1, "iterations": 3}, "cpu",
                                  tmp_path / "trace.json.gz", tmp_path / "layers.json", tmp_path / "run.json")
    load = json.loads((tmp_path / "run.json").read_text())["machine_load"]
    assert load == run["machine_load"]
    assert load["other_cpu_load"] == pytest.approx(2.5, abs=0.05)
    assert load["usable_cpus"] == 2 and load["threshold"] == max(0, 2 - load["threads"]) + 0.5
    assert load["busy"] is True
    # 3 tiny iterations (and the profiler's stop) usually take less than 0.5 s: the capture then waited, idle, until
    # the window lasted 0.5 s, and measured_s leaves the wait out (on a loaded machine they may take longer: no wait)
    assert load["window_s"] >= harness.LOAD_WINDOW_S and load["waited_s"] >= 0
    if load["waited_s"] > 0:
        assert load["window_s"] == pytest.approx(harness.LOAD_WINDOW_S, abs=0.05)
        assert run["measured_s"] < load["window_s"]
    text = report_md.machine_load_text(run)
    assert text.startswith(f"**the machine was busy during the capture**: other processes kept "
                           f"{load['other_cpu_load']:.2f} CPUs busy on average during the measured iterations (2 "
                           f"usable CPUs, {load['threads']} torch thread(s): busy above {load['threshold']:g})")
    quiet = {**load, "other_cpu_load": 0.1, "busy": False}
    assert report_md.machine_load_text({"machine_load": quiet}).endswith(": quiet")
    assert report_md.machine_load_text({}) is None  # a run.json from before the record
