"""``opprof optimize --results results/<workload>``: advise -> the advised variant profiled (the workflow's stage
functions, in process) -> verified (real interleaved timing in worker processes) -> optimize/report.html with the
decision trail, on a tiny eager MLP profiled in process by the same functions; and the one-line refusals of a
folder that is missing, unfinished or whose run.json lacks the workload."""

from __future__ import annotations

import json

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
    stages.profile_files(NAME, config["workloads"][NAME], HARNESS, "cpu", work / "results" / NAME, config)
    return work


@pytest.fixture(scope="module")
def optimized(profiled):
    mp = pytest.MonkeyPatch()
    # max_autotune (in the strong baseline) with only ATen's GEMMs: nothing to benchmark (the workers inherit it)
    mp.setenv("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS", "ATEN")
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

    def fake_job(*args, **kwargs):
        return recorded

    monkeypatch.setattr(verify, "verify_variants_job", fake_job)
    monkeypatch.setattr(stages, "profile_files", lambda *a, **k: pytest.fail("profiled the variant again"))
    result = run_opprof("optimize", "--results", f"results/{NAME}", "--config", "config.yaml", cwd=work)
    assert result.returncode == 0, result.stderr
    assert "already profiled, kept" in result.stdout


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
