"""A workload's ``changes`` in the real capture harness (torch.profiler on the CPU, real torch.compile): the FX
rewrite shows in the trace and in run.json's records, freezing is checked after warm-up, preconditions are refused
before anything runs; variant workload names and their config slices."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from conftest import torch_flags_kept

from operator_profiler.capture import harness
from operator_profiler.config import ConfigError, validate_config
from operator_profiler.errors import WorkloadError
from operator_profiler.transforms import variants, vocabulary
from operator_profiler.timeline import kineto

HARNESS = {"seed": 0, "warmup": 2, "warmup_max": 2, "iterations": 2}
TINY_GPT2 = {"kind": "gpt2", "compile": False, "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64,
             "n_positions": 32, "batch_size": 1, "seq_len": 16}
TINY_MLP = {"kind": "mlp", "compile": True, "width": 32, "expansion": 2, "n_block": 2, "batch_size": 2, "seq_len": 8}


@contextlib.contextmanager
def compiler_settings_kept():
    """The harness sets Inductor freezing and Dynamo's allow_rnn process-wide (a capture is its own process):
    restored here, with Dynamo's caches, for the tests after it."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    saved = inductor_config.freezing, dynamo_config.allow_rnn
    try:
        with torch_flags_kept():
            yield
    finally:
        inductor_config.freezing, dynamo_config.allow_rnn = saved
        torch._dynamo.reset()


def _capture(tmp_path, workload: dict, name: str) -> tuple[dict, kineto.Timeline]:
    full = validate_config({"workloads": {"w": workload}})["workloads"]["w"]
    with compiler_settings_kept():
        run = harness.run_capture(full, HARNESS, "cpu", tmp_path / "trace.json.gz", tmp_path / "layers.json",
                                  tmp_path / "run.json", inductor_dir=tmp_path / "inductor" if full["compile"] else None,
                                  workload_name=name)
    return run, kineto.read_kineto(tmp_path / "trace.json.gz")


def test_sdpa_rewrite_of_an_eager_gpt2_runs_fused_attention_and_records_what_it_replaced(tmp_path):
    run, timeline = _capture(tmp_path, {**TINY_GPT2, "changes": ["sdpa_rewrite"]}, "gpt2+sdpa_rewrite")
    assert run["changes"] == ["sdpa_rewrite"] and run["compiled"] is False
    rewrites = [r for r in run["rewrites"] if r["pass"] == "attention_to_sdpa" and not r.get("skipped")]
    assert len(rewrites) == TINY_GPT2["n_layer"]
    assert {r["module_path"] for r in rewrites} == {f"transformer.h.{i}.attn" for i in range(TINY_GPT2["n_layer"])}
    names = set(timeline.ranges["name"])
    # the measured iterations run the fused attention op and no softmax any more
    assert "aten::scaled_dot_product_attention" in names
    assert not names & {"aten::softmax", "aten::_softmax", "aten::masked_fill"}
    assert run["layer_ranges"] is False


def test_freezing_of_a_compiled_mlp_is_checked_and_prepacks_every_linear(tmp_path):
    run, timeline = _capture(tmp_path, {**TINY_MLP, "changes": ["freezing"]}, "mlp+freezing")
    linears = 2 * TINY_MLP["n_block"]
    assert run["compiled"] is True and run["change_checks"]["freezing"]["prepacked"] >= linears
    assert run["compile_backend"].startswith("transforms.changes.RewriteBackend")
    names = set(timeline.ranges["name"])
    # prepacked weights: the GEMMs run as MKL/oneDNN linear calls, not aten::addmm
    assert names & {"mkl::_mkl_linear", "mkldnn::_linear_pointwise"}
    assert "aten::addmm" not in names


@pytest.mark.skipif(vocabulary.machine_features("cpu")["native_bf16"], reason="this CPU computes bf16 natively")
def test_bf16_autocast_is_refused_before_anything_runs_on_a_cpu_without_native_bf16(tmp_path):
    with pytest.raises(WorkloadError) as info:
        _capture(tmp_path, {**TINY_GPT2, "changes": ["bf16_autocast"]}, "gpt2+bf16_autocast")
    assert "gpt2+bf16_autocast" in str(info.value) and "avx512_bf16" in str(info.value)
    assert not (tmp_path / "run.json").exists()


def test_variant_names_and_config_slices():
    base = {"kind": "lstm", "compile": False, "hidden_size": 8}
    assert variants.variant_name("lstm", ["compile", "keep_rnn_library"]) == "lstm+compile+keep_rnn_library"
    assert variants.split_name("lstm+compile+keep_rnn_library") == ("lstm", ["compile", "keep_rnn_library"])
    slice_ = variants.variant_workload(base, ["keep_rnn_library"])
    assert slice_ == {**base, "compile": True, "changes": ["keep_rnn_library"]}
    assert variants.variant_workload(base, []) == base
    # every change that needs torch.compile is a compiler change of the variant (the workflow compiles it)
    assert set(variants.COMPILER_CHANGES) == {c for c, spec in vocabulary.CHANGES.items()
                                              if "compile" in spec.needs} | {"compile"}


def test_config_refuses_compiler_changes_on_an_eager_workload_and_unknown_optimize_workloads():
    with pytest.raises(ConfigError, match=r"workloads.m.changes': freezing needs torch.compile"):
        validate_config({"workloads": {"m": {"kind": "mlp", "compile": False, "changes": ["freezing"]}}})
    with pytest.raises(ConfigError, match="relu_instead"):
        validate_config({"workloads": {"m": {"kind": "mlp", "changes": ["relu_instead"]}}})
    with pytest.raises(ConfigError, match=r"optimize.workloads\[0\]': 'gtp2' is not a workload"):
        validate_config({"workloads": {"gpt2": {"kind": "gpt2"}}, "optimize": {"workloads": ["gtp2"]}})
    with pytest.raises(ConfigError, match="repetitions"):
        validate_config({"workloads": {"gpt2": {"kind": "gpt2"}}, "optimize": {"repetitions": 5}})
    config = validate_config({"workloads": {"gpt2": {"kind": "gpt2"}}})
    assert config["optimize"] == {"workloads": [], "catalog": None, "repetitions": 20, "processes": 2,
                                  "decision_budget_s": 120,
                                  "tolerances": {}}
    assert json.dumps(config)  # plain JSON (the verify rule's params)


def test_the_advised_variant_is_named_in_the_order_the_verification_names_it():
    from operator_profiler.optimize import ablation

    advised = ["compile", "freezing", "int8_dynamic", "sdpa_rewrite"]  # the advisor's order
    name, new = variants.advised_variant("g", {"kind": "gpt2"}, advised)
    assert name == "g+compile+freezing+sdpa_rewrite+int8_dynamic"
    assert new == ["compile", "freezing", "sdpa_rewrite", "int8_dynamic"]
    assert name == "g+" + ablation.variant_name(advised)
    # the workload's own changes and compile are not repeated
    assert variants.advised_variant("gq", {"kind": "gpt2", "compile": True, "changes": ["int8_dynamic"]},
                                    ["int8_dynamic", "freezing", "compile", "sdpa_rewrite"]) == \
        ("gq+freezing+sdpa_rewrite", ["freezing", "sdpa_rewrite"])
