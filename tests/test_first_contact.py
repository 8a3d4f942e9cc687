"""``scripts/gpu-check --first-contact`` (:mod:`operator_profiler.first_contact`) on a machine without a GPU.

There is no GPU, CUDA or Nsight Compute here. The run below puts the test doubles of tests/fake_tools.py first on
PATH: a FAKE ``nvidia-smi`` (answers from a JSON state) and a FAKE ``ncu`` that prints the REAL ``--help``,
``--list-chips`` and ``--query-metrics-mode suffix`` output of ncu 2024.1.1 (tests/data/ncu-2024.1.1). The facts
that need CUDA (the toy program under torch.profiler and ncu, clock locking) are therefore ``skipped`` here: the
test proves the command, its one line per fact, ``first_contact.json``, the time limit and the exit status. The
judging of the toy's ncu runs is tested on its own with kernel names of the kinds the toy launches (the cuBLAS
and Triton names as Kineto and ncu print them, written out by hand: no GPU run was available).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_tools import FakeNcu, FakeSmi

from operator_profiler import first_contact as fc

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"
KEYS = ["versions", "gpu", "ncu_help", "ncu_metrics", "kineto_cuda", "ncu_counters", "ncu_nvtx_window",
        "ncu_launch_skip_nvtx", "ncu_profiler_range", "ncu_launch_skip_profiler_api", "ncu_kernel_names",
        "ncu_raw_page", "ncu_locale", "ncu_catalog", "ncu_report", "nsys", "clocks"]


def _env(tmp_path: Path) -> dict:
    smi = FakeSmi(tmp_path / "smi")
    ncu = FakeNcu(tmp_path / "ncu", [])
    env = {**os.environ, **{k: v for k, v in smi.env().items() if k != "PATH"}, **ncu.env()}
    # no nsys on PATH: the folder of this interpreter, the fakes and the system's tools only
    env["PATH"] = os.pathsep.join([str(ncu.bin), str(smi.bin), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def test_first_contact_on_a_machine_without_cuda_prints_every_fact_and_writes_the_record(tmp_path):
    work = tmp_path / "check dir"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--first-contact", "--workdir", str(work)],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("first contact: ")]
    assert [ln.split()[2] for ln in lines] == KEYS, proc.stdout + proc.stderr
    record = json.loads((work / "first-contact" / "first_contact.json").read_text())
    assert record["format"] == "opprof.first_contact/1" and [f["key"] for f in record["facts"]] == KEYS
    facts = {f["key"]: f for f in record["facts"]}
    # torch sees no CUDA here: a problem of the machine, said in the versions line, and the exit status is 1
    assert proc.returncode == 1 and record["problems"] == ["versions"]
    assert "torch sees no CUDA GPU" in facts["versions"]["summary"]
    assert facts["versions"]["details"]["ncu"] == "2025.1.1.0"  # the fake's --version
    # the compute capability from nvidia-smi (the fake: 9.0), Hopper
    assert facts["gpu"]["status"] == "ok" and facts["gpu"]["details"]["arch"] == "hopper"
    assert facts["gpu"]["details"]["compute_cap"] == "9.0" and facts["gpu"]["details"]["torch_compute_cap"] is None
    # ncu's defaults, read from its real --help (2024.1.1)
    assert facts["ncu_help"]["details"]["defaults"]["clock-control"] == "base"
    assert facts["ncu_help"]["details"]["defaults"]["cache-control"] == "all"
    # the chip's metrics: the real gh100 answer; no Hopper name lacking, Blackwell's subpipe name dropped
    metrics = facts["ncu_metrics"]
    assert metrics["status"] == "ok" and metrics["details"]["query"]["chip"] == "gh100"
    assert metrics["details"]["lacking_per_arch"]["hopper"] == []
    assert metrics["details"]["lacking_per_arch"]["blackwell"] == [
        "sm__pipe_tensor_subpipe_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"]
    assert metrics["details"]["lacking_per_arch"]["ampere"] == []  # (inherited names exist on gh100)
    # what needs CUDA is skipped, saying why
    for key in KEYS[4:]:
        assert facts[key]["status"] == "skipped", (key, facts[key])
    assert "torch sees no CUDA GPU" in facts["kineto_cuda"]["summary"]
    assert "nsys is not on PATH" in facts["nsys"]["summary"]
    # the tools' own output is kept (the capture set)
    kept = set(record["files"])
    assert {"ncu-help.txt", "ncu-list-chips.txt", "ncu-query-metrics.txt"} <= kept
    assert "Chip gh100" in (work / "first-contact" / "ncu-query-metrics.txt").read_text()
    assert record["duration_s"] < 300


def test_the_budget_skips_what_it_cannot_fit_and_a_foreign_workdir_is_refused(tmp_path):
    work = tmp_path / "w"
    env = _env(tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--first-contact", "--workdir", str(work), "--budget-s",
                           "0.5"], capture_output=True, text=True, env=env, timeout=120)
    record = json.loads((work / "first-contact" / "first_contact.json").read_text())
    assert [f["key"] for f in record["facts"]] == KEYS  # every fact, also those never reached
    assert [f["status"] for f in record["facts"]] == ["skipped"] * len(KEYS)
    assert all("time budget ran out" in f["summary"] for f in record["facts"])
    # nothing was found wrong, but nothing was checked either: not a success
    assert record["incomplete"] == KEYS and record["problems"] == [] and proc.returncode == 1
    assert "NOT CHECKED for lack of time" in proc.stdout
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.txt").write_text("mine")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--first-contact", "--workdir", str(foreign)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "was not made by gpu-check" in proc.stderr and "Traceback" not in proc.stderr
    assert (foreign / "data.txt").read_text() == "mine" and not (foreign / "first-contact").exists()
    # a file, a folder under a file, nan and inf budgets, no cores: one line each, exit 2, nothing written
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv in (["--workdir", str(afile)], ["--workdir", str(afile / "sub")], ["--budget-s", "nan"],
                 ["--budget-s", "inf"], ["--budget-s", "-5"], ["--cores", "0"], ["--iterations", "0"]):
        proc = subprocess.run([sys.executable, str(SCRIPT), "--first-contact", *argv], capture_output=True,
                              text=True, env=env, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (argv, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1].startswith(("gpu-check: error:", "usage:")) or \
            "error:" in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert afile.read_text() == "x"


# What Kineto and ncu call the toy's window kernels (K0 fill, K1 cuBLAS GEMM, K2 Triton, K3 mul). Written out by
# hand in each tool's style (Kineto: demangled; ncu --print-kernel-base mangled: mangled, or the plain name of a
# cuBLAS or Triton kernel); not from a GPU run.
FILL_K = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
FILL_N = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel"
TRITON = "triton_poi_fused_add_mul_relu_0"
MUL_K = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)"
MUL_N = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEESt5arrayIPcLm2EEEEviT0_T1_"
SPIN_K = "at::cuda::(anonymous namespace)::spin_kernel(long)"
SPIN_N = "_ZN2at4cuda12_GLOBAL__N_111spin_kernelEl"


def test_a_run_that_profiled_exactly_the_window_is_ok_and_any_other_is_a_problem():
    if fc.agreeing([FILL_K], [FILL_N]) != ["mangled"] and fc.agreeing([FILL_K], [FILL_N]) != ["demangled"]:
        pytest.skip("no C++ demangler (libstdc++) on this machine")
    kineto = [FILL_K, GEMM, TRITON, MUL_K]
    ncu = [FILL_N, GEMM, TRITON, MUL_N]
    ok = fc.judge_selection("ncu_nvtx_window", "c", kineto, ncu, "--nvtx-include", "fix it")
    assert ok.status == "ok" and ok.details["rungs"][1:3] == ["demangled", "demangled"]
    # launches before cudaProfilerStart counted: --launch-skip 1 --launch-count 2 landed on K0 (and K1)
    shifted = fc.judge_selection("s", "c", kineto[1:3], ncu[0:2], "--launch-skip 1", "keep ncu.window: nvtx")
    assert shifted.status == "problem" and shifted.details["rungs"] == [None, None]
    assert "keep ncu.window: nvtx" in shifted.summary
    # a filter that let the spin kernel after the NVTX range through
    extra = fc.judge_selection("w", "c", kineto, ncu + [SPIN_N], "--nvtx-include", "x")
    assert extra.status == "problem" and "profiled 5 kernel(s) where 4 were meant" in extra.summary
    failed = fc.judge_selection("w", "c", kineto, None, "--nvtx-include", "x")
    assert failed.status == "unknown"


def test_help_defaults_and_passes_from_real_ncu_text():
    import gzip

    from fake_tools import NCU_QUERY

    text = gzip.open(NCU_QUERY / "help.txt.gz", "rt").read()
    defaults = fc.help_defaults(text)
    assert defaults["clock-control"] == "base" and defaults["cache-control"] == "all"
    assert defaults["print-kernel-base"] == "demangled" and defaults["replay-mode"] == "kernel"
    assert defaults["profile-from-start"] == "1"
    # ncu's progress line per profiled kernel (the CLI guide's example)
    assert fc.passes('==PROF== Profiling "vectorAdd_A" - 0: 0%....50%....100% - 46 passes\n'
                     '==PROF== Profiling "vectorAdd_B" - 1: 0%....50%....100% - 1 pass\n') == [46, 1]


@pytest.fixture
def toy_ncu(tmp_path, monkeypatch):
    """The fake ncu and nvidia-smi, the fake ncu answering the toy's collections as ncu's documentation says the
    filters behave (``FAKE_NCU_TOY``: the window's names, the kernel after the NVTX range, the launches before
    cudaProfilerStart)."""
    smi = FakeSmi(tmp_path / "smi")
    ncu = FakeNcu(tmp_path / "ncu", [])
    for k, v in {**smi.env(), **ncu.env()}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", os.pathsep.join([str(ncu.bin), str(smi.bin), os.environ["PATH"]]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    toy = tmp_path / "toy.json"
    monkeypatch.setenv("FAKE_NCU_TOY", str(toy))

    def contact(**behaviour) -> fc.FirstContact:
        toy.write_text(json.dumps({"window": [FILL_N, GEMM, TRITON, MUL_N], "after_range": [SPIN_N], "before": 16,
                                   **behaviour}))
        c = fc.FirstContact(tmp_path / "out", 300)
        c.ncu = __import__("shutil").which("ncu")
        c.cuda = True  # as if torch saw a GPU: the toy's Kineto names given, its ncu runs answered by the fake
        c.kineto, c.after_range = [FILL_K, GEMM, TRITON, MUL_K], [SPIN_K]
        return c

    return contact, ncu


def test_the_toys_ncu_runs_as_documented_give_ok_facts(toy_ncu, capsys):
    make, ncu = toy_ncu
    contact = make()
    contact.ncu_runs()
    facts = {f.key: f for f in contact.facts}
    if facts["ncu_nvtx_window"].details["rungs"][0] is None:
        pytest.skip("no C++ demangler (libstdc++) on this machine")
    assert [f.key for f in contact.facts] == KEYS[5:13]
    for key in ("ncu_counters", "ncu_nvtx_window", "ncu_launch_skip_nvtx", "ncu_launch_skip_profiler_api",
                "ncu_profiler_range", "ncu_kernel_names", "ncu_raw_page"):
        assert facts[key].status == "ok", facts[key]
    assert facts["ncu_kernel_names"].details["roles"] == ["K0", "cuBLAS", "triton", "K3"]
    assert facts["ncu_raw_page"].details["ids"] == [0, 1, 2, 3]
    collections = ncu.collections()
    assert [c[c.index("--launch-skip") + 1] if "--launch-skip" in c else None for c in collections] == [
        None, "1", None, "1"]
    assert collections[0][:5] == ["--profile-from-start", "off", "--nvtx", "--nvtx-include", "opprof@opprof.measured"]
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(contact.facts) and all(ln.startswith("first contact: ") for ln in printed)


def test_launch_skip_counting_launches_before_cudaProfilerStart_is_a_problem_named_with_the_fix(toy_ncu):
    make, _ = toy_ncu
    contact = make(skip_counts_launches_before_start=True)
    contact.ncu_runs()
    facts = {f.key: f for f in contact.facts}
    if facts["ncu_nvtx_window"].details["rungs"][0] is None:
        pytest.skip("no C++ demangler (libstdc++) on this machine")
    assert facts["ncu_launch_skip_profiler_api"].status == "problem"
    assert "keep ncu.window: nvtx" in facts["ncu_launch_skip_profiler_api"].summary
    assert facts["ncu_launch_skip_nvtx"].status == "ok"  # the NVTX window counts only its own launches


def test_counters_held_by_dcgm_stop_the_ncu_facts_with_the_fix(toy_ncu, monkeypatch):
    make, _ = toy_ncu
    monkeypatch.setenv("FAKE_NCU_FAIL", "dcgm")
    contact = make()
    contact.ncu_runs()
    fact, *rest = contact.facts
    assert fact.key == "ncu_counters" and fact.status == "problem" and "dcgmi profile --pause" in fact.summary
    assert [f.key for f in rest] == KEYS[6:13] and {f.status for f in rest} == {"skipped"}


def test_the_catalog_on_one_kernel_and_ncu_report_without_the_module(toy_ncu):
    make, ncu = toy_ncu
    contact = make()
    contact.ncu_runs()
    contact.catalog()
    contact.ncu_report()
    catalog, report = contact.facts[-2], contact.facts[-1]
    call = ncu.collections()[-1]
    from operator_profiler.ncu.catalog import load_catalog

    assert call[call.index("--metrics") + 1].split(",") == load_catalog().replay_metrics("hopper")
    assert call[call.index("--launch-skip") + 1] == "1" and call[call.index("--launch-count") + 1] == "1"
    # the fake's raw page carries the real dropout CSV's metrics only: the others are named as without value
    from fake_tools import real_metric_rows

    in_the_csv = {name for name, _ in real_metric_rows()["metrics"]}
    assert catalog.key == "ncu_catalog" and catalog.status == "problem"
    assert catalog.details["without_value"] == [n for n in load_catalog().replay_metrics("hopper")
                                                if n not in in_the_csv]
    assert "dram__bytes.sum" in in_the_csv and "dram__bytes.sum" not in catalog.details["without_value"]
    assert report.key == "ncu_report" and report.status == "unknown"  # no extras/python beside the fake


def _tools(folder: Path, script: str) -> dict:
    folder.mkdir(parents=True)
    for tool in ("ncu", "nvidia-smi", "nsys"):
        (folder / tool).write_text(script)
        (folder / tool).chmod(0o755)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    env["PATH"] = os.pathsep.join([str(folder), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def test_tools_answering_garbage_are_reported_never_a_crash(tmp_path):
    env = _tools(tmp_path / "bin", "#!/bin/sh\nprintf '\\377\\376 garbage, ==ERROR== something\\n'\nexit 0\n")
    work = tmp_path / "w"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--first-contact", "--workdir", str(work), "--budget-s", "120"],
                          capture_output=True, text=True, env=env, timeout=300)
    record = json.loads((work / "first-contact" / "first_contact.json").read_text())
    facts = {f["key"]: f for f in record["facts"]}
    assert [f["key"] for f in record["facts"]] == KEYS and "Traceback" not in proc.stderr
    versions = facts["versions"]["details"]
    assert versions["driver"] is None and versions["ncu"] is None and versions["nsys"] is None
    assert "garbage" in versions["ncu_said"] and "UnicodeDecodeError" not in json.dumps(record)
    assert facts["gpu"]["status"] == "problem"  # no compute capability from garbage (and no CUDA torch here)
    assert facts["nsys"]["status"] == "problem" and "gave no version" in facts["nsys"]["summary"]
    assert (work / "first-contact" / "ncu-version.txt").exists()  # the garbage is kept as said


def test_hanging_tools_stay_inside_the_budget(tmp_path):
    import time

    env = _tools(tmp_path / "bin", "#!/bin/sh\nsleep 1000 &\nwait\n")
    work = tmp_path / "w"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--first-contact", "--workdir", str(work), "--budget-s", "12"],
                          capture_output=True, text=True, env=env, timeout=300)
    took = time.monotonic() - t0
    record = json.loads((work / "first-contact" / "first_contact.json").read_text())
    assert took < 12 + 25  # the budget, plus interpreter start-up and the torch import of a loaded machine
    assert record["duration_s"] <= 12 + 5
    assert [f["key"] for f in record["facts"]] == KEYS and proc.returncode == 1
    assert "no answer within" in record["facts"][0]["details"]["ncu_said"]
