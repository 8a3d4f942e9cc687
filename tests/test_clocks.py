"""GPU clock selection and locking (:mod:`operator_profiler.capture.clocks`) against a FAKE ``nvidia-smi``.

There is no GPU on the test machine. Every test here puts a **test double** first on ``PATH`` (the ``smi``
fixture, tests/fake_tools.py): a small Python script named ``nvidia-smi`` that appends its argv (one JSON list
a line) to a log file and answers ``--query-gpu`` / ``--query-supported-clocks`` / ``-L`` from a JSON state file,
which ``-lgc/-lmc`` update and ``-rgc/-rmc`` clear, so later queries see the lock. Its loop mode (``-lms N``)
prints a sample every N ms and counts as a client holding the GPU; like the driver, the fake drops locked clocks
when a call exits while no loop is alive and persistence mode is Disabled. It imitates the documented command
line, CSV shape (``--format=csv,noheader,nounits``), the deprecated cell's text and return codes (3 = not
supported, 4 = no permission); its error texts are approximations. The tests therefore prove the commands we
send, their order, the read-backs and the verdict drawn from them, and that clocks are restored (after a failing
tool, KeyboardInterrupt and SIGTERM), not how a real driver behaves: that needs a GPU machine.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from fake_tools import (
    DEFAULT_APP,
    DEPRECATED,
    H100,
    LEGACY_SAMPLER,
    QUERY,
    RESTORE,
    SAMPLER,
    SUPPORTED,
    clock_target,
    gpu_state,
    lock_calls,
)

from operator_profiler.capture import clocks
from operator_profiler.capture.clocks import (
    BASE_APP,
    BASE_TDP,
    ClockError,
    ClockPermissionError,
    choose_target,
    locked_clocks,
    ncu_clock_args,
    query_gpu,
    read_back,
    select_clocks,
)
from operator_profiler.config import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src"
TDP_LOCK = ["-i", "0", "-lgc", "tdp,tdp"]


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
    base = config["policy"] == "base"
    expected = {"policy": config["policy"], "device": "cuda", "gpu": H100, "gpu_index": "0", "gpu_uuid": "GPU-1234",
                "sm_mhz": sm, "mem_mhz": mem, "mig": False, "persistence_mode": "Disabled", "sudo": False,
                "sm_lock": None if sm is None else "mhz", "base_definition": BASE_APP if base else None,
                "reason": got["reason"]}
    if base:
        expected["default_app_clocks"] = {"sm_mhz": 1755, "mem_mhz": 2619, "answer": "1755, 2619"}
    assert got == expected
    assert got["reason"].startswith(f"policy {config['policy']}")
    assert smi.calls() == [QUERY, SUPPORTED, *([DEFAULT_APP] if base else [])]


def test_select_clocks_cpu_unchanged(smi, tmp_path):
    select_clocks({"policy": "max"}, "cpu", tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == {
        "policy": "none", "device": "cpu", "reason": "CPU run: no GPU clocks to lock", "sm_mhz": None,
        "mem_mhz": None, "gpu": None, "mig": None}
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
    assert (t["sm_mhz"], t["mem_mhz"], t["sm_lock"], t["base_definition"]) == (1755, 2619, "mhz", BASE_APP)
    assert "memory at clocks.max.memory" in t["reason"]
    assert t["default_app_clocks"] == {"sm_mhz": 1755, "mem_mhz": None, "answer": "1755, [N/A]"}


@pytest.mark.parametrize("how", ["deprecated", "n/a", "removed"])
def test_base_without_default_application_clocks_is_the_tdp_lock(smi, how):
    """A real H200 driver answers the deprecated cell; [N/A] means the same; once the fields are removed the
    query fails as a whole. The GPU's other query does not depend on them, and base becomes the TDP lock: locked
    once with -lgc tdp,tdp (the fake's tdp_sm is 1590 MHz), read back, restored."""
    smi.gpu(**{"deprecated": {"app_sm": "deprecated", "app_mem": "deprecated"},
               "n/a": {"app_sm": None, "app_mem": None},
               "removed": {"invalid_fields": ["clocks.default_applications.graphics"]}}[how])
    t = choose_target({"policy": "base"}, "cuda")
    assert (t["sm_mhz"], t["mem_mhz"], t["sm_lock"], t["base_definition"]) == (1590, 2619, "tdp", BASE_TDP)
    assert t["default_app_clocks"]["sm_mhz"] is None and t["default_app_clocks"]["mem_mhz"] is None
    answer = t["default_app_clocks"]["answer"]
    assert answer == {"deprecated": f"{DEPRECATED}, {DEPRECATED}", "n/a": "[N/A], [N/A]",
                      "removed": 'exit status 2: Field "clocks.default_applications.graphics" is not a valid field to '
                                 "query."}[how]
    assert t["tdp_probe"]["sm_mhz"] == 1590 and t["tdp_probe"]["command"] == "nvidia-smi -i 0 -lgc tdp,tdp"
    assert "nvidia-smi -lgc tdp,tdp" in t["reason"] and "read back at 1590 MHz" in t["reason"]
    assert smi.calls() == [QUERY, SUPPORTED, DEFAULT_APP, SAMPLER, TDP_LOCK, ["-i", "0", "-rgc"]]
    assert smi.read()["gpus"]["0"]["locked_sm"] is None and smi.clients() == []  # restored, loop stopped


def test_removed_default_application_fields_do_not_break_other_policies(smi):
    smi.gpu(invalid_fields=list(clocks.DEFAULT_APP_FIELDS))
    assert choose_target({"policy": "max"}, "cuda")["sm_mhz"] == 1980
    g = query_gpu(0)
    assert g["default_app_sm_mhz"] is None and "is not a valid field to query" in g["default_app_answer"]


def test_tdp_probe_without_permission_is_one_line_and_locks_nothing(smi):
    smi.gpu(app_sm="deprecated", app_mem="deprecated")
    smi.fail("-lgc", "permission")
    with pytest.raises(ClockPermissionError) as e:
        choose_target({"policy": "base"}, "cuda")
    msg = str(e.value)
    assert msg.startswith("`nvidia-smi -i 0 -lgc tdp,tdp` was refused") and "run the GPU jobs as root" in msg
    assert "\n" not in msg and smi.clients() == []
    assert smi.calls()[-1] == TDP_LOCK  # refused: nothing to reset


def test_missing_nvidia_smi_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClockError) as e:
        choose_target({"policy": "base"}, "cuda")
    assert str(e.value).startswith("nvidia-smi not found on PATH") and "policy: none" in str(e.value)
    # policy none does not need it
    t = choose_target({"policy": "none"}, "cuda")
    assert t["gpu"] is None and t["sm_mhz"] is None and "not found" in t["reason"] and t["mig"] is None


def test_gpu_id_follows_cuda_visible_devices(smi, monkeypatch):
    assert clocks.gpu_id("cuda") == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert clocks.gpu_id("cuda") == "3" and clocks.gpu_id("cuda:1") == "5"
    with pytest.raises(ClockError, match="not among CUDA_VISIBLE_DEVICES"):
        clocks.gpu_id("cuda:2")


GPU_A = "GPU-3b84c06a-611d-8e07-2726-44a868f646fe"
GPU_B = "GPU-8b06f67c-36d9-cc08-2bf0-91112a3cc446"
MIG_B = "MIG-b3061c09-2a4c-5026-a575-79f86a5bb12c"


def _two_gpus(smi):
    smi.write({"gpus": {"0": gpu_state(uuid=GPU_A), "1": gpu_state(uuid=GPU_B, mig="Enabled", mig_devices=[MIG_B])}})


def test_gpu_id_of_a_mig_entry_in_cuda_visible_devices_is_its_gpu(smi, monkeypatch):
    _two_gpus(smi)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_B)
    assert clocks.gpu_id("cuda") == "1"
    assert smi.calls() == [["-L"]]


def _torch_seeing(monkeypatch, *uuids):
    """A STAND-IN for torch (no CUDA on the test machine): torch.cuda sees the devices with these UUIDs, printed as
    torch prints a CUuuid (lowercase hex, no GPU- prefix)."""
    props = [types.SimpleNamespace(uuid=u.split("-", 1)[1]) for u in uuids]
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: len(props),
                                 get_device_properties=lambda n: props[n])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))


def test_gpu_id_resolves_torchs_uuid_not_its_number(smi, monkeypatch):
    """CUDA's default order (fastest first) may differ from nvidia-smi's (PCI bus): torch's cuda:0 here is
    nvidia-smi's GPU 1; a MIG instance resolves to the GPU it belongs to. CUDA_VISIBLE_DEVICES is not used then."""
    _two_gpus(smi)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    _torch_seeing(monkeypatch, GPU_B, GPU_A)
    assert clocks.gpu_id("cuda") == "1" and clocks.gpu_id("cuda:1") == "0"
    assert smi.calls() == [["-L"], ["-L"]]
    _torch_seeing(monkeypatch, MIG_B)
    assert clocks.gpu_id("cuda:0") == "1"
    with pytest.raises(ClockError, match="cuda:1 is not one of the 1 CUDA devices torch sees"):
        clocks.gpu_id("cuda:1")
    _torch_seeing(monkeypatch, "GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(ClockError, match="nvidia-smi -L` does not list"):
        clocks.gpu_id("cuda")


def test_query_gpu(smi):
    g = query_gpu(0)
    assert g["name"] == H100 and g["sm_mhz"] == 345 and g["max_sm_mhz"] == 1980
    assert g["persistence_mode"] == "Disabled" and g["mig"] is False
    assert g["default_app_sm_mhz"] == 1755 and g["supported"] == {2619: [1980, 1755, 1500, 1200], 1593: [1500, 1200]}
    assert smi.calls() == [QUERY, SUPPORTED, DEFAULT_APP]
    smi.clear()
    smi.gpu(mig="[N/A]", persistence="Enabled")
    g = query_gpu(0, supported=False, default_app=False)
    assert g["mig"] is None and g["persistence_mode"] == "Enabled" and g["default_app_answer"] == "not queried"
    assert smi.calls() == [QUERY]


# --- locked_clocks -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy, sm, mem", [("base", 1755, 2619), ("max", 1980, 2619), ("fixed", 1500, 1593)])
def test_locked_clocks_exact_commands_and_restore(smi, out, policy, sm, mem):
    with locked_clocks(clock_target(policy, sm, mem), out) as applied:
        assert smi.calls() == lock_calls(sm, mem)
        assert smi.read()["gpus"]["0"]["locked_sm"] == sm and len(smi.clients()) == 1  # the loop holds the GPU
        assert applied["lock_set"] is True and applied["locked"] is None  # decided when the job ends
        assert (applied["applied"]["sm_mhz"], applied["applied"]["mem_mhz"]) == (sm, mem)
        assert ncu_clock_args(applied) == ["--clock-control", "none"]
        smi.wait_samples(3)  # the job runs a while
    assert smi.calls() == lock_calls(sm, mem) + RESTORE
    assert smi.clients() == []  # the loop is stopped after the restore
    got = json.loads(out.read_text())
    assert got["locked"] is True and got["lock_lost"] is None and got["restored"] is True and got["warnings"] == []
    assert got["persistence_mode"] == "Disabled" and got["mig"] is False
    assert got["requested"] == {"sm_mhz": sm, "mem_mhz": mem, "sm_lock": "mhz"}
    during = got["readback_during_job"]
    assert during["samples"] >= 2 and during["matching"] == during["samples"] and during["off_while_busy"] == 0
    assert (during["sm_mhz_min"], during["sm_mhz_max"]) == (sm, sm)
    assert (during["mem_mhz_min"], during["mem_mhz_max"]) == (mem, mem)
    assert during["event_reasons"] == {"0x0000000000000000": during["samples"]}
    assert 0 <= during["first_s"] <= during["last_s"] <= during["job_s"]
    assert "-lms 50" in during["how"]
    assert got["applied_after"]["sm_mhz"] == sm
    assert got["outcome"] == "completed" and got["gpu"] == H100 and got["policy"] == policy
    st = smi.read()["gpus"]["0"]
    assert st["locked_sm"] is None and st["locked_mem"] is None


def test_the_fake_drops_a_lock_when_its_last_client_exits_without_persistence(smi):
    """The fake's model of the driver, which the holder tests below rely on."""
    lock = ["nvidia-smi", "-i", "0", "-lgc", "1755,1755"]
    subprocess.run(lock, check=True, capture_output=True)
    assert smi.read()["gpus"]["0"]["locked_sm"] is None  # persistence Disabled, no client: gone at once
    smi.gpu(persistence="Enabled")
    subprocess.run(lock, check=True, capture_output=True)
    assert smi.read()["gpus"]["0"]["locked_sm"] == 1755


def test_without_a_holder_the_lock_is_lost_and_the_verdict_says_so(smi, out):
    """The read-back loop holds the GPU; when it exits during the job (here after 3 samples) with persistence mode
    off, the driver drops the lock: the verdict is locked: false, with the fix, though the samples before matched."""
    smi.gpu(loop_exits_after=6)
    with locked_clocks(clock_target(), out) as applied:
        import time

        t0 = time.monotonic()
        while smi.clients():
            assert time.monotonic() - t0 < 20
            time.sleep(0.01)
        assert smi.read()["gpus"]["0"]["locked_sm"] is None  # evaporated
        assert applied["lock_set"] is True
        time.sleep(0.3)  # the job goes on without the holder
    got = json.loads(out.read_text())
    assert got["locked"] is False
    assert "the nvidia-smi client holding the GPU exited" in got["lock_lost"]
    assert "persistence mode Disabled" in got["lock_lost"] and "`sudo nvidia-smi -pm 1`" in got["lock_lost"]
    assert got["readback_during_job"]["holder_ended_during_job"] is True
    assert got["readback_during_job"]["matching"] >= 1 and got["readback_during_job"]["off_while_busy"] == 0
    assert got["restored"] is True


def test_persistence_on_keeps_a_verdict_from_the_samples_when_the_loop_ends(smi, out):
    smi.gpu(loop_exits_after=6, persistence="Enabled")
    with locked_clocks(clock_target(), out) as applied:
        import time

        while smi.clients():
            time.sleep(0.01)
        time.sleep(0.3)
        assert read_back(applied)["sm_mhz"] == 1755  # one query, no loop
    got = json.loads(out.read_text())
    assert got["locked"] is True and smi.read()["gpus"]["0"]["locked_sm"] is None
    assert any("the read-back loop ended" in w for w in got["warnings"])


def test_no_holder_and_persistence_off_is_refused_with_the_fix(smi, out):
    smi.gpu(loop_refused=True)
    with pytest.raises(ClockError) as e:
        with locked_clocks(clock_target(), out):
            pytest.fail("the block must not run without a client holding the lock")
    msg = str(e.value)
    assert "could not hold a client on GPU 0" in msg and "persistence mode is Disabled" in msg
    assert "fix: `sudo nvidia-smi -pm 1`" in msg and "policy: none" in msg and "\n" not in msg
    assert smi.calls() == [QUERY, SAMPLER]  # nothing locked
    assert json.loads(out.read_text())["locked"] is False


def test_no_loop_with_persistence_on_needs_the_jobs_own_read_back(smi, out):
    smi.gpu(loop_refused=True, persistence="Enabled")
    with locked_clocks(clock_target(), out) as applied:
        pass
    got = json.loads(out.read_text())
    assert got["locked"] is False and "no read-back during the job matched the lock" in got["lock_lost"]
    with locked_clocks(clock_target(), out) as applied:
        assert read_back(applied, "after the test's CUDA work")["sm_mhz"] == 1755
    got = json.loads(out.read_text())
    assert got["locked"] is True
    assert got["readback_during_job"]["job_read_backs"][0]["when"] == "after the test's CUDA work"
    assert any(w.startswith("no read-back loop") for w in got["warnings"])


def test_drivers_before_r535_use_the_throttle_reasons_field(smi, out):
    smi.gpu(invalid_fields=["clocks_event_reasons.active"])
    with locked_clocks(clock_target(), out) as applied:
        read_back(applied)
    assert smi.calls()[:3] == [QUERY, SAMPLER, LEGACY_SAMPLER]
    assert json.loads(out.read_text())["locked"] is True


def test_a_short_job_without_read_backs_is_not_verified_and_read_back_fixes_it(smi, out, monkeypatch):
    monkeypatch.setattr(clocks, "SAMPLE_MS", 1000)  # no loop sample falls in the job
    with locked_clocks(clock_target(), out):
        pass
    got = json.loads(out.read_text())
    assert got["locked"] is False and got["readback_during_job"]["samples"] == 0
    assert got["lock_lost"].startswith("no read-back during the job matched the lock (0 samples in")
    with locked_clocks(clock_target(), out) as applied:
        sample = read_back(applied)
    got = json.loads(out.read_text())
    assert sample["sm_mhz"] == 1755 and got["locked"] is True and got["readback_during_job"]["samples"] == 1


def test_a_lock_reset_during_the_job_is_not_locked(smi, out):
    with locked_clocks(clock_target(), out):
        smi.wait_samples(2)
        smi.gpu(locked_sm=None, locked_mem=None, reasons="0x0000000000000004")  # someone ran -rgc; power cap
        smi.wait_samples(2)
    got = json.loads(out.read_text())
    assert got["locked"] is False and got["restored"] is True
    assert "read-backs during the job were off the lock while the GPU was busy (SM 345-345 MHz" in got["lock_lost"]
    assert "clock event reasons: sw_power_cap" in got["lock_lost"]
    assert got["readback_during_job"]["sm_mhz_min"] == 345 and got["readback_during_job"]["sm_mhz_max"] == 1755


def test_idle_read_backs_off_the_lock_do_not_count_against_it_but_prove_nothing(smi, out):
    smi.gpu(skew_sm=-500, reasons="0x0000000000000001")  # gpu_idle: the clocks drop while nothing runs
    with locked_clocks(clock_target(), out):
        smi.wait_samples(3)
    got = json.loads(out.read_text())
    during = got["readback_during_job"]
    assert during["off_while_busy"] == 0 and during["idle_samples"] == during["samples"] >= 2
    assert during["event_reason_names"] == ["gpu_idle"]
    assert got["locked"] is False and "all with the GPU idle" in got["lock_lost"]


def test_policy_none_runs_no_command(smi, out):
    with locked_clocks(clock_target("none", None, None, mig=True), out) as applied:
        assert ncu_clock_args(applied) == ["--clock-control", "none"]  # MIG: ncu cannot lock clocks
        assert read_back(applied) is None
    assert smi.calls() == []
    got = json.loads(out.read_text())
    assert got["locked"] is False and got["reason"] == "clocks not locked (policy none)" and got["mig"] is True
    assert got["lock_set"] is False and got["readback_during_job"] is None


@pytest.mark.parametrize("exc", [RuntimeError("tool crashed"), KeyboardInterrupt()])
def test_restored_after_failing_tool(smi, out, exc):
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(type(exc)):
        with locked_clocks(clock_target(), out):
            raise exc
    assert smi.calls()[-2:] == RESTORE and smi.clients() == []
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
        smi.wait_samples(2)  # the child's loop samples every 500 ms (its clocks.SAMPLE_MS)
        child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 143, stderr
    assert "not reached" not in stdout and "Traceback" not in stderr
    sampler = [*SAMPLER[:-1], "500"]
    assert smi.calls() == [QUERY, sampler, *lock_calls(1755, 2619)[2:], *RESTORE]
    got = json.loads(out.read_text())
    assert got["restored"] is True and got["outcome"] == "interrupted: SIGTERM"
    assert got["lock_set"] is True and got["locked"] is True
    st = smi.read()["gpus"]["0"]
    assert st["locked_sm"] is None and st["locked_mem"] is None and smi.clients() == []


def test_no_read_back_loop_outlives_a_job_killed_with_sigkill(smi, out):
    """SIGKILL runs no restore; the loop gets SIGTERM from the kernel (PR_SET_PDEATHSIG) instead of holding the GPU
    forever, and with persistence mode off the driver then drops the lock by itself (as the fake models it)."""
    import time

    env = {**os.environ, **smi.env(), "PYTHONPATH": str(SRC)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(clock_target()), str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        assert len(smi.clients()) == 1
        child.kill()
        child.wait(timeout=60)
        t0 = time.monotonic()
        while smi.clients():
            assert time.monotonic() - t0 < 10, "the read-back loop outlived its job"
            time.sleep(0.05)
    finally:
        child.kill()
    assert smi.read()["gpus"]["0"]["locked_sm"] is None


def test_without_a_pseudo_terminal_the_loop_writes_to_a_pipe(smi, out, monkeypatch):
    def no_pty():
        raise OSError("out of pseudo-terminals")

    monkeypatch.setattr(clocks.pty, "openpty", no_pty)
    with locked_clocks(clock_target(), out) as applied:
        read_back(applied)
    assert json.loads(out.read_text())["locked"] is True


def test_permission_denied_gives_the_fixes_and_locks_nothing(smi, out):
    smi.fail("-lgc", "permission")
    with pytest.raises(ClockPermissionError) as e:
        with locked_clocks(clock_target(), out):
            pytest.fail("the block must not run without the lock")
    msg = str(e.value)
    assert "nvidia-smi -i 0 -lgc 1755,1755" in msg and "Insufficient Permissions" in msg
    assert "run the GPU jobs as root" in msg and "-acp" not in msg  # -acp only governs -ac/-rac
    assert "clocks: {sudo: true}" in msg and "clocks: {policy: none}" in msg and "\n" not in msg
    assert smi.calls() == [QUERY, SAMPLER, ["-i", "0", "-lgc", "1755,1755"]]  # nothing locked, nothing to reset
    assert smi.clients() == []
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


def test_sudo_runs_exactly_the_lock_and_reset_commands_through_sudo(smi, out):
    """clocks.sudo: the lock and reset commands run as `sudo -n nvidia-smi ...` (the fake sudo logs its argv and
    runs the rest); queries and the read-back loop run as the user."""
    smi_path = str(smi.bin / "nvidia-smi")
    with locked_clocks(clock_target(sudo=True), out) as applied:
        read_back(applied)
    lgc, lmc = ["-i", "0", "-lgc", "1755,1755"], ["-i", "0", "-lmc", "2619,2619"]
    assert smi.calls() == [QUERY, SAMPLER, ["sudo", "-n", smi_path, *lgc], lgc, ["sudo", "-n", smi_path, *lmc], lmc,
                           ["sudo", "-n", smi_path, *RESTORE[0]], RESTORE[0], ["sudo", "-n", smi_path, *RESTORE[1]],
                           RESTORE[1]]
    assert json.loads(out.read_text())["locked"] is True


def test_sudo_without_a_rule_names_the_sudoers_fix(smi, out):
    st = smi.read()
    st["sudo"] = "password"
    smi.write(st)
    with pytest.raises(ClockPermissionError) as e:
        with locked_clocks(clock_target(sudo=True), out):
            pass
    msg = str(e.value)
    assert msg.startswith("`sudo -n nvidia-smi -i 0 -lgc 1755,1755` was refused by sudo (sudo: a password is required)")
    assert "sudoers rule" in msg and "policy: none" in msg and "\n" not in msg


def test_tdp_lock_locks_with_tdp_and_checks_against_the_probed_clock(smi, out):
    target = clock_target("base", 1590, 2619, sm_lock="tdp", base_definition=BASE_TDP)
    with locked_clocks(target, out) as applied:
        read_back(applied)
    assert smi.calls() == [QUERY, SAMPLER, TDP_LOCK, ["-i", "0", "-lmc", "2619,2619"], *RESTORE]
    got = json.loads(out.read_text())
    assert got["locked"] is True and got["requested"] == {"sm_mhz": 1590, "mem_mhz": 2619, "sm_lock": "tdp"}
    assert got["base_definition"] == BASE_TDP
    smi.gpu(tdp_sm=1410)  # another driver or GPU gives another TDP clock: not the run's lock
    with locked_clocks(target, out) as applied:
        read_back(applied)
    got = json.loads(out.read_text())
    assert got["locked"] is False and "(SM 1410-1410 MHz" in got["lock_lost"]


def test_mig_gpu_is_recorded_and_a_refused_lock_names_policy_none(smi, out, tmp_path):
    smi.gpu(mig="Enabled")
    t = choose_target({"policy": "max"}, "cuda")
    assert t["mig"] is True and "MIG mode" in t["reason"]
    with locked_clocks(t, out) as applied:
        read_back(applied)
    assert json.loads(out.read_text())["locked"] is True and json.loads(out.read_text())["mig"] is True
    smi.fail("-lgc", "unsupported")
    with pytest.raises(ClockPermissionError) as e:
        with locked_clocks(t, out):
            pass
    msg = str(e.value)
    assert "failed on a GPU in MIG mode" in msg and "fix: set `clocks: {policy: none}`" in msg and "\n" not in msg


def test_memory_lock_unsupported_keeps_the_sm_lock_with_a_warning(smi, out):
    """QA: GPUs whose memory runs at one clock may refuse -lmc ("not supported", exit 3): the SM clock
    lock is kept, the job runs, and only -rgc is reset afterwards."""
    smi.fail("-lmc", "unsupported")
    with locked_clocks(clock_target(), out) as applied:
        assert applied["lock_set"] is True
        assert any(w.startswith("memory clock not locked") for w in applied["warnings"])
        read_back(applied)
    calls = smi.calls()
    assert calls[:4] == [QUERY, SAMPLER, ["-i", "0", "-lgc", "1755,1755"], ["-i", "0", "-lmc", "2619,2619"]]
    assert calls[-1] == ["-i", "0", "-rgc"] and ["-i", "0", "-rmc"] not in calls
    got = json.loads(out.read_text())
    assert got["restored"] is True and got["locked"] is True
    assert got["readback_during_job"]["checked_against"]["mem_mhz"] is None  # the SM clock only
    assert smi.read()["gpus"]["0"]["locked_sm"] is None


def test_memory_lock_without_permission_restores_the_gpu_clock(smi, out):
    smi.fail("-lmc", "permission")
    with pytest.raises(ClockPermissionError, match="no permission"):
        with locked_clocks(clock_target(), out):
            pass
    assert smi.calls() == [QUERY, SAMPLER, ["-i", "0", "-lgc", "1755,1755"], ["-i", "0", "-lmc", "2619,2619"],
                           ["-i", "0", "-rgc"]]
    assert json.loads(out.read_text())["restored"] is True


def test_gpu_jobs_on_one_gpu_run_one_at_a_time(smi, out, tmp_path):
    """QA: two jobs on one GPU interleaved their lock and restore. A second job now waits for the
    first (a child process holds the GPU lock; this process gets it only after the child releases)."""
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
    with locked_clocks(clock_target(), out) as applied:
        read_back(applied)
    got = json.loads(out.read_text())
    assert got["restored"] is False
    assert any("nvidia-smi -i 0 -rgc" in w and "may still be locked" in w for w in got["warnings"])
    assert smi.calls()[-1] == ["-i", "0", "-rmc"]  # the memory clock is still reset


def test_readback_mismatch_is_not_locked(smi, out):
    smi.gpu(skew_sm=-200)
    with locked_clocks(clock_target(), out) as applied:
        assert applied["lock_set"] is True and applied["applied"]["sm_mhz"] == 1555
        read_back(applied)
    got = json.loads(out.read_text())
    assert got["warnings"] == ["read back after locking, before the job: SM 1555 MHz (locked SM 1755 MHz, memory "
                               "2619 MHz, tolerance 15 MHz)"]
    assert got["locked"] is False and "(SM 1555-1555 MHz, memory 2619-2619 MHz; locked SM 1755 MHz" in got["lock_lost"]


def test_other_gpu_model_is_refused(smi, out):
    smi.gpu(name="NVIDIA A100-SXM4-80GB")
    with pytest.raises(ClockError, match="chosen for NVIDIA H100 80GB HBM3, but this job runs on NVIDIA A100"):
        with locked_clocks(clock_target(), out):
            pass
    assert smi.calls() == [QUERY]


def test_ncu_clock_args():
    assert ncu_clock_args({"locked": True}) == ["--clock-control", "none"]
    assert ncu_clock_args({"lock_set": True, "locked": None}) == ["--clock-control", "none"]  # during the job
    assert ncu_clock_args({"locked": False, "mig": True}) == ["--clock-control", "none"]
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
    when = got["readback_during_job"]["job_read_backs"][0]["when"]
    assert when == "after the torch capture, its CUDA context still open"
    assert got["workload"] == "w" and got["measured_s"] == 1.5
    assert smi.calls()[-2:] == RESTORE


def test_report_line_says_what_was_locked_or_that_nothing_was():
    """The report's clocks line comes from the capture's clocks_applied.json (written by locked_clocks)."""
    from operator_profiler.report.markdown import _clocks_text

    during = {"samples": 12, "sm_mhz_min": 1755, "sm_mhz_max": 1755, "mem_mhz_min": 2619, "mem_mhz_max": 2619,
              "job_s": 6.0}
    locked = {"locked": True, "gpu": "NVIDIA H100 80GB HBM3", "requested": {"sm_mhz": 1755, "mem_mhz": 2619},
              "readback_during_job": during, "restored": True, "warnings": []}
    assert _clocks_text(locked) == ("locked at SM 1755 MHz, memory 2619 MHz on NVIDIA H100 80GB HBM3 (read back during "
                                    "the job: SM 1755 MHz, memory 2619 MHz, 12 samples over 6.0 s)")
    tdp = dict(locked, requested={"sm_mhz": 1590, "mem_mhz": 2619, "sm_lock": "tdp"},
               readback_during_job=dict(during, sm_mhz_min=1590, sm_mhz_max=1605))
    assert _clocks_text(tdp).startswith("locked to the base TDP clock (`nvidia-smi -lgc tdp,tdp`) at SM 1590 MHz, "
                                        "memory 2619 MHz on NVIDIA H100 80GB HBM3 (read back during the job: SM "
                                        "1590-1605 MHz")
    drifted = dict(locked, restored=False, warnings=["SM clock read back 1410 MHz after the run"])
    assert _clocks_text(drifted).endswith("; **not restored afterwards**; warning: SM clock read back 1410 MHz "
                                          "after the run")
    lost = {"locked": False, "lock_set": True, "lock_lost": "the nvidia-smi client holding the GPU exited"}
    assert _clocks_text(lost) == ("**not locked**: the lock was set but did not hold: the nvidia-smi client holding "
                                  "the GPU exited: durations may drift with boost clocks")
    assert _clocks_text({"locked": False, "reason": "clocks not locked (policy none)"}) == (
        "**not locked** (clocks not locked (policy none)): durations may drift with boost clocks")
    old = {"locked": True, "gpu": "G", "applied": {"sm_mhz": 1755, "mem_mhz": 2619}, "restored": True, "warnings": []}
    assert _clocks_text(old) == ("locked at SM 1755 MHz, memory 2619 MHz on G (read back before the job only: "
                                 "not verified while it ran)")
    assert _clocks_text(None) == "unknown (no capture/clocks_applied.json)"
