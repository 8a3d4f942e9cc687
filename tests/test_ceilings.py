"""Measured machine ceilings (operator_profiler.capture.ceilings, .machine; rule measure_ceilings; opprof ceilings).

The measurement runs for real on this CPU at tiny sizes; its figures are recomputed here from what the record
says was run (elements or n, calls per run, every run's seconds). The machine description is checked against
/proc/cpuinfo read here, the nominal GPU peaks against NVIDIA's published datasheet figures, and the caching by
real Snakemake runs. No assertion on how fast anything is.
"""

from __future__ import annotations

import copy
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import yaml
from conftest import run_opprof
from workflow_runs import ROOT, job_counts, snakemake

from operator_profiler.capture import ceilings, machine
from operator_profiler.errors import InputError

TINY = {"gemm_n": 64, "stream_mib": 0.25, "runs": 3, "warmup": 1, "min_run_s": 0}
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def tiny_record() -> dict:
    return ceilings.measure("cpu", TINY, threads=1)


def _by_name(record: dict) -> dict:
    return {m["name"]: m for m in record["measurements"]}


# ---------------------------------------------------------------------------------------------- the measurement


def test_bandwidths_are_the_bytes_moved_over_the_best_run(tiny_record):
    elements = int(0.25 * MIB) // 4  # float32 elements per array
    measured = _by_name(tiny_record)
    for kernel, arrays in (("copy", 2), ("triad", 3)):
        m = measured[f"stream_{kernel}"]
        assert m["elements"] == elements and m["array_bytes"] == 4 * elements
        assert len(m["times_s"]) == 3 and m["calls_per_run"] == 1  # min_run_s 0: one call per run
        expected = arrays * 4 * elements * m["calls_per_run"] / min(m["times_s"])
        assert tiny_record["memory_bytes_per_s"][kernel] == pytest.approx(expected, rel=1e-12)
        assert m["bytes_per_s_median"] == pytest.approx(arrays * 4 * elements / statistics.median(m["times_s"]),
                                                        rel=1e-12)
        # 0.25 MiB arrays sit in the 48 MiB-class caches of any current CPU: not beyond 4x the last-level cache
        cache = machine.last_level_cache()
        assert m["exceeds_cache"] is (None if cache is None else False)
    memory = tiny_record["memory_bytes_per_s"]
    assert memory["best"] == max(memory["copy"], memory["triad"])


def test_gemm_flops_are_2n3_over_the_best_run(tiny_record):
    measured = _by_name(tiny_record)
    assert sorted(tiny_record["compute_flops_per_s"]) == ["bfloat16", "float32"]  # CPU: no tf32/float16
    for dtype in ("float32", "bfloat16"):
        m = measured[f"gemm_{dtype}"]
        assert (m["m"], m["n"], m["k"]) == (64, 64, 64)
        assert m["best_s"] == min(m["times_s"]) and m["median_s"] == statistics.median(m["times_s"])
        assert tiny_record["compute_flops_per_s"][dtype] == pytest.approx(2 * 64**3 / min(m["times_s"]), rel=1e-12)
    assert measured["gemm_bfloat16"]["tensor_dtype"] == "torch.bfloat16"
    assert measured["gemm_float32"]["float32_matmul_precision"] == "highest"


def test_cuda_gemms_switch_tf32_for_the_block_only():
    """What a CUDA float32/tf32 GEMM runs under (the flag exists in a CPU build of torch too; nothing runs on a GPU),
    and torch's TF32 settings stay readable after (torch refuses reads once its two TF32 APIs were mixed)."""
    import torch

    matmul = torch.backends.cuda.matmul
    before, precision = matmul.allow_tf32, torch.get_float32_matmul_precision()
    with ceilings.MatmulPrecision(torch, "cuda", True) as tf32:
        assert matmul.allow_tf32 is True
    with ceilings.MatmulPrecision(torch, "cuda", False) as ieee:
        assert matmul.allow_tf32 is False
    assert matmul.allow_tf32 == before and torch.get_float32_matmul_precision() == precision
    assert (tf32["tf32"], tf32["cuda_matmul_flag"]) == (True, "allow_tf32=True")
    assert (ieee["tf32"], ieee["cuda_matmul_flag"]) == (False, "allow_tf32=False")
    with ceilings.MatmulPrecision(torch, "cpu", True) as cpu:
        assert matmul.allow_tf32 == before
    assert (cpu["tf32"], cpu["cuda_matmul_flag"]) == (None, None)


def test_a_run_repeats_the_call_until_it_lasts_min_run_s():
    record = ceilings.measure("cpu", {**TINY, "min_run_s": 0.005, "runs": 2}, threads=1)
    for m in record["measurements"]:
        assert m["calls_per_run"] == max(1, math.ceil(0.005 / m["calibration_s"])), m["name"]
        work = m.get("flop_per_call") or m["bytes_per_call"]
        rate = m.get("flops_per_s_best") or m["bytes_per_s_best"]
        assert rate == pytest.approx(work * m["calls_per_run"] / min(m["times_s"]), rel=1e-12)


def test_the_record_describes_this_machine_and_how_it_measured(tiny_record):
    import torch

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    models = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    m = tiny_record["machine"]
    assert m["cpu_model"] == (models[0] if models else m["cpu_model"])
    assert m["logical_cpus"] == (sum(line.startswith("processor") for line in text.splitlines()) or None)
    assert m["cpu_bf16_native"] == ("avx512_bf16" in flags or "amx_bf16" in flags) if flags else True
    assert tiny_record["threads"] == 1 and tiny_record["identity"]["threads"] == 1
    assert tiny_record["identity"] == {"device": "cpu", "cpu_model": m["cpu_model"], "logical_cpus": m["logical_cpus"],
                                       "gpus": None, "torch": torch.__version__, "threads": 1}
    assert tiny_record["fingerprint"] == machine.fingerprint(tiny_record["identity"])
    assert len(tiny_record["fingerprint"]) == 16 and int(tiny_record["fingerprint"], 16) >= 0
    assert tiny_record["settings"]["gemm_n"] == 64 and tiny_record["settings"]["stream_bytes"] == MIB // 4
    assert tiny_record["nominal"] is None and "not derived on CPU" in tiny_record["nominal_note"]
    warnings = " | ".join(tiny_record["warnings"])
    assert "n=64 is below 1024" in warnings
    if machine.last_level_cache():
        assert "below 4 x the last-level cache" in warnings
    assert ("emulated" in warnings) == (not m["cpu_bf16_native"])
    assert torch.get_num_threads() >= 1  # the measurement's thread count was put back


def test_the_written_record_reads_back_and_validates(tiny_record, tmp_path):
    from operator_profiler.files import write_json

    path = tmp_path / "cpu.json"
    write_json(path, tiny_record)
    back = ceilings.read_ceilings(path)
    assert back == json.loads(json.dumps(tiny_record))
    assert {"schema", "device", "machine", "fingerprint", "threads", "compute_flops_per_s", "memory_bytes_per_s",
            "nominal", "measurements", "measured_at"} <= set(back)
    assert back["schema"] == 1 and back["device"] == "cpu"


@pytest.mark.parametrize("mutate, says", [
    (lambda r: r.update(schema=2), "schema is 2"),
    (lambda r: r["compute_flops_per_s"].pop("float32"), "compute_flops_per_s.float32 is missing"),
    (lambda r: r["compute_flops_per_s"].update(float32=r["compute_flops_per_s"]["float32"] * 2),
     "compute_flops_per_s.float32 is not its measurement's flops_per_s_best"),
    (lambda r: r["memory_bytes_per_s"].update(best=min(r["memory_bytes_per_s"]["copy"], r["memory_bytes_per_s"]["triad"]) / 2),
     "memory_bytes_per_s.best is not the largest"),
    (lambda r: r["measurements"][0]["times_s"].append(1e-12), "best_s/median_s are not the min/median"),
    (lambda r: r.pop("fingerprint"), "fingerprint is missing"),
    (lambda r: r.update(device="tpu"), "device is 'tpu'"),
    (lambda r: r["trials"][0]["compute_flops_per_s"].update(float32=r["compute_flops_per_s"]["float32"] * 2),
     "compute_flops_per_s.float32 is not the best of its trials"),
    (lambda r: r["measurements"][0].update(trial=7), "names no trial of the 3"),
    (lambda r: r["trials"].pop(1), "trials is not a non-empty list of trials numbered from 0"),
])
def test_a_record_off_the_contract_is_refused_naming_the_field(tiny_record, mutate, says):
    record = copy.deepcopy(tiny_record)
    mutate(record)
    with pytest.raises(InputError, match="x.json is not a ceilings record") as info:
        ceilings.validate_ceilings(record, "x.json")
    assert says in str(info.value)


def test_each_ceiling_is_the_best_of_its_trials(tiny_record):
    """Three trials of the whole set (TINY leaves trials at its default, 3); each figure is the highest of the
    three, and its measurement record (times, calls) is that trial's."""
    trials = tiny_record["trials"]
    assert [t["trial"] for t in trials] == [0, 1, 2] and tiny_record["settings"]["trials"] == 3
    for field, keys in (("compute_flops_per_s", ("float32", "bfloat16")), ("memory_bytes_per_s", ("copy", "triad"))):
        for key in keys:
            values = [t[field][key] for t in trials]
            assert tiny_record[field][key] == max(values)
            m = _by_name(tiny_record)[f"gemm_{key}" if field == "compute_flops_per_s" else f"stream_{key}"]
            assert trials[m["trial"]][field][key] == max(values)
            assert m["trial"] == values.index(max(values))  # the earliest best
    for t in trials:  # a tiny trial (far under MIN_LOAD_WINDOW_S) has no load estimate, and says so
        assert t["elapsed_s"] >= 0 and (t["other_cpu_load"] is None) == (t["elapsed_s"] < ceilings.MIN_LOAD_WINDOW_S)


def test_a_trial_under_load_is_recorded_and_warned_of_when_a_figure_comes_from_it(monkeypatch):
    """/proc/stat stand-in: other processes keep 2.5 CPUs busy all along (busy seconds = 2.5 x wall time; this
    process's own CPU time held at 0, as os.times' 10 ms ticks would blur a short trial); 2 usable CPUs, 1 thread:
    1 spare, so every trial ran under load, and the figures kept from each are named in one warning per trial."""
    import os
    import time

    monkeypatch.setattr(machine, "cpu_busy_seconds", lambda: 2.5 * time.perf_counter())
    monkeypatch.setattr(os, "times", lambda: os.times_result((0.0, 0.0, 0.0, 0.0, 0.0)))
    monkeypatch.setattr(machine, "usable_cpus", lambda: 2)
    monkeypatch.setattr(ceilings, "MIN_LOAD_WINDOW_S", 0.0)
    record = ceilings.measure("cpu", {**TINY, "min_run_s": 0.01, "trials": 2}, threads=1)
    assert len(record["trials"]) == 2
    for t in record["trials"]:
        assert t["other_cpu_load"] == pytest.approx(2.5, rel=0.02)
    assert record["other_cpu_load"] == max(t["other_cpu_load"] for t in record["trials"])
    load = [w for w in record["warnings"] if "ran while other processes kept" in w]
    kept = {t: [m["name"] for m in record["measurements"] if m["trial"] == t] for t in (0, 1)}  # in record order
    assert len(load) == sum(1 for names in kept.values() if names)
    for t, names in kept.items():
        if names:
            (line,) = [w for w in load if f"(trial {t + 1})" in w]
            assert line.startswith(f"the best of 2 trial(s) for {', '.join(names)} (trial {t + 1}) ran while")
            assert "(1 spare beside its 1 thread(s))" in line and "snakemake --forcerun measure_ceilings" in line
    ceilings.validate_ceilings(record, "loaded.json")


def test_only_a_kept_figures_trial_under_load_is_a_warning():
    """Trial 0 ran under load (3 CPUs busy, 1 spare) but every figure was kept from trial 1 (quiet): no warning; the
    same figures kept from trial 0: one, naming them."""
    trials = [{"trial": 0, "other_cpu_load": 3.0}, {"trial": 1, "other_cpu_load": 0.2}]
    kept = [{"name": "gemm_float32", "trial": 1}, {"name": "stream_copy", "trial": 1}]
    assert ceilings._load_warnings(trials, kept, spare=1, threads=1) == []
    kept = [{"name": "gemm_float32", "trial": 0}, {"name": "stream_copy", "trial": 1}]
    (warning,) = ceilings._load_warnings(trials, kept, spare=1, threads=1)
    assert warning.startswith("the best of 2 trial(s) for gemm_float32 (trial 1) ran while other processes kept 3.0 "
                              "CPUs busy on average (1 spare beside its 1 thread(s))")
    # at the margin (spare + 0.5) not yet under load
    assert ceilings._load_warnings([{"trial": 0, "other_cpu_load": 1.5}], [{"name": "g", "trial": 0}], 1, 1) == []


def test_trials_must_be_at_least_one():
    with pytest.raises(ValueError, match="ceilings trials must be at least 1, got 0"):
        ceilings.resolve_settings("cpu", {"trials": 0}, None)
    assert ceilings.resolve_settings("cpu", {}, None)[0]["trials"] == 3


def test_a_missing_file_names_how_to_make_it(tmp_path):
    with pytest.raises(InputError, match="run the measure_ceilings rule"):
        ceilings.read_ceilings(tmp_path / "none.json")


# ---------------------------------------------------------------------------------------------- sizes


def test_sizes_follow_the_cache_and_the_device():
    settings, warnings = ceilings.resolve_settings("cpu", {}, 48 * MIB)
    assert settings["stream_bytes"] == 4 * 48 * MIB and settings["gemm_n"] == 2048 and not warnings
    assert (settings["runs"], settings["warmup"], settings["min_run_s"]) == (5, 2, 0.05)
    settings, _ = ceilings.resolve_settings("cpu", {"gemm_n": None}, 8 * MIB)
    assert settings["stream_bytes"] == 64 * MIB  # the floor: 4 x 8 MiB is less
    settings, warnings = ceilings.resolve_settings("cpu", {}, None)
    assert settings["stream_bytes"] == 256 * MIB and "size is unknown" in warnings[0]
    settings, warnings = ceilings.resolve_settings("cuda", {}, 50 * MIB)  # an H100's L2
    assert settings["stream_bytes"] == 8 * 50 * MIB and settings["gemm_n"] == 8192 and not warnings
    settings, warnings = ceilings.resolve_settings("cpu", {"stream_mib": 1, "gemm_n": 512}, 48 * MIB)
    assert settings["stream_bytes"] == MIB and len(warnings) == 2
    with pytest.raises(ValueError, match="unknown ceilings setting"):
        ceilings.resolve_settings("cpu", {"gemm": 5}, None)


# ---------------------------------------------------------------------------------------------- the machine


X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9654 96-Core Processor
stepping\t: 1
flags\t\t: fpu avx avx2 fma avx512f avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu avx avx2 fma avx512f avx512_bf16 avx512_vnni
"""
ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes sve bf16 i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_cpuinfo_of_an_x86_and_an_arm_cpu(tmp_path):
    (tmp_path / "x86").write_text(X86)
    (tmp_path / "arm").write_text(ARM)
    x86, arm = machine.cpu_info(tmp_path / "x86"), machine.cpu_info(tmp_path / "arm")
    assert (x86["model"], x86["vendor"], x86["family"], x86["model_id"], x86["logical_cpus"]) == (
        "AMD EPYC 9654 96-Core Processor", "AuthenticAMD", "25", "17", 2)
    assert machine.native_bf16(x86["flags"]) == ["avx512_bf16"]
    assert (arm["model"], arm["logical_cpus"]) == ("implementer 0x41 part 0xd40", 1)
    assert machine.native_bf16(arm["flags"]) == ["bf16"]
    assert machine.native_bf16(["avx2", "fma"]) == []
    assert machine.cpu_info(tmp_path / "missing")["model"] is None


def test_last_level_cache_counts_every_instance(tmp_path):
    def cache(cpu, index, level, kind, size, shared):
        folder = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (folder / name).write_text(f"{value}\n")

    for cpu in range(4):
        cache(cpu, 0, 1, "Data", "48K", str(cpu))
        cache(cpu, 1, 1, "Instruction", "32K", str(cpu))
        cache(cpu, 3, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")  # two L3s (two chiplets)
    assert machine.last_level_cache(tmp_path) == {"level": 3, "bytes_per_instance": 32 * MIB, "instances": 2,
                                                  "bytes": 64 * MIB}
    assert machine.last_level_cache(tmp_path / "none") is None


def test_busy_cpu_seconds_from_proc_stat(tmp_path):
    import os

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 20 30 1000 50 5 7 3 0 0\ncpu0 50 10 15 500 25 2 3 1 0 0\nintr 1\n")
    # user + nice + system + irq + softirq + steal; idle (1000) and iowait (50) are not busy
    assert machine.cpu_busy_seconds(stat) == pytest.approx((100 + 20 + 30 + 5 + 7 + 3) / os.sysconf("SC_CLK_TCK"))
    assert machine.cpu_busy_seconds(tmp_path / "none") is None


# ---------------------------------------------------------------------------------------------- nominal GPU peaks

# cudaDeviceProp values of two GPUs, and their datasheet peaks (NVIDIA H100 Tensor Core GPU datasheet, SXM5: FP32
# 67 TFLOPS, 3.35 TB/s; NVIDIA A100 Tensor Core GPU datasheet, 40 GB SXM: FP32 19.5 TFLOPS, 1,555 GB/s).
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": [9, 0], "multi_processor_count": 132,
        "clock_rate_khz": 1980000, "memory_clock_rate_khz": 2619000, "memory_bus_width_bits": 5120}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "compute_capability": [8, 0], "multi_processor_count": 108,
        "clock_rate_khz": 1410000, "memory_clock_rate_khz": 1215000, "memory_bus_width_bits": 5120}


@pytest.mark.parametrize("gpu, fp32, bandwidth", [(H100, 67e12, 3.35e12), (A100, 19.5e12, 1555e9)])
def test_nominal_peaks_from_properties_agree_with_the_datasheets(gpu, fp32, bandwidth):
    nominal = ceilings.nominal_cuda(gpu, None)
    assert nominal["fp32_flops_per_s"] == pytest.approx(fp32, rel=0.005)
    assert nominal["memory_bytes_per_s"] == pytest.approx(bandwidth, rel=0.005)
    assert "x 2 FLOP per FMA" in nominal["how"]["fp32_flops_per_s"]
    assert set(nominal["not_derived"]) == {"tf32", "float16", "bfloat16"}  # tensor-core peaks: never a number


def test_nominal_peaks_say_what_they_lack():
    smi = {"max_sm_mhz": 1980, "max_mem_mhz": 2619}  # nvidia-smi clocks.max.*
    nominal = ceilings.nominal_cuda({**H100, "clock_rate_khz": None, "memory_bus_width_bits": None}, smi)
    assert nominal["fp32_flops_per_s"] == pytest.approx(132 * 128 * 2 * 1980e6)
    assert "nvidia-smi clocks.max.sm" in nominal["how"]["fp32_flops_per_s"]
    assert nominal["memory_bytes_per_s"] is None and "bus width" in nominal["not_derived"]["memory_bytes_per_s"]
    unknown = ceilings.nominal_cuda({**H100, "compute_capability": [12, 0]}, None)
    assert unknown["fp32_flops_per_s"] is None
    assert "compute capability 12.0" in unknown["not_derived"]["fp32_flops_per_s"]
    locked = ceilings.at_locked_clock(ceilings.nominal_cuda(H100, None), {"locked": True, "applied": {"sm_mhz": 1755}})
    assert locked["fp32_flops_per_s_at_locked_clock"] == pytest.approx(132 * 128 * 2 * 1755e6)
    assert ceilings.at_locked_clock(nominal, {"locked": False}) is nominal


def test_a_cuda_job_without_a_gpu_restores_the_clocks_and_writes_no_ceilings(smi, tmp_path):
    """The fake nvidia-smi stands in for the driver (no GPU here): the job locks the clocks as the captures do,
    fails in one line, restores them, and leaves no ceilings.json."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: this checks the refusal without one")
    out, clocks = tmp_path / "cuda.json", tmp_path / "cuda.clocks_applied.json"
    with pytest.raises(ceilings.DeviceUnavailable, match="ceilings on 'cuda' need a CUDA GPU"):
        ceilings.measure_ceilings_job("cuda", TINY, {"policy": "base"}, None, out, clocks)
    assert not out.exists()
    applied = json.loads(clocks.read_text())
    assert applied["lock_set"] is True and applied["restored"] is True and applied["outcome"].startswith("failed:")
    assert applied["locked"] is False  # a job that failed at once has no read-back during it
    flags = [arg for call in smi.calls() for arg in call if arg in ("-lgc", "-lmc", "-rgc", "-rmc")]
    assert flags == ["-lgc", "-lmc", "-rgc", "-rmc"]  # locked, then restored after the failure


# ---------------------------------------------------------------------------------------------- opprof ceilings


def test_opprof_ceilings_prints_the_figures_it_writes(tmp_path):
    result = run_opprof("ceilings", "--out", "c.json", "--device", "cpu", "--threads", "1", "--gemm-n", "64",
                        "--stream-mib", "0.25", "--runs", "2", "--warmup", "1", "--min-run-s", "0", "--trials", "2",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    record = ceilings.read_ceilings(tmp_path / "c.json")
    assert record["threads"] == 1 and record["settings"]["runs"] == 2 and len(record["trials"]) == 2
    lines = result.stdout.splitlines()
    fp32 = next(line for line in lines if "GEMM float32" in line)
    assert f"{record['compute_flops_per_s']['float32'] / 1e9:.1f} GFLOP/s" in fp32
    copy_line = next(line for line in lines if line.strip().startswith("copy"))
    assert f"{record['memory_bytes_per_s']['copy'] / 1e9:.2f} GB/s" in copy_line
    kept = _by_name(record)["stream_copy"]["trial"]
    assert f"best of 2, trial {kept + 1} of 2;" in copy_line
    assert "2 trial(s); other processes' CPU load in each (CPUs busy): not estimated, not estimated" in result.stdout
    assert lines[-1] == "-> c.json"
    assert "n=64 is below 1024" in result.stderr  # the warnings, once, on stderr


def test_opprof_ceilings_on_cuda_without_a_gpu_is_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    result = run_opprof("ceilings", "--out", "c.json", "--device", "cuda", cwd=tmp_path)
    assert result.returncode == 1 and not (tmp_path / "c.json").exists()
    assert result.stderr.strip().splitlines() == [
        (f"opprof ceilings: error: ceilings on 'cuda' need a CUDA GPU, and torch {torch.__version__} sees none on this "
         "machine; measure on cpu, or run where the GPU is")]


# ---------------------------------------------------------------------------------------------- the rule


TARGET = "results/ceilings/cpu.json"


def _env(*first: Path) -> dict:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, first), str(ROOT / "src")])}


@pytest.mark.workflow
def test_measure_ceilings_runs_once_per_machine(tmp_path):
    """Measured once; not again for an unchanged machine; again when the machine's identity changes (here torch
    "upgraded": a torch distribution of another version first on the path of the Snakemake process and the job,
    whose import still finds the real torch), when the captures' thread count changes, and on --forcerun."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"device": "cpu", "ceilings": TINY, "workloads": {
        "lstm": {"kind": "lstm", "input_size": 4, "hidden_size": 8, "num_layers": 1, "batch_size": 1, "seq_len": 4}}}))
    work = tmp_path / "work"
    first = snakemake(work, config, TARGET, env=_env(), cores=2)  # the job claims both cores (OMP_NUM_THREADS=2)
    assert first.returncode == 0, first.stderr[-3000:]
    record = ceilings.read_ceilings(work / TARGET)
    assert record["threads"] == 1  # torch ran with the captures' (capture_timeline has no threads: 1), not the job's
    assert record["rerun_identity"] == record["identity"]  # what the workflow compares is what was measured
    assert not any("rerun check" in w for w in record["warnings"])
    assert json.loads((work / "results/ceilings/cpu.clocks_applied.json").read_text())["locked"] is False
    assert (work / "logs/measure_ceilings/cpu.log").is_file()
    assert (work / "results/ceilings/benchmarks/measure_ceilings.cpu.tsv").is_file()
    written = (work / TARGET).read_bytes()

    again = snakemake(work, config, TARGET, env=_env())
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]
    assert (work / TARGET).read_bytes() == written

    upgraded = tmp_path / "upgraded"
    (upgraded / "torch-99.0.dist-info").mkdir(parents=True)
    (upgraded / "torch-99.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 99.0\n")
    plan = snakemake(work, config, TARGET, "-n", env=_env(upgraded))
    assert plan.returncode == 0 and job_counts(plan.stdout) == {"measure_ceilings": 1}, plan.stdout[-3000:]
    assert "Params have changed since last execution" in plan.stdout
    rerun = snakemake(work, config, TARGET, env=_env(upgraded))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    remeasured = ceilings.read_ceilings(work / TARGET)
    assert remeasured["measured_at"] >= record["measured_at"] and (work / TARGET).read_bytes() != written
    assert remeasured["rerun_identity"]["torch"] == "99.0" and remeasured["identity"]["torch"] == record["identity"]["torch"]
    assert any("rerun check identifies the machine differently in torch" in w for w in remeasured["warnings"])

    # (2 cores: with 1 the captures would be capped at 1 thread, and so are the ceilings: nothing to measure again)
    threads = snakemake(work, config, TARGET, "-n", "--set-threads", "capture_timeline=2", env=_env(upgraded), cores=2)
    assert job_counts(threads.stdout) == {"measure_ceilings": 1}, threads.stdout[-3000:]
    capped = snakemake(work, config, TARGET, "-n", "--set-threads", "capture_timeline=2", env=_env(upgraded))
    assert "Nothing to be done" in capped.stdout + capped.stderr, capped.stdout[-3000:]
    forced = snakemake(work, config, TARGET, "-n", "--forcerun", "measure_ceilings", env=_env(upgraded))
    assert job_counts(forced.stdout) == {"measure_ceilings": 1}, forced.stdout[-3000:]
    unchanged = snakemake(work, config, TARGET, "-n", env=_env(upgraded))
    assert "Nothing to be done" in unchanged.stdout + unchanged.stderr, unchanged.stdout[-3000:]


def _ceilings_job(result) -> tuple[int, dict, dict]:
    """The measure_ceilings job of a dry run with -p: its threads, resources and the params it runs with."""
    import shlex

    block = result.stdout.split("rule measure_ceilings:", 1)[1]
    threads = int(re.search(r"^    threads: (\d+)$", block, re.M).group(1))
    resources = dict(item.split("=", 1) for item in re.search(r"^    resources: (.*)$", block, re.M).group(1).split(", "))
    command = next(line for line in block.splitlines() if "operator_profiler.gpu_jobs measure_ceilings" in line)
    argv = shlex.split(command.split("Shell command:", 1)[-1].strip())
    return threads, resources, json.loads(argv[argv.index("measure_ceilings") + 1])


@pytest.mark.workflow
@pytest.mark.parametrize("cores, capture_threads, measured", [(2, None, 1), (4, 2, 2), (2, 3, 2)])
def test_measure_ceilings_runs_alone_with_the_captures_threads(tmp_path, cores, capture_threads, measured):
    """The job claims every core of the run (threads = --cores: Snakemake starts no other job beside it), while
    torch measures with the captures' thread count (params threads; capture_timeline's threads, which Snakemake
    caps at --cores), and a SLURM job asks for that many CPUs (cpus_per_task)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"device": "cpu", "ceilings": TINY, "workloads": {
        "lstm": {"kind": "lstm", "input_size": 4, "hidden_size": 8, "num_layers": 1, "batch_size": 1, "seq_len": 4}}}))
    extra = ["--set-threads", f"capture_timeline={capture_threads}"] if capture_threads else []
    plan = snakemake(tmp_path / "work", config, "-n", "-p", "--forcerun", "measure_ceilings", *extra, env=_env(),
                     cores=cores)
    assert plan.returncode == 0, plan.stderr[-3000:]
    threads, resources, params = _ceilings_job(plan)
    assert threads == cores
    assert params["threads"] == measured and params["machine"]["threads"] == measured
    assert resources["cpus_per_task"] == str(measured)


def test_a_slow_gemm_is_measured_at_the_size_a_quarter_second_call_has():
    # bfloat16 on an AVX2-only EPYC (no native bfloat16): about 0.2 GFLOP/s, so one n=2048 call would take 86 s
    slow = 0.2e9
    n = int((ceilings.SLOW_GEMM_CALL_S * slow / 2) ** (1 / 3)) // 32 * 32
    assert ceilings.auto_gemm_n(slow, 2048) == n == 288
    assert 2 * n**3 / slow <= ceilings.SLOW_GEMM_CALL_S
    assert ceilings.auto_gemm_n(90e9, 2048) == 2048  # 0.19 s per call: the default size stays
    assert ceilings.auto_gemm_n(1e3, 2048) == ceilings.PROBE_GEMM_N  # never below the probe's size


def test_gemm_sizes_probe_only_an_automatic_cpu_size(monkeypatch):
    rates = {"float32": 90e9, "bfloat16": 0.2e9}
    monkeypatch.setattr(ceilings, "probe_gemm_rate", lambda torch, device, dtype: rates[dtype])
    resolved, _ = ceilings.resolve_settings("cpu", {}, 32 * MIB)
    sizes, warnings = ceilings.gemm_sizes(None, "cpu", resolved)
    assert sizes == {"float32": 2048, "bfloat16": 288}
    assert warnings == ["the bfloat16 GEMM is slow on this CPU (0.2 GFLOP/s at n=256: one n=2048 call would take "
                        "about 86 s): measured at n=288"]

    def no_probe(*args):
        raise AssertionError("a size the user set is never probed")

    monkeypatch.setattr(ceilings, "probe_gemm_rate", no_probe)
    resolved, _ = ceilings.resolve_settings("cpu", {"gemm_n": 1024}, 32 * MIB)
    assert ceilings.gemm_sizes(None, "cpu", resolved) == ({"float32": 1024, "bfloat16": 1024}, [])
    resolved, _ = ceilings.resolve_settings("cuda", {}, 50 * MIB)
    assert ceilings.gemm_sizes(None, "cuda", resolved)[0] == dict.fromkeys(ceilings.GEMM_DTYPES["cuda"], 8192)


def test_a_measurement_records_the_size_each_gemm_ran_at(monkeypatch):
    monkeypatch.setattr(ceilings, "DEFAULT_GEMM_N", {"cpu": 128, "cuda": 8192})
    monkeypatch.setattr(ceilings, "probe_gemm_rate", lambda torch, device, dtype: 1e3 if dtype == "bfloat16" else 1e12)
    monkeypatch.setattr(ceilings, "PROBE_GEMM_N", 64)  # (the floor of the automatic size)
    record = ceilings.measure("cpu", {"stream_mib": 0.25, "runs": 1, "warmup": 1, "min_run_s": 0, "trials": 1},
                              threads=1)
    measured = _by_name(record)
    assert measured["gemm_float32"]["n"] == 128 and measured["gemm_bfloat16"]["n"] == 64
    assert record["settings"]["gemm_sizes"] == {"float32": 128, "bfloat16": 64}
    assert any(w.startswith("the bfloat16 GEMM is slow on this CPU") for w in record["warnings"])
    ceilings.validate_ceilings(record)


def test_opprof_ceilings_checks_out_before_it_measures(tmp_path):
    import time

    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "adir").mkdir()
    for out, says in ((tmp_path / "adir", "is a folder"), (afile / "x.json", "is a file, not a folder"),
                      (Path("/proc/opprof-x.json"), "cannot write in /proc")):
        t0 = time.monotonic()
        result = run_opprof("ceilings", "--out", str(out), cwd=tmp_path)  # default sizes: a measurement would take a minute or more
        assert result.returncode == 1 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert time.monotonic() - t0 < 30  # refused before measuring
    assert afile.read_text() == "x"
