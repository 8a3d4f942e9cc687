"""int8_dynamic: refused without int8 dot products (VNNI/AMX, features read from an injected cpuinfo), really
quantizing every nn.Linear (modules counted, the quantized operator seen running in the profiler, no fp32 GEMM
left), and its numerics: the int8 tolerance and the top-1 agreement of logits, computed independently here, with a
deliberately wrong variant rejected by the agreement alone (docs/optimize.md, "int8_dynamic" and "Numerics")."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from operator_profiler.capture.workloads import GPT2
from operator_profiler.errors import WorkloadError
from operator_profiler.optimize import advisor, evidence
from operator_profiler.optimize.numerics import (
    DEFAULT_TOLERANCES,
    compare_outputs,
    dtype_changes,
    output_is_logits,
    top1_agreement,
    variant_dtype,
)
from operator_profiler.transforms import changes as ch
from operator_profiler.transforms import vocabulary


def _cpuinfo(tmp_path, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: test CPU\nflags\t\t: fpu sse2 {flags}\n")
    return str(path)


def _features(tmp_path, flags: str) -> dict:
    return ch.machine_features("cpu", _cpuinfo(tmp_path, flags))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).eval()


# ----------------------------------------------------------------------------------------- preconditions


def test_int8_is_refused_without_vnni_or_amx(tmp_path, monkeypatch):
    monkeypatch.delenv(vocabulary.FORCE_INT8_ENV, raising=False)
    avx2 = _features(tmp_path, "avx avx2 fma")
    assert avx2["native_int8"] is False
    problems = ch.precondition_problems(["int8_dynamic"], "cpu", "infer", avx2)
    assert len(problems) == 1 and problems[0].startswith("int8_dynamic needs int8 dot products on cpu, VNNI or AMX")
    assert all(flag in problems[0] for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))
    assert vocabulary.NO_INT8_MEASURED in problems[0]  # the measured reason, not only the rule
    with pytest.raises(WorkloadError, match="int8_dynamic needs int8 dot products"):
        ch.build_variant(_mlp(), (torch.randn(2, 32),), ["int8_dynamic"], "cpu", features=avx2)
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        features = _features(tmp_path, f"avx2 {flag}")
        assert features["native_int8"] is True and flag in features["native_int8_source"]
        assert ch.precondition_problems(["int8_dynamic"], "cpu", "infer", features) == []
    vnni = _features(tmp_path, "avx2 avx512_vnni")
    assert ch.precondition_problems(["int8_dynamic"], "cpu", "train", vnni) == [
        "int8_dynamic needs inference (mode infer): in mode train it would change what is trained"]
    assert ch.precondition_problems(["int8_dynamic"], "cuda", "infer", {"cuda": True}) == [
        "int8_dynamic applies only on cpu, not on cuda"]
    monkeypatch.setenv(vocabulary.FORCE_INT8_ENV, "1")  # measuring it where it is not offered
    forced = _features(tmp_path, "avx avx2")
    assert forced["native_int8"] is True and forced["native_int8_source"].startswith("forced by OPPROF_FORCE_INT8")


def test_int8_precondition_on_this_machine(monkeypatch):
    monkeypatch.delenv(vocabulary.FORCE_INT8_ENV, raising=False)
    flags = vocabulary._cpu_flags() or frozenset()
    features = ch.machine_features("cpu")
    assert features["native_int8"] is bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    if not features["native_int8"]:  # this project's VM: AMD EPYC with AVX2, no VNNI
        with pytest.raises(WorkloadError, match="int8_dynamic needs int8 dot products"):
            ch.build_variant(_mlp(), (torch.randn(2, 32),), ["int8_dynamic"], "cpu")


# ------------------------------------------------------------------------------------------ quantizing


def test_int8_variant_quantizes_every_linear_and_runs_the_int8_operator(tmp_path):
    vnni = _features(tmp_path, "avx2 avx512_vnni")
    model, x = _mlp(), torch.randn(4, 32)
    variant = ch.build_variant(model, (x,), ["int8_dynamic"], "cpu", features=vnni)
    assert variant.name == "int8_dynamic"
    assert ch.quantized_linear_count(variant.model) == 2
    assert not any(type(m) is nn.Linear for m in variant.model.modules())
    assert ch.quantized_linear_count(model) == 0  # the original is untouched
    assert [(r["pass"], r["module_path"], r["new_op"]) for r in variant.rewrites] == [
        ("quantize_dynamic", "0", ch.INT8_LINEAR_OP), ("quantize_dynamic", "2", ch.INT8_LINEAR_OP)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = variant.run()
    names = [e.name for e in prof.events()]
    assert names.count("quantized::linear_dynamic") == 2
    assert not any(n in ("aten::addmm", "aten::linear", "aten::mm") for n in names)
    with torch.no_grad():
        reference = model(x)
    numerics = compare_outputs(reference, out, variant_dtype(variant.changes))
    assert numerics.dtype == "int8" and numerics.ok, numerics.reason
    assert 0 < numerics.max_rel < DEFAULT_TOLERANCES["int8"]["max_rel"]  # int8 rounding shows, within bounds


def test_int8_gpt2_quantizes_its_projections_and_lm_head_under_compile(tmp_path):
    vnni = _features(tmp_path, "avx2 avx512_vnni")
    torch.manual_seed(0)
    model = GPT2(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4).eval()
    idx = torch.randint(0, 64, (2, 8))
    variant = ch.build_variant(model, (idx,), ["compile", "int8_dynamic"], "cpu", features=vnni)
    assert ch.quantized_linear_count(variant.model) == 2 * 4 + 1  # c_attn, c_proj, c_fc, c_proj per block; lm_head
    assert {r["module_path"] for r in variant.rewrites} >= {"lm_head", "transformer.h.0.attn.c_attn"}
    assert variant.run().shape == (2, 8, 64)


def test_int8_quantizes_a_hugging_face_gpt2s_conv1d_projections_not_only_its_lm_head(tmp_path):
    transformers = pytest.importorskip("transformers")
    vnni = _features(tmp_path, "avx2 avx512_vnni")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(config).eval()
    conv1d = [p for p, m in model.named_modules() if type(m).__name__ == "Conv1D"]
    assert len(conv1d) == 2 * 4  # c_attn, attn.c_proj, c_fc, mlp.c_proj per block
    idx = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        before = model(idx).logits
        converted = ch.transposed_linears_to_linear(model)
        after = model(idx).logits
    assert converted == set(conv1d)
    assert torch.allclose(before, after, rtol=1e-5, atol=1e-6)  # the Linear computes what the Conv1D did
    model = transformers.GPT2LMHeadModel(config).eval()
    variant = ch.build_variant(model, (idx,), ["int8_dynamic"], "cpu", features=vnni)
    assert ch.quantized_linear_count(variant.model) == 2 * 4 + 1
    replaced = {r["module_path"]: r["replaced_ops"] for r in variant.rewrites}
    assert replaced["transformer.h.1.mlp.c_fc"] == ["aten::addmm"] and replaced["lm_head"] == ["aten::linear"]


def test_int8_needs_a_linear_layer(tmp_path):
    vnni = _features(tmp_path, "avx2 avx512_vnni")
    with pytest.raises(WorkloadError, match="no nn.Linear"):
        ch.build_variant(nn.Sequential(nn.ReLU()), (torch.randn(2, 3),), ["int8_dynamic"], "cpu", features=vnni)


# ------------------------------------------------------------------------------------------ numerics


def test_int8_variant_dtype_and_its_in_dtype_comparison():
    assert variant_dtype(["compile", "int8_dynamic"]) == "int8"
    assert dtype_changes(["compile", "int8_dynamic"]) == ["int8_dynamic"]  # judged against eager int8 too
    assert DEFAULT_TOLERANCES["int8"]["min_top1_agreement"] == 0.99


def _agreement_by_hand(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    rows_ref = reference.reshape(-1, reference.shape[-1]).tolist()
    rows_cand = candidate.reshape(-1, candidate.shape[-1]).tolist()
    same = sum(1 for r, c in zip(rows_ref, rows_cand) if r.index(max(r)) == c.index(max(c)))
    return same / len(rows_ref)


def test_top1_agreement_of_a_tiny_lm_and_its_int8_variant(tmp_path):
    vnni = _features(tmp_path, "avx2 avx512_vnni")
    torch.manual_seed(0)
    model = GPT2(vocab_size=50, n_positions=32, n_embd=32, n_layer=1, n_head=2).eval()
    idx = torch.randint(0, 50, (4, 16))
    with torch.no_grad():
        reference = model(idx)
    variant = ch.build_variant(model, (idx,), ["int8_dynamic"], "cpu", features=vnni)
    out = variant.run()
    agreement, positions = top1_agreement(reference, out)
    assert positions == 4 * 16
    assert agreement == pytest.approx(_agreement_by_hand(reference, out))
    result = compare_outputs(reference, out, "int8", logits=True)
    assert result.top1_agreement == pytest.approx(agreement) and result.top1_positions == 64
    assert result.min_top1_agreement == 0.99
    assert result.as_dict()["top1_agreement"] == result.top1_agreement
    assert result.ok is (agreement >= 0.99 and result.max_rel <= 0.1 and result.cosine >= 0.999)


def test_a_wrong_variant_within_max_rel_and_cosine_is_rejected_by_its_top1_agreement():
    torch.manual_seed(0)
    reference = torch.randn(2, 50, 10)
    top2 = reference.topk(2, dim=-1).indices
    wrong = reference.clone()
    # in 3 of the 100 positions the two largest logits lay 0.01 apart and swap places in the candidate: a tiny move
    # that max_rel and the cosine let through, and a wrong top-1 token at each
    flips = [(0, 3), (1, 7), (1, 42)]
    for b, t in flips:
        first, second = top2[b, t]
        reference[b, t, second] = reference[b, t, first] - 0.01
        wrong[b, t, first], wrong[b, t, second] = reference[b, t, first] - 0.01, reference[b, t, first]
    plain = compare_outputs(reference, wrong, "int8")  # not logits: max_rel and cosine alone
    assert plain.ok and plain.top1_agreement is None and plain.max_rel < 0.01
    judged = compare_outputs(reference, wrong, "int8", logits=True)
    assert judged.top1_agreement == pytest.approx(0.97) == _agreement_by_hand(reference, wrong)
    assert not judged.ok and judged.reason == (
        "top-1 agreement of the logits 97.00% (100 positions) below the int8 tolerance 99.00%")
    # the same candidate at a looser bound passes: the bound is the tolerance's
    loose = {**DEFAULT_TOLERANCES, "int8": {**DEFAULT_TOLERANCES["int8"], "min_top1_agreement": 0.95}}
    assert compare_outputs(reference, wrong, "int8", loose, logits=True).ok
    # another dtype states the agreement and requires it only when its tolerance says so
    stated = compare_outputs(reference, wrong, "bfloat16", logits=True)
    assert stated.ok and stated.top1_agreement == pytest.approx(0.97) and stated.min_top1_agreement is None
    strict = {**DEFAULT_TOLERANCES, "bfloat16": {**DEFAULT_TOLERANCES["bfloat16"], "min_top1_agreement": 0.99}}
    assert compare_outputs(reference, wrong, "bfloat16", strict, logits=True).reason.startswith(
        "top-1 agreement of the logits 97.00% (100 positions) below the bfloat16 tolerance 99.00%")


def test_which_outputs_are_logits():
    logits = torch.zeros(1, 2, 3)
    assert output_is_logits({"kind": "gpt2"}, logits)
    assert not output_is_logits({"kind": "mlp"}, logits)
    assert output_is_logits({"kind": "transformers"}, {"logits": logits, "hidden": logits})
    assert top1_agreement({"hidden": torch.zeros(1, 3), "logits": torch.eye(3)},
                          {"hidden": torch.ones(1, 3), "logits": torch.eye(3)}) == (1.0, 3)


# ------------------------------------------------------------------------------------ catalog and advice


def test_the_catalog_offers_int8_only_with_vnni():
    rules = {r.id: r for r in advisor.load_catalog()}
    assert rules["int8_linears"].change == "int8_dynamic"
    assert "fp32_linear_share" in evidence.MEASURES
    import pandas as pd

    ops = pd.DataFrame([
        {"operator": "aten::addmm", "time_ns": 6_000_000, "work_dtype": "float32"},
        {"operator": "aten::convolution", "time_ns": 2_000_000, "work_dtype": "float32"},
        {"operator": "aten::gelu", "time_ns": 2_000_000, "work_dtype": "float32"}])
    ops["time_share"] = ops["time_ns"] / ops["time_ns"].sum()
    ops["kernels"] = 30
    ops["mean_kernel_ns"] = ops["time_ns"] / 30
    for column in ("ceiling_fraction", "ceiling", "bound"):
        ops[column] = None
    kernels = pd.DataFrame([{"kernel_id": i, "operator": r["operator"], "module": "h.0", "duration_ns": r["time_ns"]}
                            for i, r in ops.iterrows()])
    run = {"compiled": True, "mode": "inference", "versions": {"device": "cpu"}}
    coverage = {"iteration_time_ns": {str(i): 1_000_000 for i in range(10)}}
    profile = evidence.Profile(ops, kernels, run, coverage)
    assert evidence.fp32_linear_share(profile).value == pytest.approx(0.6)  # the convolution is not a linear
    with_vnni = {"device": "cpu", "native_bf16": False, "native_int8": True,
                 "native_int8_source": "/proc/cpuinfo flags: avx512_vnni"}
    advice = advisor.advise(profile, advisor.load_catalog(), with_vnni, "m")
    # after compile and freezing: the ablation's cumulative step measures int8 on top of the FP32 variant
    advised = advice["advised_changes"]
    assert advised.index("int8_dynamic") > advised.index("freezing") > advised.index("compile")
    without = {"device": "cpu", "native_bf16": False, "native_int8": False,
               "native_int8_source": "/proc/cpuinfo has none of avx512_vnni, avx_vnni, amx_int8"}
    advice = advisor.advise(profile, advisor.load_catalog(), without, "m")
    assert "int8_dynamic" not in advice["advised_changes"]
    (refused,) = [r for r in advice["not_offered"] if r["change"] == "int8_dynamic"]
    assert "VNNI or AMX" in refused["reason"] and vocabulary.NO_INT8_MEASURED in refused["reason"]


# ------------------------------------------------------------------------------------------ timing worker

TINY_GPT2 = {"kind": "gpt2", "compile": False, "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64,
             "n_positions": 32, "batch_size": 4, "seq_len": 16}


def test_the_timing_worker_states_the_top1_agreement_and_rejects_a_wrong_int8_variant(tmp_path, monkeypatch):
    import os
    from pathlib import Path

    from operator_profiler.optimize import timing

    tests = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(vocabulary.FORCE_INT8_ENV, "1")  # int8 builds on this CPU without VNNI, to be judged
    spec = {"workload": TINY_GPT2, "workload_name": "tiny_gpt2", "threads": 1, "repetitions": 4, "processes": 2,
            "min_repetition_s": 0.01, "warmup": {"minimum": 2, "maximum": 6, "window": 2, "tolerance": 0.5},
            "busy_remeasure": 0,  # (process numbers are asserted: under load a busy one's replacement is another)
            "variants": {"fp32_eager": [], "int8_dynamic": ["int8_dynamic"],
                         "wrong": ["int8_dynamic", "flip_top1"]}}
    result = timing.measure(spec, build="int8_doubles:build", numerics="operator_profiler.optimize.numerics",
                            work_dir=tmp_path)
    got = result["variants"]
    eager = got["fp32_eager"]["numerics"]
    assert eager["top1_agreement"] == 1.0 and eager["top1_positions"] == 4 * 16
    assert eager["min_top1_agreement"] is None  # stated, not required, at float32
    int8 = got["int8_dynamic"]["numerics"]
    assert int8["dtype"] == "int8" and int8["min_top1_agreement"] == 0.99 and int8["top1_positions"] == 64
    assert (got["int8_dynamic"]["rejected"] is None) is (int8["top1_agreement"] >= 0.99 and int8["ok"])
    wrong = got["wrong"]
    # 6 of the 64 positions (the closest calls) flipped by the double, on top of what int8 flipped itself
    assert wrong["numerics"]["top1_agreement"] < 0.99
    assert wrong["numerics"]["max_rel"] <= 0.1 and wrong["numerics"]["cosine"] >= 0.999  # within the int8 tolerance
    assert wrong["rejected"].startswith("process 0: numerics: top-1 agreement of the logits ")
    assert "below the int8 tolerance 99.00%" in wrong["rejected"]


def test_the_optimize_page_states_the_top1_agreement_per_variant():
    from operator_profiler.report import optimize_page

    numerics = {"max_rel": 0.026, "cosine": 0.99964, "ok": False, "dtype": "int8", "top1_agreement": 0.948,
                "top1_positions": 128, "min_top1_agreement": 0.99,
                "reason": "top-1 agreement of the logits 94.80% (128 positions) below the int8 tolerance 99.00%"}
    rows = optimize_page._variant_rows({
        "int8_dynamic": {"changes": ["int8_dynamic"], "numerics": numerics, "rejected": None},
        "fp32_eager": {"changes": [], "numerics": {"max_rel": 0.0, "cosine": 1.0, "ok": True, "top1_agreement": 1.0,
                                                   "top1_positions": 128, "min_top1_agreement": None}}}, None)
    assert "top-1 agreement 94.80% of 128 positions (at least 99% required)" in rows[0]
    assert "top-1 agreement 100.00% of 128 positions</td>" in rows[1]


# ------------------------------------------------------------------------------------------ capture harness


def test_the_harness_refuses_int8_here_or_profiles_the_quantized_operators(tmp_path, monkeypatch):
    from test_optimize_capture import TINY_GPT2 as GPT2_SLICE
    from test_optimize_capture import _capture

    monkeypatch.delenv(vocabulary.FORCE_INT8_ENV, raising=False)
    if not ch.machine_features("cpu")["native_int8"]:  # this VM: refused before anything runs, with the reason
        with pytest.raises(WorkloadError) as info:
            _capture(tmp_path / "refused", {**GPT2_SLICE, "changes": ["int8_dynamic"]}, "gpt2+int8_dynamic")
        assert "gpt2+int8_dynamic" in str(info.value) and "avx512_vnni" in str(info.value)
        assert not (tmp_path / "refused" / "run.json").exists()
        monkeypatch.setenv(vocabulary.FORCE_INT8_ENV, "1")
    (tmp_path / "forced").mkdir()
    run, timeline = _capture(tmp_path / "forced", {**GPT2_SLICE, "changes": ["int8_dynamic"]}, "gpt2+int8_dynamic")
    assert run["changes"] == ["int8_dynamic"]
    # what the int8 precondition was read from, in the capture's run.json (forced on a CPU without VNNI/AMX)
    assert run["change_checks"]["int8_dynamic"] == {
        "native_int8": True, "native_int8_source": ch.machine_features("cpu")["native_int8_source"]}
    if os.environ.get(vocabulary.FORCE_INT8_ENV):
        assert run["change_checks"]["int8_dynamic"]["native_int8_source"].startswith("forced by OPPROF_FORCE_INT8=1")
    quantized = [r for r in run["rewrites"] if r["pass"] == "quantize_dynamic"]
    assert len(quantized) == 4 * GPT2_SLICE["n_layer"] + 1
    names = set(timeline.ranges["name"])
    assert ch.INT8_LINEAR_OP in names and not names & {"aten::addmm", "aten::linear"}


def test_a_freezing_variant_recompiled_after_an_int8_variant_ran_in_the_same_process_is_frozen(monkeypatch):
    # Variants share Dynamo's cache per code object: once the int8 variant (a graph break at each quantized Linear)
    # has run, the compile+freezing variant's next call compiles another graph; it too must be frozen.
    import torch

    from operator_profiler.capture import workloads
    from operator_profiler.transforms.changes import build_variant

    monkeypatch.setenv(vocabulary.FORCE_INT8_ENV, "1")
    model, inputs = workloads.build_workload({**TINY_GPT2, "batch_size": 1}, torch.device("cpu"))
    frozen = build_variant(model, inputs, ["compile", "freezing"], "cpu")
    int8 = build_variant(model, inputs, ["compile", "freezing", "int8_dynamic"], "cpu")
    frozen.warm_up(1)
    assert len(frozen.backend.graphs) == 1
    int8.warm_up(1)
    for _ in range(2):
        frozen.run()
        int8.run()
    assert torch.is_grad_enabled() and torch._inductor.config.freezing is False  # nothing leaks out of the calls
    assert len(frozen.backend.graphs) == 2  # the recompile during the repetitions
    assert [g["freezing_on"] for g in frozen.backend.graphs] == [True, True]
    assert [g["param_inputs"] for g in frozen.backend.graphs] == [0, 0]
    assert frozen.checks["freezing"]["graphs"] == 2 and frozen.checks["freezing"]["frozen"] == 2
    assert int8.checks["freezing"]["frozen"] == len(int8.backend.graphs) >= 2


def test_the_optimize_page_prints_the_required_agreement_and_an_agreement_just_below_it_apart():
    from operator_profiler.report import optimize_page

    numerics = {"max_rel": 0.02, "cosine": 0.9999, "ok": False, "dtype": "int8", "top1_agreement": 0.99497,
                "top1_positions": 20000, "min_top1_agreement": 0.995}
    (row,) = optimize_page._variant_rows({"int8_dynamic": {"changes": ["int8_dynamic"], "numerics": numerics,
                                                          "rejected": None}}, None)
    assert "top-1 agreement 99.497% of 20000 positions (at least 99.5% required)" in row


def test_forcing_int8_takes_the_usual_spellings_and_refuses_any_other(tmp_path, monkeypatch):
    from operator_profiler.errors import WorkloadError

    flags = "fpu sse avx2"  # no VNNI, no AMX
    for value in ("1", "true", "YES", " on "):
        monkeypatch.setenv(vocabulary.FORCE_INT8_ENV, value)
        got = _features(tmp_path, flags)
        assert vocabulary.force_int8() is True and got["native_int8"] is True
        assert got["native_int8_source"].startswith(f"forced by OPPROF_FORCE_INT8={value} (")
    for value in ("", "0", "false", "No", "off"):
        monkeypatch.setenv(vocabulary.FORCE_INT8_ENV, value)
        assert vocabulary.force_int8() is False and _features(tmp_path, flags)["native_int8"] is False
    monkeypatch.setenv(vocabulary.FORCE_INT8_ENV, "2")
    with pytest.raises(WorkloadError) as info:
        _features(tmp_path, flags)
    assert str(info.value).startswith("OPPROF_FORCE_INT8='2': set it to 1") and "\n" not in str(info.value)


def test_the_optimize_page_says_int8_was_forced():
    from operator_profiler.report import optimize_page

    source = "forced by OPPROF_FORCE_INT8=1 (/proc/cpuinfo has none of avx512_vnni, avx_vnni, amx_int8)"
    record = {"variants": {"compile+int8_dynamic": {"changes": ["compile", "int8_dynamic"]}},
              "machine_features": {"native_int8": True, "native_int8_source": source}}
    assert optimize_page._int8_html(record) == (
        f'<p class="warning"><strong>int8_dynamic was measured where it is not offered: {source}.</strong> Its '
        "speed here says little about a CPU with int8 dot products.</p>")
    assert optimize_page._int8_html({**record, "variants": {"compile": {"changes": ["compile"]}}}) == ""


def test_the_verification_refuses_an_advice_made_with_int8_forced_once_it_no_longer_is(tmp_path):
    from operator_profiler.errors import WorkloadError
    from operator_profiler.optimize import verify

    forced = "forced by OPPROF_FORCE_INT8=1 (/proc/cpuinfo has none of avx512_vnni, avx_vnni, amx_int8)"
    advice = {"advised_changes": ["int8_dynamic"], "advice": [],
              "machine_features": {"native_int8": True, "native_int8_source": forced}}
    now = {"native_bf16": False, "native_int8": False,
           "native_int8_source": "/proc/cpuinfo has none of avx512_vnni, avx_vnni, amx_int8"}
    with pytest.raises(WorkloadError) as info:
        verify.verify("g", {"kind": "gpt2"}, {"repetitions": 2, "processes": 1}, "cpu", advice, tmp_path,
                      features=now)
    assert str(info.value).startswith(f"g: the advice was made with int8 {forced!r}, the verification runs with")
    assert "snakemake --forcerun advise" in str(info.value)
