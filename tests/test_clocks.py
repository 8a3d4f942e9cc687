"""GPU clock selection and locking (:mod:`operator_profiler.capture.clocks`) against a FAKE ``nvidia-smi``.

There is no GPU on the test machine. Every test here puts a **test double** first on ``PATH`` (the ``smi``
fixture, tests/fake_tools.py): a small Python script named ``nvidia-smi`` that appends its argv (one JSON list
a line) to a log file and answers ``--query-gpu`` / ``--query-supported-clocks`` from a JSON state file, which
``-lgc/-lmc`` update and ``-rgc/-rmc`` clear, so later queries see the lock. It imitates the documented command line
and CSV shape (``--format=csv,noheader,nounits``) and return codes (3 = not supported, 4 = no
permission); its error texts are approximations. The tests therefore prove the commands we send, their
order, and that clocks are restored (after a failing tool, KeyboardInterrupt and SIGTERM), not how a
real driver behaves: that needs a GPU machine.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fake_tools import H100, QUERY, SUPPORTED, clock_target, lock_calls

from operator_profiler.capture import clocks
from operator_profiler.capture.clocks import (
    ClockError,
    ClockPermissionError,
    choose_target,
    locked_clocks,
    ncu_clock_args,
    query_gpu,
    select_clocks,
)
from operator_profiler.config import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src"
@pytest.fixture
def out(tmp_path):
    d = tmp_path / "results dir" / "w l" / "capture"
    return d / "clocks_applied.json"




# --- select_clocks -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config, sm, mem", [
    ({"policy": "base"}, 1755, 2619),
    ({"policy": "max"}, 1980, 2619),
    ({"policy": "fixed", "sm_mhz": 1500, "mem_mhz": 1593}, 1500, 1593),
    ({"policy": "none", "sm_mhz": None, "mem_mhz": None}, None, None),
])
def test_select_clocks_writes_target_from_exact_queries(smi, tmp_path, config, sm, mem):
    target = tmp_path / "out with space" / "clocks" / "target.json"
    select_clocks(config, "cuda", target)
    got = json.loads(target.read_text())
    assert got == {"policy": config["policy"], "device": "cuda", "gpu": H100, "gpu_index": "0",
                   "gpu_uuid": "GPU-1234", "sm_mhz": sm, "mem_mhz": mem, "reason": got["reason"]}
    assert got["reason"].startswith(f"policy {config['policy']}")
    assert smi.calls() == [QUERY, SUPPORTED]


def test_select_clocks_cpu_unchanged(smi, tmp_path):
    select_clocks({"policy": "max"}, "cpu", tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == {
        "policy": "none", "device": "cpu", "reason": "CPU run: no GPU clocks to lock", "sm_mhz": None,
        "mem_mhz": None, "gpu": None}
    assert smi.calls() == []
    from operator_profiler.capture import jobs as capture

    assert capture.select_clocks is select_clocks  # old import path still works


def test_fixed_needs_both_clocks(smi):
    with pytest.raises(ConfigError, match="needs both clocks.sm_mhz and clocks.mem_mhz"):
        choose_target({"policy": "fixed", "sm_mhz": 1500, "mem_mhz": None}, "cuda")


def test_fixed_unsupported_clocks_name_the_supported_values(smi):
    with pytest.raises(ConfigError) as e:
        choose_target({"policy": "fixed", "sm_mhz": 1500, "mem_mhz": 1000}, "cuda")
    assert "clocks.mem_mhz 1000 is not a supported memory clock" in str(e.value)
    assert "supported memory clocks (MHz): 2619, 1593" in str(e.value)
    with pytest.raises(ConfigError) as e:
        choose_target({"policy": "fixed", "sm_mhz": 1755, "mem_mhz": 1593}, "cuda")
    assert "clocks.sm_mhz 1755 is not a supported SM clock" in str(e.value)
    assert "at memory clock 1593 MHz; supported SM clocks (MHz): 1500, 1200" in str(e.value)
    assert "\n" not in str(e.value)


def test_base_without_default_application_memory_clock_falls_back_to_max(smi):
    smi.gpu(app_mem=None)
    t = choose_target({"policy": "base"}, "cuda")
    assert (t["sm_mhz"], t["mem_mhz"]) == (1755, 2619)
    assert "memory at clocks.max.memory" in t["reason"]


def test_base_without_default_application_sm_clock_fails(smi):
    smi.gpu(app_sm=None)
    with pytest.raises(ClockError, match="reports no default application clock.*set clocks.policy max"):
        choose_target({"policy": "base"}, "cuda")


def test_missing_nvidia_smi_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClockError) as e:
        choose_target({"policy": "base"}, "cuda")
    assert str(e.value).startswith("nvidia-smi not found on PATH") and "policy: none" in str(e.value)
    # policy none does not need it
    t = choose_target({"policy": "none"}, "cuda")
    assert t["gpu"] is None and t["sm_mhz"] is None and "not found" in t["reason"]


def test_gpu_id_follows_cuda_visible_devices(smi, monkeypatch):
    assert clocks.gpu_id("cuda") == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert clocks.gpu_id("cuda") == "3" and clocks.gpu_id("cuda:1") == "5"
    with pytest.raises(ClockError, match="not among CUDA_VISIBLE_DEVICES"):
        clocks.gpu_id("cuda:2")


def test_query_gpu(smi):
    g = query_gpu(0)
    assert g["name"] == H100 and g["sm_mhz"] == 345 and g["max_sm_mhz"] == 1980
    assert g["default_app_sm_mhz"] == 1755 and g["supported"] == {2619: [1980, 1755, 1500, 1200], 1593: [1500, 1200]}


# --- locked_clocks -------------------------------------------------------------------------------------------




@pytest.mark.parametrize("policy, sm, mem", [("base", 1755, 2619), ("max", 1980, 2619), ("fixed", 1500, 1593)])
def test_locked_clocks_exact_commands_and_restore(smi, out, policy, sm, mem):
    with locked_clocks(clock_target(policy, sm, mem), out) as applied:
        assert smi.calls() == lock_calls(sm, mem)
        assert smi.read()["gpus"]["0"]["locked_sm"] == sm
        assert applied["locked"] is True and applied["applied"] == {"sm_mhz": sm, "mem_mhz": mem}
        assert ncu_clock_args(applied) == ["--clock-control", "none"]
    assert smi.calls() == lock_calls(sm, mem) + [QUERY, ["-i", "0", "-rgc"], ["-i", "0", "-rmc"]]
    got = json.loads(out.read_text())
    assert got["locked"] is True and got["restored"] is True and got["warnings"] == []
    assert got["requested"] == got["applied"] == got["applied_after"] == {"sm_mhz": sm, "mem_mhz": mem}
    assert got["outcome"] == "completed" and got["gpu"] == H100 and got["policy"] == policy
    st = smi.read()["gpus"]["0"]
    assert st["locked_sm"] is None and st["locked_mem"] is None


def test_policy_none_runs_no_command(smi, out):
    with locked_clocks(clock_target("none", None, None), out) as applied:
        assert ncu_clock_args(applied) == []
    assert smi.calls() == []
    got = json.loads(out.read_text())
    assert got["locked"] is False and got["reason"] == "clocks not locked (policy none)"


@pytest.mark.parametrize("exc", [RuntimeError("tool crashed"), KeyboardInterrupt()])
def test_restored_after_failing_tool(smi, out, exc):
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(type(exc)):
        with locked_clocks(clock_target(), out):
            raise exc
    assert smi.calls()[-2:] == [["-i", "0", "-rgc"], ["-i", "0", "-rmc"]]
    assert signal.getsignal(signal.SIGTERM) is previous
    got = json.loads(out.read_text())
    assert got["restored"] is True
    assert got["outcome"] == ("failed: RuntimeError: tool crashed" if isinstance(exc, RuntimeError)
                              else "interrupted: KeyboardInterrupt")
    assert smi.read()["gpus"]["0"]["locked_sm"] is None


CHILD = textwrap.dedent('''\
    import json, sys, time
    from pathlib import Path
    from operator_profiler.capture.clocks import locked_clocks
    with locked_clocks(json.loads(sys.argv[1]), Path(sys.argv[2])):
        print("locked", flush=True)
        time.sleep(60)
    print("not reached", flush=True)
''')


def test_restored_after_sigterm(smi, out):
    env = {**os.environ, **smi.env(), "PYTHONPATH": str(SRC)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(clock_target()), str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        assert smi.read()["gpus"]["0"]["locked_sm"] == 1755
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 143, stderr
    assert "not reached" not in stdout and "Traceback" not in stderr
    assert smi.calls() == lock_calls(1755, 2619) + [["-i", "0", "-rgc"], ["-i", "0", "-rmc"]]
    got = json.loads(out.read_text())
    assert got["restored"] is True and got["outcome"] == "interrupted: SIGTERM" and got["locked"] is True
    st = smi.read()["gpus"]["0"]
    assert st["locked_sm"] is None and st["locked_mem"] is None


def test_permission_denied_gives_the_fixes_and_locks_nothing(smi, out):
    smi.fail("-lgc", "permission")
    with pytest.raises(ClockPermissionError) as e:
        with locked_clocks(clock_target(), out):
            pytest.fail("the block must not run without the lock")
    msg = str(e.value)
    assert "nvidia-smi -i 0 -lgc 1755,1755" in msg and "Insufficient Permissions" in msg
    assert "run the GPU jobs as root" in msg and "-acp" not in msg  # -acp only governs -ac/-rac
    assert "clocks: {policy: none}" in msg and "\n" not in msg
    assert smi.calls() == [QUERY, ["-i", "0", "-lgc", "1755,1755"]]  # nothing locked, nothing to reset
    got = json.loads(out.read_text())
    assert got["locked"] is False and got["restored"] is None and got["outcome"].startswith("failed: ClockPermission")


def test_permission_denied_exit_path_is_one_failed_line(smi, out, tmp_path, capsys):
    from operator_profiler.rule_runner import run_rule

    smi.fail("-lgc", "permission")
    log = tmp_path / "logs dir" / "capture.log"
    log.parent.mkdir()

    def job():
        with locked_clocks(clock_target(), out):
            pass

    root = logging.getLogger()
    handlers = root.handlers[:]
    try:
        with pytest.raises(SystemExit) as e:
            run_rule(str(log), job)
    finally:  # run_rule points logging at its (now closed) log file
        for h in root.handlers[:]:
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
    assert e.value.code == 1
    text = log.read_text()
    assert "Traceback" not in text
    failed = [line for line in text.splitlines() if line.startswith("FAILED:")]
    assert len(failed) == 1 and "run the GPU jobs as root" in failed[0] and "-acp" not in failed[0]


def test_memory_lock_unsupported_keeps_the_sm_lock_with_a_warning(smi, out):
    """QA: GPUs whose memory runs at one clock may refuse -lmc ("not supported", exit 3): the SM clock
    lock is kept, the job runs, and only -rgc is reset afterwards."""
    smi.fail("-lmc", "unsupported")
    with locked_clocks(clock_target(), out) as applied:
        assert applied["locked"] is True
        assert any(w.startswith("memory clock not locked") for w in applied["warnings"])
    calls = smi.calls()
    assert calls[:3] == [QUERY, ["-i", "0", "-lgc", "1755,1755"], ["-i", "0", "-lmc", "2619,2619"]]
    assert calls[-1] == ["-i", "0", "-rgc"] and ["-i", "0", "-rmc"] not in calls
    assert json.loads(out.read_text())["restored"] is True
    assert smi.read()["gpus"]["0"]["locked_sm"] is None


def test_memory_lock_without_permission_restores_the_gpu_clock(smi, out):
    smi.fail("-lmc", "permission")
    with pytest.raises(ClockPermissionError, match="no permission"):
        with locked_clocks(clock_target(), out):
            pass
    assert smi.calls() == [QUERY, ["-i", "0", "-lgc", "1755,1755"], ["-i", "0", "-lmc", "2619,2619"],
                           ["-i", "0", "-rgc"]]
    assert json.loads(out.read_text())["restored"] is True


def test_gpu_jobs_on_one_gpu_run_one_at_a_time(smi, out, tmp_path):
    """QA: two jobs on one GPU interleaved their lock and restore. A second job now waits for the
    first (a child process holds the GPU lock; this process gets it only after the child releases)."""
    import subprocess
    import sys
    import time

    from operator_profiler.capture.clocks import gpu_job_lock

    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from operator_profiler.capture.clocks import gpu_job_lock\n"
        "with gpu_job_lock('qa-test-gpu'):\n    print('held', flush=True); time.sleep(1.5)\n")],
        stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    with gpu_job_lock("qa-test-gpu"):
        waited = time.monotonic() - t0
    child.wait(timeout=10)
    assert waited > 0.5, waited


def test_failed_restore_is_recorded(smi, out):
    smi.fail("-rgc", "permission")
    with locked_clocks(clock_target(), out):
        pass
    got = json.loads(out.read_text())
    assert got["restored"] is False
    assert any("nvidia-smi -i 0 -rgc" in w and "may still be locked" in w for w in got["warnings"])
    assert smi.calls()[-1] == ["-i", "0", "-rmc"]  # the memory clock is still reset


def test_readback_mismatch_is_a_warning(smi, out):
    smi.gpu(skew_sm=-200)
    with locked_clocks(clock_target(), out) as applied:
        assert applied["locked"] is True and applied["applied"]["sm_mhz"] == 1555
    got = json.loads(out.read_text())
    assert len(got["warnings"]) == 2  # after locking and after the run
    assert "SM clock read back after locking: 1555 MHz, requested 1755 MHz" in got["warnings"][0]


def test_other_gpu_model_is_refused(smi, out):
    smi.gpu(name="NVIDIA A100-SXM4-80GB")
    with pytest.raises(ClockError, match="chosen for NVIDIA H100 80GB HBM3, but this job runs on NVIDIA A100"):
        with locked_clocks(clock_target(), out):
            pass
    assert smi.calls() == [QUERY]


def test_ncu_clock_args():
    assert ncu_clock_args({"locked": True}) == ["--clock-control", "none"]
    assert ncu_clock_args({"locked": False}) == []
    assert ncu_clock_args({}) == []


# --- capture wiring ------------------------------------------------------------------------------------------


def test_capture_timeline_runs_the_harness_inside_the_lock(smi, tmp_path, monkeypatch):
    from operator_profiler.capture import harness
    from operator_profiler.capture import jobs as capture

    out = tmp_path / "cap ture"
    out.mkdir()
    seen = {}

    def fake_run_capture(workload, harness_cfg, device, trace, layers, run, workload_name=None, **kw):
        seen["calls"] = smi.calls()
        seen["locked"] = smi.read()["gpus"]["0"]["locked_sm"]
        Path(trace).write_bytes(b"x")
        return {"measured_s": 1.5}

    monkeypatch.setattr(harness, "run_capture", fake_run_capture)
    target = tmp_path / "tar get.json"
    target.write_text(json.dumps(clock_target("max", 1980, 2619)))
    capture.capture_timeline("w", {}, {}, "cuda", "torch", out / "timeline.kineto.json.gz", out / "run.json",
                             out / "layers.json", out / "clocks_applied.json", target)
    assert seen == {"calls": lock_calls(1980, 2619), "locked": 1980}
    got = json.loads((out / "clocks_applied.json").read_text())
    assert got["locked"] is True and got["restored"] is True
    assert got["workload"] == "w" and got["measured_s"] == 1.5
    assert smi.calls()[-2:] == [["-i", "0", "-rgc"], ["-i", "0", "-rmc"]]


def test_report_line_says_what_was_locked_or_that_nothing_was():
    """The report's clocks line comes from the capture's clocks_applied.json (written by locked_clocks)."""
    from operator_profiler.report.markdown import _clocks_text

    locked = {"locked": True, "gpu": "NVIDIA H100 80GB HBM3", "applied": {"sm_mhz": 1755, "mem_mhz": 2619},
              "restored": True, "warnings": []}
    assert _clocks_text(locked) == "locked at SM 1755 MHz, memory 2619 MHz (read back) on NVIDIA H100 80GB HBM3"
    drifted = dict(locked, restored=False, warnings=["SM clock read back 1410 MHz after the run"])
    assert _clocks_text(drifted).endswith("; **not restored afterwards**; warning: SM clock read back 1410 MHz "
                                          "after the run")
    assert _clocks_text({"locked": False, "reason": "clocks not locked (policy none)"}) == (
        "**not locked** (clocks not locked (policy none)): durations may drift with boost clocks")
    assert _clocks_text(None) == "unknown (no capture/clocks_applied.json)"
