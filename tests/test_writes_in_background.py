"""files.writes_in_background: the nsys timeline's tables are written on a second thread while the GPU projection is
computed. The writes overlap the caller's work, all have ended when the block is left (also after the caller failed,
so `opprof timeline`'s cleanup runs after the last write), a write's error is raised, and a failed run of the real
command on a real nsys export leaves no file."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from conftest import real_file

from operator_profiler import files, stages
from operator_profiler.cli import main


def test_a_write_runs_while_the_caller_computes(tmp_path):
    caller_waiting = threading.Event()
    written = tmp_path / "a.txt"

    def write(path: Path) -> None:
        # Runs only if the caller is still inside the block, waiting: the write overlaps the caller's work.
        assert caller_waiting.wait(timeout=30)
        files.write_text_atomic(path, "a")

    with files.writes_in_background() as submit:
        submit(write, written)
        caller_waiting.set()
    assert written.read_text() == "a"


def test_writes_run_in_the_order_submitted_and_a_writes_error_is_raised_after_the_others(tmp_path):
    order = []

    def fails():
        order.append("fails")
        raise OSError(28, "No space left on device", str(tmp_path / "b.parquet"))

    with pytest.raises(OSError, match="No space left"):
        with files.writes_in_background() as submit:
            submit(order.append, "first")
            submit(fails)
            submit(order.append, "third")
    assert order == ["first", "fails", "third"]


def test_after_the_caller_fails_the_running_write_ends_first_and_the_queued_ones_never_start(tmp_path):
    started, release = threading.Event(), threading.Event()
    slow = tmp_path / "slow.txt"
    queued = tmp_path / "queued.txt"

    def slow_write():
        started.set()
        release.wait(timeout=30)
        files.write_text_atomic(slow, "done")

    def caller_fails():
        with files.writes_in_background() as submit:
            submit(slow_write)
            submit(files.write_text_atomic, queued, "never")
            assert started.wait(timeout=30)
            threading.Timer(0.2, release.set).start()  # the write is still running when the caller fails
            raise RuntimeError("the projection failed")

    with pytest.raises(RuntimeError, match="the projection failed"):
        caller_fails()
    assert slow.read_text() == "done"  # ended before the block was left: a cleanup after it would see the file
    assert not queued.exists()


def test_a_failed_nsys_timeline_leaves_no_file_though_its_tables_were_written_meanwhile(tmp_path, monkeypatch,
                                                                                      capsys):
    """The GPU projection fails after the background writes began: `opprof timeline` removes every table they wrote,
    and the folder it created."""
    from operator_profiler.attribution import nvtx

    export = real_file("nsys", "fuser_test_matmul_h100x8_nsys2024.6.sqlite")
    out = tmp_path / "timeline"
    real_projection = nvtx.gpu_projection

    def projection_fails_after_the_tables(kernels, ranges):
        real_projection(kernels, ranges)
        for _ in range(3000):  # (up to 30 s) until the writer has put kernels.parquet in place
            if (out / "kernels.parquet").is_file():
                break
            threading.Event().wait(0.01)
        assert (out / "kernels.parquet").is_file()
        raise MemoryError("the projection ran out of memory")

    monkeypatch.setattr(nvtx, "gpu_projection", projection_fails_after_the_tables)
    with pytest.raises(MemoryError):
        stages.export_timeline(export, out, kind="nsys")
    assert not out.exists()
    monkeypatch.undo()
    assert main(["timeline", "--nsys", str(export), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(stages.TIMELINE_OUTPUTS)
    capsys.readouterr()


def test_ctrl_c_while_waiting_for_a_write_waits_until_it_ends(tmp_path):
    """Two Ctrl-Cs (real SIGINTs) while the block waits for a running write: the wait goes on until the write ends,
    then the interrupt is raised. (On Python 3.11 a thread join that a Ctrl-C interrupts marks the running thread as
    stopped, and a second join returns at once: the wait must not rely on joining the thread.)"""
    started = threading.Event()
    written = tmp_path / "slow.txt"

    def slow_write():
        started.set()
        time.sleep(1.5)
        files.write_text_atomic(written, "done")

    timers = []
    with pytest.raises(KeyboardInterrupt):
        with files.writes_in_background() as submit:
            submit(slow_write)
            assert started.wait(timeout=30)
            timers = [threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)) for delay in (0.2, 0.6)]
            for timer in timers:
                timer.start()
    for timer in timers:
        timer.join()
    assert written.read_text() == "done"  # the write ended before the interrupt left the block


def test_ctrl_c_twice_during_an_nsys_timeline_leaves_no_file_even_later(tmp_path, monkeypatch):
    """The writes of an nsys timeline slowed down (slow storage), two Ctrl-Cs while the command waits for them: no
    timeline file is left, also after the writer would have finished."""
    from operator_profiler.timeline import nsys

    export = real_file("nsys", "fuser_test_matmul_h100x8_nsys2024.6.sqlite")
    out = tmp_path / "timeline"
    real_write = nsys.write_nsys_timeline

    def slow_write(timeline, out_dir):
        for delay in (0.2, 0.6):
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(1.5)
        real_write(timeline, out_dir)

    monkeypatch.setattr(nsys, "write_nsys_timeline", slow_write)
    with pytest.raises(KeyboardInterrupt):
        stages.export_timeline(export, out, kind="nsys")
    assert not out.exists()
    time.sleep(2.0)  # (a writer still running would put its files back by now)
    assert not out.exists()
