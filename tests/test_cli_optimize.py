"""``opprof optimize --results results/<workload>``: advise -> the advised variant profiled (the workflow's stage
functions, in process) -> verified (real interleaved timing in worker processes) -> optimize/report.html with the
decision trail, on a tiny eager MLP profiled in process by the same functions; and the one-line refusals of a
folder that is missing, unfinished or whose run.json lacks the workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import run_opprof

from operator_profiler import stages
from operator_profiler.config import usable_cpus, validate_config

NAME = "tiny_mlp"
WORKLOAD = {"kind": "mlp", "compile": False, "width": 32, "expansion": 2, "n_block": 2, "batch_size": 2, "seq_len": 8}
HARNESS = {"seed": 0, "warmup": 1, "iterations": 6}
THREADS = min(2, usable_cpus() or 1)


def _config(work) -> dict:
    """The defaults, with freeze_weights firing on any weight GEMM share (as tests/test_workflow_optimize.py does:
    the test is of the command, which needs a variant to profile and verify)."""
    from operator_profiler.optimize.advisor import CATALOG

    text = CATALOG.read_text()
    assert "measure: weight_gemm_share\n  min: 0.2\n" in text
    catalog = work / "catalog.yaml"
    catalog.write_text(text.replace("measure: weight_gemm_share\n  min: 0.2\n",
                                    "measure: weight_gemm_share\n  min: 0.0\n"))
    return {"device": "cpu", "harness": HARNESS, "workloads": {NAME: WORKLOAD}, "optimize": {"catalog": str(catalog)}}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """results/tiny_mlp/: a finished profile, made by the stage functions the command profiles variants with."""
    work = tmp_path_factory.mktemp("optimize_cli")
    raw = _config(work)
    (work / "config.yaml").write_text(yaml.safe_dump(raw))
    config = validate_config(raw)
    # as a Snakemake job without harness.threads runs it: OMP_NUM_THREADS=1 (torch's default here may be more)
    stages.profile_files(NAME, config["workloads"][NAME], HARNESS, "cpu", work / "results" / NAME, config,
                         env=dict.fromkeys(stages.THREAD_ENV, "1"))
    return work


@pytest.fixture(scope="module")
def optimized(profiled):
    mp = pytest.MonkeyPatch()
    # max_autotune (in the strong baseline) with only ATen's GEMMs: nothing to benchmark (the workers inherit it)
    mp.setenv("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS", "ATEN")
    for key in stages.THREAD_ENV:  # the variant's thread count must come from the base profile, not from here
        mp.delenv(key, raising=False)
    try:
        result = run_opprof("optimize", "--results", f"results/{NAME}", "--config", "config.yaml",
                            "--threads", THREADS, cwd=profiled)
    finally:
        mp.undo()
    assert result.returncode == 0, result.stderr[-3000:]
    return profiled, result


@pytest.mark.workflow
def test_optimize_advises_profiles_the_variant_verifies_and_writes_the_page(optimized):
    work, result = optimized
    base = work / "results" / NAME
    advice = json.loads((base / "advice.json").read_text())
    assert "freezing" in advice["advised_changes"]
    variant = work / "results" / f"{NAME}+{'+'.join(advice['advised_changes'])}"
    run = json.loads((variant / "capture" / "run.json").read_text())
    assert "freezing" in run["changes"] and (variant / "operators.parquet").is_file()
    assert (variant / "inductor" / "fusion_map.parquet").is_file()  # compiled: the fusion map path ran
    # capture and compile in processes of their own, as the workflow's jobs: the fusion map names the graphs the
    # timeline ran, every kernel attributed
    coverage_text = (variant / "coverage.json").read_text()
    assert json.loads(coverage_text)["coverage_time"] == 1.0 and "fusion_map_mismatch" not in coverage_text
    # the base profile's recorded thread count and its source (OMP_NUM_THREADS=1, as Snakemake sets it)
    base_run = json.loads((base / "capture" / "run.json").read_text())
    assert base_run["threads"] == {"count": 1, "requested": None, "source": "OMP_NUM_THREADS"}
    assert run["threads"] == base_run["threads"] and run["harness"] == base_run["harness"]
    verification = json.loads((base / "optimize" / "verification.json").read_text())
    assert verification["threads"] == THREADS and verification["threads_source"] == "--threads"
    scaling = verification["thread_scaling"]
    assert scaling["verdict"] in (("scales", "single_thread", "unknown") if THREADS > 1 else ("one_thread",))
    trail = verification["ablation"]["recommended"]["trail"]
    assert trail
    page = (base / "optimize" / "report.html").read_text()
    assert "Decision trail" in page and f"Threads: {THREADS}" in page
    assert (base / "optimize" / "compare.html").is_file()
    out = result.stdout
    assert "advised: " in out and "recommended: " in out and f"  1. {trail[0]}" in out
    assert f"threads: {THREADS} (--threads): {scaling['text']}" in out
    assert f"optimize page: results/{NAME}/optimize/report.html" in out


@pytest.mark.workflow
def test_a_second_run_keeps_the_finished_variant_profile(optimized, monkeypatch):
    """The variant's folder is finished: only advise, verify and the page run again (verification stubbed)."""
    work, _ = optimized
    from operator_profiler.optimize import verify

    recorded = json.loads((work / "results" / NAME / "optimize" / "verification.json").read_text())

    def fake_job(*args, **kwargs):  # the run removed the previous verification.json first: written again
        Path(args[5]).parent.mkdir(parents=True, exist_ok=True)
        Path(args[5]).write_text(json.dumps(recorded))
        return recorded

    monkeypatch.setattr(verify, "verify_variants_job", fake_job)
    monkeypatch.setattr(stages, "profile_files", lambda *a, **k: pytest.fail("profiled the variant again"))
    result = run_opprof("optimize", "--results", f"results/{NAME}", "--config", "config.yaml", cwd=work)
    assert result.returncode == 0, result.stderr
    assert "already profiled, kept" in result.stdout


def _copy(work, tmp_path):
    import shutil

    shutil.copytree(work / "results", tmp_path / "results")
    shutil.copy(work / "config.yaml", tmp_path / "config.yaml")
    return tmp_path


@pytest.mark.workflow
def test_a_variant_folder_holding_another_profile_is_profiled_again(optimized, monkeypatch, tmp_path):
    """The base profile copied into the variant's folder (files present, another workload slice): removed and
    profiled again, at the base profile's thread environment; the page then compares the real variant."""
    import shutil

    from operator_profiler.optimize import verify

    work, _ = optimized
    here = _copy(work, tmp_path)
    advice = json.loads((here / "results" / NAME / "advice.json").read_text())
    variant = f"{NAME}+{'+'.join(advice['advised_changes'])}"
    shutil.rmtree(here / "results" / variant)
    shutil.copytree(here / "results" / NAME, here / "results" / variant)
    (here / "results" / variant / "stale.txt").write_text("eager")
    recorded = json.loads((work / "results" / NAME / "optimize" / "verification.json").read_text())
    calls = []

    def fake_profile(name, workload, harness, device, out, options, *args, env=None):
        calls.append((name, workload["changes"], harness, env, (out / "stale.txt").exists()))
        shutil.copytree(work / "results" / variant, out)

    def fake_job(*args, **kwargs):
        Path(args[5]).parent.mkdir(parents=True, exist_ok=True)
        Path(args[5]).write_text(json.dumps(recorded))
        return recorded

    monkeypatch.setattr(verify, "verify_variants_job", fake_job)
    monkeypatch.setattr(stages, "profile_files", fake_profile)
    result = run_opprof("optimize", "--results", f"results/{NAME}", "--config", "config.yaml", cwd=here)
    assert result.returncode == 0, result.stderr
    assert "not this variant's profile (its workload slice is another" in result.stdout
    assert "already profiled, kept" not in result.stdout
    assert calls == [(variant, advice["advised_changes"], HARNESS, dict.fromkeys(stages.THREAD_ENV, "1"), False)]
    assert not (here / "results" / variant / "stale.txt").exists()
    run = json.loads((here / "results" / variant / "capture" / "run.json").read_text())
    assert run["changes"] == advice["advised_changes"]


@pytest.mark.workflow
def test_a_failed_run_leaves_no_verification_or_page_of_other_advice(optimized, monkeypatch, tmp_path):
    """The verification fails (injected): the previous run's verification.json, pages and timing/ are gone, and
    advice.json is the new advice (nothing describes other advice)."""
    from operator_profiler.errors import CaptureError
    from operator_profiler.optimize import verify

    work, _ = optimized
    here = _copy(work, tmp_path)
    out = here / "results" / NAME / "optimize"
    (out / "timing" / "round1").mkdir(parents=True, exist_ok=True)  # a previous run's timing (the test order)
    (out / "timing" / "round1" / "old.json").write_text("{}")
    assert all((out / name).exists() for name in ("verification.json", "report.html", "compare.html", "timing"))
    (here / "results" / NAME / "advice.json").write_text(json.dumps({"advised_changes": ["old"], "advice": []}))

    def failing(*args, **kwargs):
        raise CaptureError("injected failure")

    monkeypatch.setattr(verify, "verify_variants_job", failing)
    result = run_opprof("optimize", "--results", f"results/{NAME}", "--config", "config.yaml", cwd=here)
    assert result.returncode == 1 and "injected failure" in result.stderr
    assert "removed the previous run's verification.json, report.html, compare.html, timing" in result.stdout
    assert not any((out / name).exists() for name in ("verification.json", "report.html", "compare.html", "timing"))
    advice = json.loads((here / "results" / NAME / "advice.json").read_text())
    assert "freezing" in advice["advised_changes"]


def test_the_thread_environment_follows_the_base_profiles_record():
    assert stages.thread_env({"threads": {"count": 1, "requested": None, "source": "OMP_NUM_THREADS"}}) == \
        dict.fromkeys(stages.THREAD_ENV, "1")
    assert stages.thread_env({"threads": {"count": 3, "requested": 3, "source": "harness.threads"}}) == \
        dict.fromkeys(stages.THREAD_ENV, "3")
    assert stages.thread_env({"threads": {"count": 2, "requested": None, "source": "torch default"}}) == \
        {"OMP_NUM_THREADS": None}
    assert stages.thread_env({}) == {}


def _one_line_error(result, *says):
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opprof optimize: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for text in says:
        assert text in lines[0]


def test_a_missing_folder_is_one_line(tmp_path):
    _one_line_error(run_opprof("optimize", "--results", "results/nope", cwd=tmp_path), "no such folder")


def test_an_unfinished_profile_is_one_line(tmp_path):
    (tmp_path / "results" / "w" / "capture").mkdir(parents=True)
    (tmp_path / "results" / "w" / "capture" / "run.json").write_text("{}")
    _one_line_error(run_opprof("optimize", "--results", "results/w", cwd=tmp_path), "not a finished profile",
                    "operators.parquet", "run the workflow")


def test_a_run_json_without_the_workload_is_one_line(tmp_path):
    folder = tmp_path / "results" / "w"
    for name in stages.OPTIMIZE_NEEDS:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    (folder / "capture" / "run.json").write_text(json.dumps({"harness": {}, "versions": {"device": "cpu"}}))
    _one_line_error(run_opprof("optimize", "--results", "results/w", cwd=tmp_path), "capture/run.json lacks workload")
    (folder / "capture" / "run.json").write_text(json.dumps({"harness": {}, "versions": {"device": "cpu"},
                                                             "workload": {"kind": "mlp"}, "timeline": "nsys"}))
    _one_line_error(run_opprof("optimize", "--results", "results/w", cwd=tmp_path), "captured with nsys")


def test_a_thread_count_above_the_cpus_is_one_line(tmp_path):
    _one_line_error(run_opprof("optimize", "--results", "results/w", "--threads", (usable_cpus() or 1) + 1,
                               cwd=tmp_path), "--threads", "more than the")


def test_help_lists_the_command():
    from operator_profiler.cli import build_parser

    assert "optimize" in build_parser().format_help()


def test_a_file_or_an_empty_results_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    _one_line_error(run_opprof("optimize", "--results", "afile", cwd=tmp_path), "--results afile: not a folder")
    _one_line_error(run_opprof("optimize", "--results", "", cwd=tmp_path), "--results is empty")
    _one_line_error(run_opprof("optimize", "--results", "  ", cwd=tmp_path), "--results is empty")
