"""Hugging Face transformers models as workloads (``kind: transformers``: capture/hf.py;
docs/config.md#hugging-face-transformers): built from their configs with no download, their inputs, their layers found without a per-model
table, the config's one-line refusals, the rewrites on their modules, and the tiny configs of all five families
(GPT-2, Llama, BERT, ViT, ResNet) through the real workflow, once, against figures computed here independently
(FlopCounterMode on the same model, parameter counts from the architectures' formulas).

Needs the ``transformers`` extra (``pip install -e '.[transformers]'``): skipped without it, except in CI (``CI``
set), where its absence fails the run.
"""

from __future__ import annotations

import json
import os
import socket

import pandas as pd
import pytest
import torch
import yaml
from workflow_runs import ITERATIONS, ROOT, TINY_HF, TINY_HF_MODELS, TINY_HF_VARIANTS, custom_env, snakemake

from operator_profiler.capture import workloads
from operator_profiler.config import ConfigError, validate_config
from operator_profiler.errors import WorkloadError

if not __import__("importlib").util.find_spec("transformers"):
    if os.environ.get("CI"):
        pytest.fail("transformers is not installed in a CI run (pip install -e '.[test,transformers]')",
                    pytrace=False)
    pytest.skip("transformers is not installed (pip install -e '.[transformers]')", allow_module_level=True)


def _workload(name: str, **changes) -> dict:
    return validate_config({"workloads": {name: {**TINY_HF_MODELS[name], **changes}}}, "test")["workloads"][name]


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: the models are built from their configs, nothing is downloaded."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# ------------------------------------------------------------------------------------------------- building


def _gpt2_parameters(v: int, p: int, e: int, n: int) -> int:
    """GPT-2's parameter count (tied LM head): token and position embeddings, per block two layer norms, the
    fused qkv and output projections, the 4x MLP; the final layer norm."""
    block = 2 * 2 * e + (e * 3 * e + 3 * e) + (e * e + e) + (e * 4 * e + 4 * e) + (4 * e * e + e)
    return v * e + p * e + n * block + 2 * e


def test_each_family_is_built_from_its_config_with_inputs_from_the_config(no_network):
    expected = {"hf_gpt2": "GPT2LMHeadModel", "hf_llama": "LlamaForCausalLM", "hf_bert": "BertForMaskedLM",
                "hf_vit": "ViTForImageClassification", "hf_resnet": "ResNetForImageClassification"}
    for name, cls in expected.items():
        torch.manual_seed(0)
        model, inputs = workloads.build_workload(_workload(name), torch.device("cpu"))
        assert type(model).__name__ == cls
        names = model.opprof_input_names
        if name in ("hf_vit", "hf_resnet"):
            assert names == ("pixel_values",) and inputs[0].shape == (1, 3, 32, 32)
        else:
            vocab = TINY_HF_MODELS[name]["config"]["vocab_size"]
            assert names == ("input_ids", "attention_mask")
            assert inputs[0].shape == (1, 16) and 0 <= int(inputs[0].min()) and int(inputs[0].max()) < vocab
            assert bool((inputs[1] == 1).all())
        with torch.no_grad():
            out = model(*inputs)  # the positional call the harness makes
        assert "logits" in out and "past_key_values" not in out  # use_cache off: one forward builds no cache
    gpt2, _ = workloads.build_workload(_workload("hf_gpt2"), torch.device("cpu"))
    cfg = TINY_HF_MODELS["hf_gpt2"]["config"]
    unique = {id(p): p.numel() for p in gpt2.parameters()}  # the tied LM head counted once
    assert sum(unique.values()) == _gpt2_parameters(cfg["vocab_size"], cfg["n_positions"], cfg["n_embd"], cfg["n_layer"])
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight


#: Families beyond the five, as a user would name them (tiny widths): encoder-decoders, decoders with GQA, rotary
#: or parallel attention, encoders, hierarchical vision models. DeiT's image-classification task maps to two classes
#: (with and without the distillation teacher): transformers picked by config.architectures and failed on None.
OTHER_FAMILIES = {
    "t5": ("seq2seq-lm", {"num_layers": 2, "num_decoder_layers": 2, "d_model": 32, "d_ff": 64, "num_heads": 2,
                          "d_kv": 16, "vocab_size": 128}, "T5ForConditionalGeneration", 3),
    "bart": ("seq2seq-lm", {"encoder_layers": 2, "decoder_layers": 2, "d_model": 32, "encoder_ffn_dim": 64,
                            "decoder_ffn_dim": 64, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                            "vocab_size": 128, "max_position_embeddings": 64}, "BartForConditionalGeneration", 3),
    "mistral": ("causal-lm", {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128},
                "MistralForCausalLM", 2),
    "gpt_neox": ("causal-lm", {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
                               "num_attention_heads": 2, "vocab_size": 128}, "GPTNeoXForCausalLM", 2),
    "distilbert": ("masked-lm", {"n_layers": 2, "dim": 32, "hidden_dim": 64, "n_heads": 2, "vocab_size": 128},
                   "DistilBertForMaskedLM", 2),
    "convnext": ("image-classification", {"depths": [1, 2], "hidden_sizes": [8, 16], "num_stages": 2},
                 "ConvNextForImageClassification", 1),
    "deit": ("image-classification", {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                                      "intermediate_size": 64, "image_size": 32, "patch_size": 8},
             "DeiTForImageClassification", 1),
}


@pytest.mark.parametrize("model_type", sorted(OTHER_FAMILIES))
def test_other_families_build_and_run_from_their_config(model_type, no_network):
    task, config, cls, n_inputs = OTHER_FAMILIES[model_type]
    workload = {"kind": "transformers", "model_type": model_type, "task": task, "config": config, "seq_len": 16}
    if task == "image-classification":
        workload = {**{k: v for k, v in workload.items() if k != "seq_len"}, "image_size": 32}
    workload = validate_config({"workloads": {model_type: workload}}, "test")["workloads"][model_type]
    torch.manual_seed(0)
    model, inputs = workloads.build_workload(workload, torch.device("cpu"))
    assert type(model).__name__ == cls and len(inputs) == n_inputs
    with torch.no_grad():
        out = model.eval()(*inputs)
    assert out["logits"].shape[0] == 1 and torch.isfinite(out["logits"]).all()


def test_the_same_seed_builds_the_same_weights_and_inputs():
    def build():
        torch.manual_seed(3)
        return workloads.build_workload(_workload("hf_llama"), torch.device("cpu"))

    (a, ia), (b, ib) = build(), build()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert all(torch.equal(x, y) for x, y in zip(ia, ib))


@pytest.mark.parametrize("name, loss_of", [
    ("hf_gpt2", "causal"), ("hf_bert", "masked"), ("hf_vit", "classes"), ("hf_resnet", "classes")])
def test_train_mode_passes_labels_and_the_model_computes_its_own_loss(name, loss_of):
    torch.manual_seed(0)
    model, inputs = workloads.build_workload(_workload(name, mode="train"), torch.device("cpu"))
    assert model.opprof_input_names[-1] == "labels"
    labels = inputs[-1]
    out = model(*inputs)
    logits = out.logits.float()
    if loss_of == "causal":  # next-token loss: logits at t predict the label at t + 1
        expected = torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:])
    elif loss_of == "masked":
        expected = torch.nn.functional.cross_entropy(logits[0], labels[0])
    else:
        expected = torch.nn.functional.cross_entropy(logits, labels)
    torch.testing.assert_close(out.loss, expected)
    assert out.loss.requires_grad


def test_a_local_checkpoint_folder_is_loaded_with_its_weights(tmp_path, no_network):
    torch.manual_seed(0)
    saved, _ = workloads.build_workload(_workload("hf_gpt2"), torch.device("cpu"))
    type(saved).__bases__[0].save_pretrained(saved, tmp_path / "mine")  # the HF class's own save_pretrained
    cfg = validate_config({"workloads": {"mine": {"kind": "transformers", "path": str(tmp_path / "mine"),
                                                  "task": "causal-lm", "seq_len": 16}}}, "test")["workloads"]["mine"]
    torch.manual_seed(1)  # another seed: the weights must come from the folder
    loaded, inputs = workloads.build_workload(cfg, torch.device("cpu"))
    assert type(loaded).__name__ == "GPT2LMHeadModel"
    for (key, a), b in zip(saved.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), key


def test_a_typo_in_the_overrides_of_a_local_checkpoint_is_refused(tmp_path, no_network):
    """With ``path`` the overrides went to AutoConfig.from_pretrained, which keeps any keyword: ``n_layrs`` was
    accepted silently (a QA user's finding), unlike with model_type."""
    torch.manual_seed(0)
    saved, _ = workloads.build_workload(_workload("hf_gpt2"), torch.device("cpu"))
    type(saved).__bases__[0].save_pretrained(saved, tmp_path / "mine")
    cfg = validate_config({"workloads": {"mine": {"kind": "transformers", "path": str(tmp_path / "mine"),
                                                  "config": {"n_layrs": 1}, "seq_len": 16}}}, "test")
    with pytest.raises(WorkloadError) as err:
        workloads.build_workload(cfg["workloads"]["mine"], torch.device("cpu"))
    assert "['n_layrs'] are not attributes of GPT2Config (did you mean 'n_layer'?)" in str(err.value)


def test_overrides_that_contradict_each_other_are_a_user_error_in_one_line(no_network):
    """Whisper with a vocabulary of 128 keeps its default pad_token_id 50257: its embedding asserts "Padding_idx must
    be within num_embeddings", which reached the user as an internal error with a traceback."""
    cfg = validate_config({"workloads": {"w": {"kind": "transformers", "model_type": "whisper", "task": "base",
                                               "config": {"vocab_size": 128, "d_model": 32, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                                                          "encoder_layers": 1, "decoder_layers": 1}}}}, "test")
    with pytest.raises(WorkloadError) as err:
        workloads.build_workload(cfg["workloads"]["w"], torch.device("cpu"))
    text = str(err.value)
    assert "transformers cannot build it from this config: AssertionError: Padding_idx" in text
    assert "\n" not in text


def test_a_multimodal_model_is_refused_in_one_line(no_network):
    """CLIP's main input is input_ids, so it passed the main-input check and then ran without pixel values: a
    traceback from inside transformers during the warm-up (a QA user's finding)."""
    tiny = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    cfg = validate_config({"workloads": {"w": {"kind": "transformers", "model_type": "clip", "task": "base",
                                               "config": {"text_config": tiny, "vision_config": {
                                                   **tiny, "image_size": 32, "patch_size": 8}}}}}, "test")
    with pytest.raises(WorkloadError) as err:
        workloads.build_workload(cfg["workloads"]["w"], torch.device("cpu"))
    assert "clip: a multimodal model (its config has vision_config)" in str(err.value)
    assert "kind: custom" in str(err.value)


# ------------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("workload, words", [
    ({"kind": "transformers", "path": "openai-community/gpt2"},
     ["workloads.w.path", "is not a local folder", "never downloads"]),
    ({"kind": "transformers", "task": "causal-lm"}, ["needs model_type", "or path"]),
    ({"kind": "transformers", "model_type": "gpt2", "task": "chat"}, ["workloads.w.task", "causal-lm"]),
    ({"kind": "transformers", "model_type": "gpt2", "attn_implementation": "flash"}, ["attn_implementation"]),
])
def test_the_config_refuses_in_one_line(workload, words):
    with pytest.raises(ConfigError) as caught:
        validate_config({"workloads": {"w": workload}}, "test")
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_missing_transformers_package_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[transformers\]'"):
        validate_config({"workloads": {"w": {"kind": "transformers", "model_type": "gpt2"}}}, "test")
    with pytest.raises(workloads.WorkloadError, match=r"pip install -e '\.\[transformers\]'"):
        workloads.build_workload({"kind": "transformers", "model_type": "gpt2"}, torch.device("cpu"))


@pytest.mark.parametrize("changes, words", [
    ({"model_type": "gtp2"}, ["'gtp2' is not a model type", "did you mean 'gpt2'"]),
    ({"config": {"n_layr": 2}}, ["['n_layr']", "GPT2Config"]),
    ({"seq_len": 64}, ["seq_len (64) exceeds", "(32"]),
    ({"model_type": "resnet", "config": {}, "task": "image-classification", "attn_implementation": "sdpa"},
     ["attn_implementation 'sdpa'"]),
    ({"task": "image-classification"}, ["no AutoModelForImageClassification", "task 'image-classification'"]),
])
def test_a_model_that_cannot_be_built_is_refused_in_one_line(changes, words):
    with pytest.raises(workloads.WorkloadError) as caught:
        workloads.build_workload({**_workload("hf_gpt2"), **changes}, torch.device("cpu"))
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_opprof_validate_config_refuses_a_hub_name_in_one_line_without_traceback(tmp_path):
    from conftest import run_opprof

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"workloads": {"w": {"kind": "transformers", "path": "bert-base-uncased"}}}))
    result = run_opprof("validate-config", config, cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'bert-base-uncased' is not a local folder" in lines[0]
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------------- layers


@pytest.mark.parametrize("workload, config, paths, container", [
    ("hf_gpt2", None, ["transformer.h.0", "transformer.h.1"], "nn.ModuleList transformer.h"),
    ("hf_llama", None, ["model.layers.0", "model.layers.1"], "nn.ModuleList model.layers"),
    ("hf_bert", None, ["bert.encoder.layer.0", "bert.encoder.layer.1"], "nn.ModuleList bert.encoder.layer"),
    ("hf_vit", None, ["vit.layers.0", "vit.layers.1"], "nn.ModuleList vit.layers"),
    # a stage's first layer downsamples (its shortcut has parameters): the other two form the class
    ("hf_resnet", None, [f"resnet.encoder.stages.{s}.layers.{i}" for s in (0, 1) for i in (1, 2)],
     "nn.Sequential resnet.encoder.stages."),
    # families the project was not written for: Qwen2 (decoder) and DistilBERT (encoder)
    ("hf_llama", {"model_type": "qwen2"}, ["model.layers.0", "model.layers.1"], "nn.ModuleList model.layers"),
    ("hf_bert", {"model_type": "distilbert", "task": "masked-lm",
                 "config": {"n_layers": 2, "dim": 32, "n_heads": 2, "hidden_dim": 64, "vocab_size": 128}},
     ["distilbert.transformer.layer.0", "distilbert.transformer.layer.1"],
     "nn.ModuleList distilbert.transformer.layer"),
])
def test_the_layers_of_hf_module_trees_are_found_without_a_table(workload, config, paths, container):
    cfg = {**TINY_HF_MODELS[workload], **(config or {})}
    if config and "config" not in config:
        cfg["config"] = TINY_HF_MODELS[workload]["config"]
    cfg = validate_config({"workloads": {"w": cfg}}, "test")["workloads"]["w"]
    model, _ = workloads.build_workload(cfg, torch.device("cpu"))
    found = workloads.find_layers(model)
    assert [layer.path for layer in found] == paths
    for layer in found:
        assert layer.found_by.startswith(container) and "identical parameter shapes" in layer.found_by
        assert layer.cls == type(model.get_submodule(layer.path)).__name__


# ------------------------------------------------------------------------------------------- changes on HF


def test_freezing_prepacks_every_weight_of_hf_gpt2_with_its_tied_lm_head():
    """Inductor freezing on HF GPT-2 (Conv1D projections, a tied LM head, buffers): every weight GEMM prepacked
    (4 per block and the LM head), numerics within float32's tolerance of eager."""
    from operator_profiler.transforms import changes
    from operator_profiler.optimize.numerics import compare_outputs

    torch.manual_seed(0)
    model, inputs = workloads.build_workload(_workload("hf_gpt2"), torch.device("cpu"))
    model.eval()
    with torch.no_grad():
        reference = model(*inputs)
    variant = changes.build_variant(model, inputs, ["compile", "freezing"], "cpu")
    out = variant.run()
    torch._dynamo.reset()
    check = variant.checks["freezing"]
    assert check["frozen"] == check["graphs"] >= 1
    assert check["prepacked"] == 4 * TINY_HF_MODELS["hf_gpt2"]["config"]["n_layer"] + 1
    result = compare_outputs(reference, out, "float32")
    assert result.ok, result.reason


def test_bf16_autocast_runs_hf_llama_in_bfloat16_within_its_tolerance():
    """bf16 autocast on HF Llama (RMSNorm's fp32 upcast, rotary buffers): the logits come out of a bf16 GEMM and lie
    within bfloat16's tolerance of FP32 eager. Told the machine has native bf16 (the precondition), so the check
    runs on every CPU, emulated where it has none."""
    from operator_profiler.transforms import changes
    from operator_profiler.optimize.numerics import compare_outputs

    torch.manual_seed(0)
    model, inputs = workloads.build_workload(_workload("hf_llama"), torch.device("cpu"))
    model.eval()
    with torch.no_grad():
        reference = model(*inputs)
    variant = changes.build_variant(model, inputs, ["bf16_autocast"], "cpu",
                                    features={"native_bf16": True, "cuda": False, "device": "cpu"})
    out = variant.run()
    assert out.logits.dtype == torch.bfloat16
    result = compare_outputs(reference, out, "bfloat16")
    assert result.ok and result.max_rel > 0, result


def test_conv_bn_fold_folds_every_batchnorm_of_hf_resnet_and_keeps_its_layers():
    from operator_profiler.transforms import changes
    from operator_profiler.optimize.numerics import compare_outputs

    torch.manual_seed(0)
    model, inputs = workloads.build_workload(_workload("hf_resnet"), torch.device("cpu"))
    model.eval()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in norms:  # statistics a fold must carry (fresh ones are the identity)
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    with torch.no_grad():
        reference = model(*inputs)
    layers_before = [layer.path for layer in workloads.find_layers(model)]
    folded, _ = changes.prepare(model, inputs, ["conv_bn_fold"], "cpu")
    records = changes.prepared_rewrites(folded)
    assert len([r for r in records if "new_node" in r]) == len(norms)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    assert [layer.path for layer in workloads.find_layers(folded)] == layers_before
    with torch.no_grad():
        result = compare_outputs(reference, folded(*inputs), "float32")
    assert result.ok, result.reason


# ------------------------------------------------------------------------------------- the workflow, tiny


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("wf_hf")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(TINY_HF))
    targets = ["all", *(f"results/{v}/coverage.json" for v in TINY_HF_VARIANTS)]
    result = snakemake(work, config, *targets, env=custom_env(work), cores=2)
    assert result.returncode == 0, result.stderr[-4000:]
    return work


def _flop_counter_total(workload: dict) -> int:
    """FlopCounterMode's count of one forward of the workload's model on its inputs (CPU flash attention mapped to
    the registry's SDPA formula, as in tests/test_work.py)."""
    from torch.utils.flop_counter import FlopCounterMode

    from operator_profiler.work.op_calls import EXTRA_FORMULAS

    torch.manual_seed(0)
    model, inputs = workloads.build_workload(workload, torch.device("cpu"))
    mapping = {getattr(torch.ops.aten, k.split("::")[1]): f() for k, f in EXTRA_FORMULAS.items()}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        model.eval()(*inputs)
    return int(counter.get_total_flops())


@pytest.mark.workflow
@pytest.mark.parametrize("name", sorted(TINY_HF["workloads"]))
def test_every_hf_workload_meets_the_goals(hf_run, name):
    """Coverage, work known, FLOPs against FlopCounterMode run here, every operator named, identical layers in one
    class each (eager, and compiled per layer)."""
    folder = hf_run / "results" / name
    described = json.loads((folder / "capture" / "run.json").read_text())["transformers_model"]
    assert described["model_type"] == TINY_HF["workloads"][name]["model_type"] and described["class"].endswith(
        ("LMHeadModel", "ForCausalLM", "ForMaskedLM", "ForImageClassification"))
    assert described["inputs"] and described["transformers"] == __import__("transformers").__version__
    coverage = json.loads((folder / "coverage.json").read_text())
    assert coverage["coverage_time"] >= 0.99
    assert coverage["work"]["known_time_share"] >= 0.99
    workload = validate_config(TINY_HF, "test")["workloads"][name]
    expected = _flop_counter_total(workload)
    measured = coverage["work"]["flops_by_pytorch_formulas_per_iteration"]
    assert expected > 0 and abs(measured - expected) / expected <= 0.02, (measured, expected)
    operators = pd.read_csv(folder / "operators.csv")
    unattributed = operators.loc[operators["operator"] == "(unattributed)", "time_share"].sum()
    assert unattributed < 0.005
    assert operators.loc[operators["operator"] != "(unattributed)", "operator"].str.startswith("aten::").all()
    layers = json.loads((folder / "capture" / "layers.json").read_text())
    model, _ = workloads.build_workload(workload, torch.device("cpu"))
    groups: dict[str, list[str]] = {}
    for path, module in model.named_modules():  # identical repeated children, found here independently
        for child_name, child in module.named_children():
            shapes = tuple((n, tuple(p.shape)) for n, p in child.named_parameters())
            groups.setdefault((path, type(child).__name__, shapes), []).append(f"{path}.{child_name}")
    outermost = [paths for key, paths in groups.items() if len(paths) >= 2 and key[2]
                 and not any(key[0].startswith(other[0] + ".") for other, o in groups.items()
                             if len(o) >= 2 and other[2] and other != key and key[0] != other[0]
                             and any(key[0].startswith(p + ".") or key[0] == p for p in o))]
    assert sorted(l["path"] for l in layers) == sorted(p for paths in outermost for p in paths)
    classes = json.loads((folder / "layers" / "classes.json").read_text())
    class_of = {i: c for c, v in classes.items() if c != "rest" for i in v["instances"]}
    for paths in outermost:
        assert len({class_of[p] for p in paths}) == 1, (paths, class_of)  # N/1


@pytest.mark.workflow
def test_hf_eager_attention_is_advised_to_sdpa_and_sdpa_models_are_left_alone(hf_run):
    """The attention rule reads HF's eager attention (softmax and the two matmuls in each encoder layer) and no
    attention in SDPA models. Whether its share clears the 10 % threshold is a timing: with 2 measured iterations
    on a loaded 2-core machine one descheduled GEMM took 80 % of the time, so the firing is checked against the
    share the advice read, not assumed; the rewrite itself is profiled below whatever the advice said."""
    results = hf_run / "results"
    advice = {name: json.loads((results / name / "advice.json").read_text()) for name in TINY_HF["workloads"]}

    def attention_reading(a: dict) -> str:
        fired = [e for e in a["advice"] if e.get("rule") == "attention_to_sdpa"]
        if fired:
            assert "sdpa_rewrite" in a["advised_changes"]
            return fired[0]["evidence"]
        entry = next(e for key in ("borderline", "not_triggered") for e in a[key]
                     if e.get("rule") == "attention_to_sdpa")
        assert "sdpa_rewrite" not in a["advised_changes"]
        if float(entry["value"]) >= 0.1 and entry.get("interval") is None:
            raise AssertionError(f"the share cleared the threshold, yet the rule did not fire: {entry}")
        return entry["reason"]

    eager = attention_reading(advice["hf_bert_eager"])
    assert "aten::_softmax" in eager and "bert.encoder.layer.0, bert.encoder.layer.1" in eager, eager
    for sdpa_model in ("hf_gpt2", "hf_llama", "hf_bert", "hf_vit"):
        assert "sdpa_rewrite" not in advice[sdpa_model]["advised_changes"]
        assert "0.0% of kernel time [no softmax outside fused attention]" in attention_reading(advice[sdpa_model])
    variant = results / "hf_bert_eager+sdpa_rewrite"
    run = json.loads((variant / "capture" / "run.json").read_text())
    done = [r for r in run["rewrites"] if r.get("new_node")]
    assert len(done) == TINY_HF_MODELS["hf_bert"]["config"]["num_hidden_layers"]
    operators = set(pd.read_csv(variant / "operators.csv")["operator"])
    assert not operators & {"aten::softmax", "aten::_softmax"}
    assert any("scaled_dot_product" in op for op in operators)
    base = set(pd.read_csv(results / "hf_bert_eager" / "operators.csv")["operator"])
    assert "aten::_softmax" in base and not any("scaled_dot_product" in op for op in base)


@pytest.mark.workflow
def test_hf_resnet_is_advised_to_fold_conv_bn_and_its_variant_has_no_batchnorm(hf_run):
    results = hf_run / "results"
    assert "conv_bn_fold" in json.loads((results / "hf_resnet" / "advice.json").read_text())["advised_changes"]
    variant = results / "hf_resnet+conv_bn_fold"
    operators = set(pd.read_csv(variant / "operators.csv")["operator"])
    assert not any("batch_norm" in op for op in operators)
    assert any("batch_norm" in op for op in set(pd.read_csv(results / "hf_resnet" / "operators.csv")["operator"]))
    layers = json.loads((variant / "capture" / "layers.json").read_text())
    assert [l["path"] for l in layers] == [f"resnet.encoder.stages.{s}.layers.{i}" for s in (0, 1) for i in (1, 2)]
    coverage = json.loads((variant / "coverage.json").read_text())
    assert coverage["coverage_time"] >= 0.99 and len(coverage["iteration_time_ns"]) == ITERATIONS


@pytest.mark.workflow
def test_the_full_size_config_validates_and_plans_every_model(tmp_path):
    """config/transformers.yaml (the real sizes) is a valid config whose DAG holds each model (a dry run)."""
    result = snakemake(tmp_path, ROOT / "config" / "transformers.yaml", "-n", env=custom_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load((ROOT / "config" / "transformers.yaml").read_text())
    for name in config["workloads"]:
        assert f"workload={name}" in result.stdout
    assert "verify_variants" in result.stdout


def test_a_config_override_of_a_property_is_accepted():
    """Field case (config/transformers.yaml's ViT and ResNet-50): num_labels is a property of PretrainedConfig (set
    through id2label), in no config's to_dict; it was refused as a typo."""
    for name in ("hf_vit", "hf_resnet"):
        workload = _workload(name)
        workload["config"] = {**workload["config"], "num_labels": 7}
        model, inputs = workloads.build_workload(workload, torch.device("cpu"))
        with torch.no_grad():
            assert model.config.num_labels == 7 and model(*inputs).logits.shape == (1, 7)
