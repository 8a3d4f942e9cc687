"""The optimize workflow for real on a tiny eager workload: profile -> advise -> the advised variant profiled by the
same rules -> verify_variants (real interleaved timing in two processes, numerics) -> optimize/report.html; and a
rule catalog edit that re-runs only the advice and what follows."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import yaml
from workflow_runs import TINY, custom_env, job_counts, snakemake

from operator_profiler.optimize import evidence

NAME = "tiny_mlp"
WORKLOAD = {"kind": "mlp", "compile": False, "width": 32, "expansion": 2, "n_block": 2, "batch_size": 2, "seq_len": 8}
#: 6 measured iterations (TINY has 2): the advisor's rules then read the interquartile range over them (at least 3)
ITERATIONS = 6
CONFIG = {**{k: v for k, v in TINY.items() if k != "workloads"}, "workloads": {NAME: WORKLOAD},
          "harness": {**TINY["harness"], "iterations": ITERATIONS}, "optimize": {"workloads": [NAME]}}


def _catalog(work) -> str:
    """The package's catalog with freeze_weights firing on any weight GEMM share (min 0): a rule fires only when its
    measure clears the threshold in the middle half of the measured iterations (docs/optimize.md), and on 2 cores
    shared with other jobs a tiny MLP's iterations are noise enough for 20% to be borderline; the test is of the
    workflow, which needs a variant to profile and verify."""
    from operator_profiler.optimize.advisor import CATALOG

    text = CATALOG.read_text()
    assert "measure: weight_gemm_share\n  min: 0.2\n" in text
    path = work / "catalog.yaml"
    path.write_text(text.replace("measure: weight_gemm_share\n  min: 0.2\n", "measure: weight_gemm_share\n  min: 0.0\n"))
    return str(path)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    work = tmp_path_factory.mktemp("opt")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "optimize": {**CONFIG["optimize"], "catalog": _catalog(work)}}))
    env = custom_env(work)
    # max_autotune (in the strong baseline) with only ATen's GEMMs: one choice, nothing to benchmark; the test is of
    # the workflow, and a CPU GEMM template's benchmarking takes 10-20 s per process here
    env["TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS"] = "ATEN"
    result = snakemake(work, config, env=env, cores=2)
    assert result.returncode == 0, result.stderr[-4000:]
    return work, config


def _verdict(operators: pd.DataFrame, kernels: pd.DataFrame, members: pd.Series, threshold: float):
    """A rule with ``min: threshold`` over the share of the operators ``members`` selects, decided here from the
    tables (docs/optimize.md, "Across the measured iterations"): the figure (the members' time_share), the
    interquartile range of the members' share of each measured iteration's kernel time (unattributed kernels
    counted in the total), and ``fires``/``outside``/``borderline``."""
    import numpy as np

    names = set(operators.loc[members, "operator"])
    measured = kernels[kernels["iteration"].notna()]
    by_iteration = measured.groupby(measured["iteration"].astype(int))
    shares = [float(group.loc[group["operator"].isin(names), "duration_ns"].sum() / group["duration_ns"].sum())
              for _, group in by_iteration]
    low, high = np.percentile(shares, 25), np.percentile(shares, 75)
    share = float(operators.loc[members, "time_share"].sum())
    if min(share, low) >= threshold:
        return share, "fires"
    return share, ("outside" if max(share, high) < threshold else "borderline")


def _lists(advice: dict, rule: str) -> str:
    return next(where for where in ("advice", "not_offered", "borderline", "not_triggered")
                if any(r["rule"] == rule for r in advice[where]))


@pytest.mark.workflow
def test_advice_quotes_the_profile_and_names_the_variant(optimized):
    work, _ = optimized
    advice = json.loads((work / "results" / NAME / "advice.json").read_text())
    operators = pd.read_parquet(work / "results" / NAME / "operators.parquet")
    kernels = pd.read_parquet(work / "results" / NAME / "attribution" / "kernels.parquet")
    offered = {r["change"]: r for r in advice["advice"]}
    # an inference profile of Linear layers: freezing (and the compile it needs; min 0 in the test's catalog); the
    # GEMM is the aten::addmm, not the aten::linear around it (which only dispatches to it)
    weights = operators[operators["operator"].isin(evidence.WEIGHT_GEMM_OPS - {"aten::linear"})]
    assert "aten::linear" in set(operators["operator"]) and "aten::linear" in offered["freezing"]["evidence"]
    assert offered["freezing"]["value"] == pytest.approx(weights["time_share"].sum())
    assert offered["freezing"]["interval"]["iterations"] == ITERATIONS
    # bf16 autocast comes first where fp32 GEMMs take >= 25 % of the time across the iterations and the CPU
    # computes bf16 natively (avx512_bf16/AMX: then an fp32 matmul is slow beside the rest): decided here
    is_gemm = operators["operator"].str.split("+").map(lambda ops: bool(set(ops) & evidence.GEMM_OPS))
    _, fp32_verdict = _verdict(operators, kernels, is_gemm & (operators["work_dtype"] == "float32"), 0.25)
    native = advice["machine_features"]["native_bf16"]
    bf16 = ["bf16_autocast"] if fp32_verdict == "fires" and native else []
    assert advice["advised_changes"][:len(bf16) + 2] == bf16 + ["compile", "freezing"]
    assert _lists(advice, "bf16_gemms") == {"fires": "advice" if native else "not_offered", "outside": "not_triggered",
                                            "borderline": "borderline"}[fp32_verdict]
    # compile's own rule (short eager calls) fires or not by the measured shares, decided here independently
    short = (~operators["operator"].str.split("+").map(lambda ops: bool(set(ops) & evidence.GEMM_OPS))
             & ~operators["operator"].isin(evidence.RNN_OPS) & (operators["mean_kernel_ns"] < evidence.SHORT_CALL_NS))
    share, verdict = _verdict(operators, kernels, short, 0.15)
    assert _lists(advice, "compile_short_ops") == {"fires": "advice", "outside": "not_triggered",
                                                   "borderline": "borderline"}[verdict]
    (rule,) = [r for where in ("advice", "borderline", "not_triggered") for r in advice[where]
               if r["rule"] == "compile_short_ops"]
    assert rule["value"] == pytest.approx(share)
    if verdict != "fires":
        assert advice["sources"]["compile"] == "needed by freezing (rule freeze_weights)"
    # the capture's machine load is recorded, and a busy capture is a warning (docs/outputs.md machine_load)
    run = json.loads((work / "results" / NAME / "capture" / "run.json").read_text())
    assert advice["machine_load"] == run["machine_load"]
    assert bool(advice["warnings"]) == bool(run["machine_load"]["busy"])
    report = (work / "results" / NAME / "report.md").read_text()
    assert "## Advice" in report and "**freezing** (rule `freeze_weights`)" in report


@pytest.mark.workflow
def test_the_advised_variant_is_profiled_by_the_same_rules(optimized):
    work, _ = optimized
    advice = json.loads((work / "results" / NAME / "advice.json").read_text())
    variant = work / "results" / "+".join([NAME, *advice["advised_changes"]])
    run = json.loads((variant / "capture" / "run.json").read_text())
    assert run["changes"] == advice["advised_changes"] and run["compiled"] is True
    assert run["change_checks"]["freezing"]["prepacked"] >= 2 * WORKLOAD["n_block"]
    coverage = json.loads((variant / "coverage.json").read_text())
    assert coverage["coverage_time"] >= 0.95
    assert (variant / "report.md").is_file() and (variant / "report.html").is_file()


@pytest.mark.workflow
def test_verification_measures_baselines_and_the_ablation_and_the_page_shows_them(optimized):
    work, _ = optimized
    advice = json.loads((work / "results" / NAME / "advice.json").read_text())
    verification = json.loads((work / "results" / NAME / "optimize" / "verification.json").read_text())
    assert verification["repetitions"] >= 20 and verification["processes"] >= 2
    variants = verification["variants"]
    assert {"fp32_eager", "compile_default", "strong_generic"} <= set(variants)
    for name, v in variants.items():
        assert v["rejected"] is None, (name, v["rejected"])
        assert v["numerics"]["ok"], (name, v["numerics"])
        assert v["repetitions"] >= 20 and v["ci_ms"][0] <= v["median_ms"] <= v["ci_ms"][1]
        assert v["faults_per_iteration"]["total"] is not None
    steps = verification["ablation"]["steps"]
    assert [s["change"] for s in steps] == advice["advised_changes"]
    for step in steps:  # kept on an interval above 1, undecided on a median gain, dropped earns nothing
        assert step["decision"] in ("kept", "undecided", "dropped")
        if step["decision"] == "dropped":
            assert step["credit"] is None
        elif step["decision"] == "undecided":
            assert step["credit"]["value"] > 1 >= step["credit"]["ci"][0]
        elif step["credit"] is not None:
            assert step["credit"]["ci"][0] > 1
        measurement = step["measurement"]  # what the decision rests on: >= 20 repetitions of each variant it compared
        assert all(n is None or n >= 20 for n in measurement["repetitions"])
        assert measurement["extra_rounds"] == sum(step["change"] in r["decisions"] for r in verification["refined"])
    more = verification["measure_more"]
    assert more["budget_s"] == 120 and more["stopped"] in ("decided", "budget", "rounds", "rejected")
    assert isinstance(verification["discarded_processes"], list)
    recommended = verification["ablation"]["recommended"]
    strong = set(verification["baselines"]["strong_generic"])
    if recommended["source"] == "strong_generic":
        assert set(recommended["changes"]) == strong
    elif recommended["source"] == "faster_variant":  # the advised set was slower than FP32 eager
        assert recommended["changes"] in [v["changes"] for v in verification["variants"].values()]
        assert recommended["speedup"]["ci"][0] > 1
    else:
        assert set(recommended["changes"]) <= set(advice["advised_changes"]) | {"compile"}
    assert recommended["trail"] and not recommended.get("slower_than_strong_generic")
    page = (work / "results" / NAME / "optimize" / "report.html").read_text()
    assert ">repetitions: without / with it</th>" in page
    for section in ("Advice", "Variants and baselines", "Ablation", "Before and after, per operator",
                    "Coverage of the optimized profile"):
        assert f">{section}</h2>" in page, section
    assert re.search(r'id="variants".*fp32_eager.*strong_generic', page, re.S)
    assert (work / "results" / NAME / "optimize" / "compare.html").is_file()


@pytest.mark.workflow
def test_a_catalog_edit_reruns_only_the_advice_and_what_follows(optimized, tmp_path):
    work, _ = optimized
    from operator_profiler.optimize.advisor import CATALOG

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG.read_text().replace("measure: weight_gemm_share\n  min: 0.2",
                                                   "measure: weight_gemm_share\n  min: 0.99"))
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({**CONFIG, "optimize": {**CONFIG["optimize"], "catalog": str(catalog)}}))
    result = snakemake(work, edited, "-n", env=custom_env(work))
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout)
    assert counts.pop("all") == 1
    # the advice (the base profile's; the variant's own once the checkpoint has re-run), its report, the
    # verification and the page; no capture, nothing of the profile before the advice
    assert set(counts) == {"advise", "report", "verify_variants", "optimize_report"}, counts
    assert 1 <= counts["advise"] <= 2 and counts["verify_variants"] == counts["optimize_report"] == 1, counts
