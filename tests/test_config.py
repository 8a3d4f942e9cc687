"""Tests for config loading and validation (operator_profiler.config).

Defaults are checked against the values written in the schema file itself (read here with plain yaml) and
against the documented ones (gpt2 n_layer 4 ...).
"""

from __future__ import annotations

import copy
import sys
from importlib import resources

import pytest
import yaml

from operator_profiler.config import ConfigError, check_callables, load_config, validate_config

# The compile keys every workload gets (schema $defs.workload): whole-model compile, torch.compile's own defaults.
COMPILE_DEFAULTS = {"compile_scope": "model", "compile_mode": "default", "compile_options": {}}


@pytest.fixture(scope="module")
def schema() -> dict:
    return yaml.safe_load(resources.files("operator_profiler").joinpath("schemas/config.schema.yaml").read_text())


def _branch_defaults(schema: dict, kind: str) -> dict:
    for branch in schema["$defs"]["workload"]["allOf"]:
        if branch["if"]["properties"].get("kind", {}).get("const") == kind:  # per-kind branches (not mode: train)
            return {k: v["default"] for k, v in branch["then"]["properties"].items() if "default" in v}
    raise AssertionError(kind)


def test_empty_config_gets_documented_defaults():
    cfg = validate_config({})
    assert cfg["device"] == "auto" and cfg["timeline"] == "auto"
    assert cfg["harness"] == {"seed": 0, "warmup": 2, "warmup_max": 30, "steady_window": 5, "steady_tolerance": 0.1,
                              "iterations": 30, "deterministic": False}
    assert cfg["clocks"] == {"policy": "base", "sudo": False, "sm_mhz": None, "mem_mhz": None}
    assert cfg["aggregate"] == {"per_iteration": True}
    assert cfg["report"] == {"top_operators": 20}
    assert cfg["ncu"] == {"window": "nvtx", "cache_control": "all"}
    assert set(cfg["workloads"]) == {"gpt2", "sdpa_attention", "lstm"}
    gpt2 = cfg["workloads"]["gpt2"]
    assert gpt2 == {"kind": "gpt2", "mode": "inference", "compile": True, "compile_scope": "model",
                    "compile_mode": "default", "compile_options": {}, "vocab_size": 512, "n_positions": 128,
                    "n_embd": 64, "n_layer": 4, "n_head": 4, "batch_size": 2, "seq_len": 32}
    assert cfg["workloads"]["lstm"]["compile"] is False
    assert cfg["workloads"]["sdpa_attention"]["n_block"] == 2


def test_defaults_match_the_schema_file(schema):
    cfg = validate_config({})
    for name in ("gpt2", "sdpa_attention", "lstm"):
        want = {"kind": name, "mode": "inference", **COMPILE_DEFAULTS, **_branch_defaults(schema, name)}
        assert cfg["workloads"][name] == want
    for section in ("harness", "clocks", "aggregate", "report", "ncu"):
        props = schema["properties"][section]["properties"]
        # a key without a default (harness.threads) stays absent: its default is decided where it runs
        assert cfg[section] == {k: v["default"] for k, v in props.items() if "default" in v}


def test_validate_does_not_modify_its_input():
    raw = {"workloads": {"mine": {"kind": "gpt2", "n_layer": 2}}}
    before = copy.deepcopy(raw)
    cfg = validate_config(raw)
    assert raw == before
    assert cfg["workloads"] == {"mine": {"kind": "gpt2", "mode": "inference", **COMPILE_DEFAULTS, "compile": True,
                                         "vocab_size": 512,
                                         "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 4,
                                         "batch_size": 2, "seq_len": 32}}


def test_custom_workload_defaults():
    cfg = validate_config({"workloads": {"m": {"kind": "custom", "factory": "pkg.mod:make"}}})
    assert cfg["workloads"]["m"] == {"kind": "custom", "factory": "pkg.mod:make", "mode": "inference", **COMPILE_DEFAULTS,
                                     "compile": False, "kwargs": {}}


def test_unknown_top_level_key():
    with pytest.raises(ConfigError) as err:
        validate_config({"devcie": "cpu"})
    assert "devcie" in str(err.value) and "(top level)" in str(err.value)


def test_unknown_workload_key_names_the_path():
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"gpt2": {"kind": "gpt2", "n_layr": 3}}})
    msg = str(err.value)
    assert "workloads.gpt2" in msg and "n_layr" in msg


def test_key_of_another_kind_is_unknown():
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"rnn": {"kind": "lstm", "n_layer": 2}}})
    assert "workloads.rnn" in str(err.value) and "n_layer" in str(err.value)


def test_wrong_type_names_the_key_path():
    with pytest.raises(ConfigError) as err:
        validate_config({"harness": {"warmup": "two"}})
    msg = str(err.value)
    assert "harness.warmup" in msg and "integer" in msg


def test_wrong_type_in_workload_names_the_key_first():
    """A failed per-kind branch must be reported as itself, not as 'every key of the workload was unexpected'."""
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"gpt2": {"kind": "gpt2", "n_layer": "three"}}})
    msg = str(err.value)
    headline = msg.split(". Also:")[0]
    assert "workloads.gpt2.n_layer" in headline and "integer" in headline
    assert "vocab_size" not in msg  # a valid (defaulted) key must not be called unexpected


def test_missing_factory_is_reported():
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"mine": {"kind": "custom"}}})
    headline = str(err.value).split(". Also:")[0]
    assert "workloads.mine" in headline and "factory" in headline


@pytest.mark.parametrize(
    "config, where",
    [
        ({"device": "tpu"}, "device"),
        ({"harness": {"iterations": 0}}, "harness.iterations"),
        ({"workloads": {}}, "workloads"),
        ({"workloads": {"bad name": {"kind": "gpt2"}}}, "workloads"),
        ({"workloads": {"w": {"kind": "resnet"}}}, "workloads.w.kind"),
        ({"harness": {"seed": 0, "extra": 1}}, "harness"),
        ({"harness": {"deterministic": "sometimes"}}, "harness.deterministic"),
        ({"harness": {"deterministic": 1}}, "harness.deterministic"),
    ],
)
def test_invalid_values(config, where):
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert f"'{where}'" in str(err.value)


def test_load_config_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("device: cpu\nworkloads:\n  g:\n    kind: gpt2\n    n_layer: 2\n")
    cfg = load_config(p)
    assert cfg["device"] == "cpu" and cfg["workloads"]["g"]["n_layer"] == 2 and cfg["workloads"]["g"]["n_head"] == 4


def test_load_config_errors_name_the_file(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("device: [cpu\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(bad_yaml)
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("harness:\n  warmup: -1\n")
    with pytest.raises(ConfigError) as err:
        load_config(invalid)
    assert str(invalid) in str(err.value) and "harness.warmup" in str(err.value)


def test_empty_file_is_all_defaults(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    assert load_config(p) == validate_config({})


def test_command_line_strings_are_coerced_to_the_schema_type():
    """snakemake --config harness='{iterations: 5}' delivers nested values as text: the overrides' strings are
    converted (the overrides are what Snakemake parsed from --config, merged into the config)."""
    given = {"harness": {"iterations": "5", "deterministic": "true"}, "aggregate": {"per_iteration": "false"},
             "workloads": {"g": {"kind": "gpt2", "n_layer": "2", "compile": "no"}}}
    config = validate_config(given, overrides=given)
    assert config["harness"]["iterations"] == 5 and config["harness"]["deterministic"] is True
    assert config["aggregate"]["per_iteration"] is False
    assert config["workloads"]["g"]["n_layer"] == 2 and config["workloads"]["g"]["compile"] is False


def test_unknown_key_suggests_the_closest_allowed_key():
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"g": {"kind": "gpt2", "n_layr": 2}}})
    assert "unknown key 'n_layr' (did you mean 'n_layer'?)" in str(err.value)


def test_malformed_factory_is_rejected_before_running():
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"c": {"kind": "custom", "factory": "mymodels.build"}}})
    assert "workloads.c.factory" in str(err.value) and "package.module:function" in str(err.value)


@pytest.mark.parametrize(
    "workload, fragment",
    [
        ({"kind": "gpt2", "seq_len": 4096}, "seq_len (4096) exceeds n_positions (128)"),
        ({"kind": "gpt2", "n_embd": 65}, "n_embd (65) must be a multiple of n_head (4)"),
        ({"kind": "sdpa_attention", "d_model": 10, "n_head": 3}, "d_model (10) must be a multiple of n_head (3)"),
    ],
)
def test_shapes_the_model_cannot_be_built_with_are_config_errors(workload, fragment):
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"w": workload}})
    assert "workloads.w" in str(err.value) and fragment in str(err.value)


def test_fixed_clock_policy_needs_both_clocks_at_config_time(tmp_path):
    """QA: `clocks: {policy: fixed, sm_mhz: 1755}` passed validation and failed only in the GPU job."""
    from operator_profiler.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("clocks: {policy: fixed, sm_mhz: 1755}\n")
    with pytest.raises(ConfigError, match="mem_mhz"):
        load_config(path)
    path.write_text("clocks: {policy: fixed, sm_mhz: 1755, mem_mhz: 2619}\n")
    assert load_config(path)["clocks"]["mem_mhz"] == 2619


def test_dag_check_of_a_factory_parses_without_running_the_module(tmp_path, monkeypatch):
    """The DAG build's check (import_modules=False) finds and parses the module; its code runs only when the
    source does not show the name (bound in a try block here), never for a name defined at top level."""
    from operator_profiler.config import check_callables

    (tmp_path / "dag_models.py").write_text(
        "def build():\n    pass\n\ntry:\n    from math import sqrt as made_late\nexcept ImportError:\n    pass\n\n"
        "open(__file__ + '.ran', 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "dag_models", raising=False)
    config = {"workloads": {"m": {"kind": "custom", "factory": "dag_models:build"}}}
    check_callables(config, "c.yaml", import_modules=False)
    assert not (tmp_path / "dag_models.py.ran").exists()  # the module's code did not run
    config["workloads"]["m"]["factory"] = "dag_models:made_late"
    check_callables(config, "c.yaml", import_modules=False)  # bound at run time: imported to look it up
    assert (tmp_path / "dag_models.py.ran").exists()
    config["workloads"]["m"]["factory"] = "dag_models:missing"
    with pytest.raises(ConfigError, match=r"^in c.yaml: workloads.m.factory: factory 'dag_models:missing': module "
                                          r"'dag_models' \(.*dag_models.py\) has no 'missing'"):
        check_callables(config, "c.yaml", import_modules=False)


@pytest.mark.parametrize("written", [{"compile_scope": "layers"}, {"compile_mode": "max-autotune"},
                                     {"compile_options": {"max_autotune": True}}])
def test_compile_settings_of_an_eager_workload_are_refused(written):
    """compile_scope/compile_mode/compile_options with compile: false used to be accepted and ignored."""
    key = next(iter(written))
    with pytest.raises(ConfigError, match=rf"workloads.l.*{key} has no effect with compile: false"):
        validate_config({"workloads": {"l": {"kind": "lstm", **written}}})
    with pytest.raises(ConfigError, match=f"{key} has no effect"):
        validate_config({"workloads": {"g": {"kind": "gpt2", "compile": False, **written}}})
    # the defaults filled in are no setting of the user's, and compile: true takes them
    assert validate_config({"workloads": {"l": {"kind": "lstm"}}})["workloads"]["l"]["compile_scope"] == "model"
    validate_config({"workloads": {"l": {"kind": "lstm", "compile": True, **written}}})


@pytest.mark.parametrize("in_process", [True, False])
def test_unknown_compile_options_fail_when_the_config_is_checked(in_process):
    """A misspelt Inductor option failed only in the capture job (without the workload's name, leaving an
    empty inductor/debug.partial). Now validate-config (in process) and the DAG build (a child Python: the
    Snakemake process imports no torch) name the workload, the key and the closest option."""
    import torch._inductor

    config = validate_config({"workloads": {"g": {"kind": "gpt2", "compile_options": {"max_autotun": True,
                                                                                     "epilogue_fusion": False}}}})
    with pytest.raises(ConfigError, match=r"workloads\.g\.compile_options: 'max_autotun' is not an option.*"
                                          r"did you mean 'max_autotune'"):
        check_callables(config, import_modules=in_process)
    assert "epilogue_fusion" in torch._inductor.list_options()
    config["workloads"]["g"]["compile_options"] = {"epilogue_fusion": False}
    check_callables(config, import_modules=in_process)
    # QA: a value of the wrong type passed the check and failed the capture as an internal error, unnamed
    config["workloads"]["g"]["compile_options"] = {"epilogue_fusion": "yes", "triton.cudagraphs": 3}
    with pytest.raises(ConfigError, match=r"workloads\.g\.compile_options: 'epilogue_fusion': Unexpected type of attr "
                                          r"epilogue_fusion, got str should be bool.*'triton\.cudagraphs'.*got int"):
        check_callables(config, import_modules=in_process)


# ---------------------------------------------------------------------------- case-study kinds

CASE_STUDY_KINDS = ("conv_block", "embedding_projection", "mlp", "depthwise_separable")
BUILT_IN_KINDS = ("gpt2", "sdpa_attention", "lstm", *CASE_STUDY_KINDS)


@pytest.mark.parametrize("kind", CASE_STUDY_KINDS)
def test_case_study_kind_gets_the_schema_defaults(schema, kind):
    cfg = validate_config({"workloads": {"w": {"kind": kind}}})
    want = {"kind": kind, "mode": "inference", **COMPILE_DEFAULTS, **_branch_defaults(schema, kind)}
    assert cfg["workloads"]["w"] == want
    assert want["compile"] is True and want["n_block"] >= 2  # compiled by default; its blocks form a layer class


@pytest.mark.parametrize("kind", CASE_STUDY_KINDS)
def test_case_study_kind_documents_every_size_key_with_its_default(schema, kind):
    """docs/config.md's row of the kind names each size key with the schema's default, as '`key` (default)'."""
    from conftest import ROOT

    rows = [line for line in (ROOT / "docs" / "config.md").read_text().splitlines() if line.startswith(f"| `{kind}` |")]
    assert len(rows) == 1, kind
    sizes = {k: v for k, v in _branch_defaults(schema, kind).items() if k != "compile"}
    for key, default in sizes.items():
        assert f"`{key}` ({default})" in rows[0], (kind, key)


@pytest.mark.parametrize("kind, key", [(k, key) for k in CASE_STUDY_KINDS for key in
                                       {"conv_block": ("in_channels", "channels", "n_block", "image_size", "batch_size"),
                                        "embedding_projection": ("vocab_size", "d_model", "n_block", "out_features",
                                                                 "batch_size", "seq_len"),
                                        "mlp": ("width", "expansion", "n_block", "batch_size", "seq_len"),
                                        "depthwise_separable": ("channels", "n_block", "image_size", "batch_size")}[k]])
@pytest.mark.parametrize("bad, says", [(0, "0 is less than the minimum of 1"),
                                       ("sixteen", "'sixteen' is not of type 'integer'"),
                                       (2.5, "2.5 is not of type 'integer'")])
def test_bad_size_of_a_case_study_kind_is_refused_naming_the_key(kind, key, bad, says):
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"w": {"kind": kind, key: bad}}})
    headline = str(err.value).split(". Also:")[0]
    assert f"at 'workloads.w.{key}': {says}" in headline


def test_size_key_of_another_case_study_kind_is_unknown():
    with pytest.raises(ConfigError) as err:
        validate_config({"workloads": {"m": {"kind": "mlp", "channels": 8}}})
    assert "at 'workloads.m': unknown key 'channels'" in str(err.value)


def _merged(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` as Snakemake merges a --configfile over the Snakefile's configfile
    (snakemake.utils.update_config: nested dicts merge key by key, other values are replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_case_studies_config_profiles_the_seven_built_in_kinds():
    """config/case_studies.yaml validates, names each built-in kind once, mixes eager and compiled, and means the
    same merged over config/config.yaml (as `snakemake --configfile` runs it) as alone: it sets every key the
    default config sets for a workload of the same name."""
    from conftest import ROOT

    raw = yaml.safe_load((ROOT / "config" / "case_studies.yaml").read_text())
    alone = load_config(ROOT / "config" / "case_studies.yaml")
    kinds = [w["kind"] for w in alone["workloads"].values()]
    assert sorted(kinds) == sorted(BUILT_IN_KINDS)
    assert {w["compile"] for w in alone["workloads"].values()} == {True, False}
    assert alone["workloads"]["lstm"]["compile"] is False
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    merged = validate_config(_merged(default, raw))
    assert merged["workloads"] == alone["workloads"]
    # the default config keeps its three workloads
    assert sorted(w["kind"] for w in load_config(ROOT / "config" / "config.yaml")["workloads"].values()) == \
        ["gpt2", "lstm", "sdpa_attention"]


@pytest.mark.parametrize("ncu, fragment", [({"window": "launch_skip"}, "ncu.window"),
                                           ({"cache_control": "warm"}, "ncu.cache_control"),
                                           ({"windows": "nvtx"}, "windows")])
def test_ncu_options_are_checked(ncu, fragment):
    with pytest.raises(ConfigError, match=fragment):
        validate_config({"ncu": ncu})
    assert validate_config({"ncu": {"window": "profiler_api", "cache_control": "none"}})["ncu"] == {
        "window": "profiler_api", "cache_control": "none"}


# ----------------------------------------------------------------------------- YAML types of the numeric settings


def _refusal(tmp_path, text: str) -> str:
    """The one-line ConfigError of loading a config file holding ``text``."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize("written, advice", [
    ("2.0", "a whole number is needed, without a decimal point (YAML reads 2.0 as a float); write threads: 2."),
    ('"2"', "a whole number is needed, and '2' is quoted text; write it without quotes: threads: 2."),
    ("true", "a whole number is needed, and true is a boolean; write a whole number, e.g. threads: 1"),
])
def test_a_thread_count_that_is_not_a_yaml_integer_is_refused_saying_what_to_write(tmp_path, written, advice):
    message = _refusal(tmp_path, f"harness:\n  threads: {written}\n")
    assert "at 'harness.threads'" in message and advice in message


@pytest.mark.parametrize("key, written, advice", [
    ("decision_budget_s", '"0.5"', "a number is needed, and '0.5' is quoted text; write it without quotes: "
                                   "decision_budget_s: 0.5."),
    ("decision_budget_s", "yes", "a number is needed, and true is a boolean; write a number, e.g. "
                                 "decision_budget_s: 120."),
    ("repetitions", "20.0", "write repetitions: 20."),
    ("repetitions", '"30"', "write it without quotes: repetitions: 30."),
])
def test_the_optimizer_settings_take_yaml_numbers_only(tmp_path, key, written, advice):
    message = _refusal(tmp_path, f"optimize:\n  {key}: {written}\n")
    assert f"at 'optimize.{key}'" in message and advice in message


@pytest.mark.parametrize("written, value", [("1e-4", 1e-4), ("1.0e4", 1e4), ("1.0e-4", 1e-4), ("2.5E+1", 25.0)])
def test_a_tolerance_in_exponent_notation_is_the_number_it_spells(tmp_path, written, value):
    """YAML 1.1 (PyYAML, as Snakemake reads config files) reads 1e-4 and 1.0e4 as text, 1.0e-4 as a float: every
    spelling of the number gives the number."""
    import yaml

    text = f"optimize:\n  tolerances:\n    float32: {{max_rel: {written}, min_cosine: 1}}\n"
    assert isinstance(yaml.safe_load(text)["optimize"]["tolerances"]["float32"]["max_rel"],
                      str if written in ("1e-4", "1.0e4") else float)
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_config(path)["optimize"]["tolerances"]["float32"] == {"max_rel": value, "min_cosine": 1}


def test_an_exponent_at_a_whole_number_setting_or_other_text_at_a_number_setting_is_still_refused(tmp_path):
    assert "at 'harness.threads'" in _refusal(tmp_path, "harness:\n  threads: 1e1\n")
    assert "at 'optimize.decision_budget_s'" in _refusal(tmp_path, "optimize:\n  decision_budget_s: 1e1s\n")


def _numeric_settings(schema: dict) -> list[tuple[str, str, dict]]:
    """Every numeric setting of the schema: (key path, ``integer``/``number``, a workload slice it needs or {}) for
    the sections' keys and each workload kind's and mode's keys."""
    found = []
    for section, spec in schema["properties"].items():
        for key, sub in (spec.get("properties") or {}).items():
            types = sub.get("type") if isinstance(sub.get("type"), list) else [sub.get("type")]
            for kind in ("integer", "number"):
                if kind in types:
                    found.append((f"{section}.{key}", kind, {}))
            # optimize.tolerances: per dtype, a mapping of numbers
            for inner, leaf in ((sub.get("additionalProperties") or {}).get("properties") or {}).items():
                found.append((f"{section}.{key}.float32.{inner}", leaf["type"], {}))
    for branch in schema["$defs"]["workload"]["allOf"]:
        condition = {k: v["const"] for k, v in branch["if"]["properties"].items()}
        base = {"kind": condition.get("kind", "mlp"), **({"mode": "train"} if "mode" in condition else {})}
        if base["kind"] == "custom":
            base["factory"] = "m:f"
        for key, sub in branch["then"]["properties"].items():
            types = sub.get("type") if isinstance(sub.get("type"), list) else [sub.get("type")]
            for kind in ("integer", "number"):
                if kind in types:
                    found.append((f"workloads.w.{key}", kind, base))
    return found


def test_the_survey_finds_the_numeric_settings(schema):
    settings = _numeric_settings(schema)
    paths = {path for path, _, _ in settings}
    assert {"harness.threads", "harness.iterations", "harness.steady_tolerance", "optimize.decision_budget_s",
            "optimize.repetitions", "optimize.processes", "ceilings.stream_mib", "ceilings.trials",
            "report.top_operators", "clocks.sm_mhz", "workloads.w.n_block", "workloads.w.lr",
            "optimize.tolerances.float32.max_rel", "optimize.tolerances.float32.min_top1_agreement"} <= paths
    kinds = {workload["kind"] for _, _, workload in settings if workload}
    assert kinds == {"mlp", "gpt2", "sdpa_attention", "lstm", "conv_block", "embedding_projection",
                     "depthwise_separable", "transformers"}  # custom has no numeric key; mlp stands for mode: train
    assert len(settings) >= 60


def test_every_numeric_setting_refuses_quoted_text_and_booleans_and_every_integer_one_a_float(schema):
    """Each numeric setting of the schema, given a quoted number, a boolean, and (integers) a float with no
    fractional part: refused, naming the key path and what to write."""
    for path, kind, workload in _numeric_settings(schema):
        *parents, key = path.split(".")
        for value in ["3", True] + ([3.0] if kind == "integer" else []):
            config: dict = {}
            node = config
            for part in parents:
                node = node.setdefault(part, dict(workload) if part == "w" else {})
            node[key] = value
            with pytest.raises(ConfigError) as caught:
                validate_config(config, "config.yaml")
            message = str(caught.value)
            assert f"at '{path}'" in message and f"write " in message and "\n" not in message, (path, value, message)
            if value == "3":
                assert f"write it without quotes: {key}: 3" in message, message
            if value == 3.0:
                assert f"write {key}: 3." in message, message


def test_numbers_with_their_yaml_types_still_load(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "harness: {threads: 1, iterations: 5, steady_tolerance: 1, seed: 0}\n"   # an int on a float setting is fine
        "ceilings: {stream_mib: 64, min_run_s: 0.5, gemm_n: null}\n"
        "optimize: {decision_budget_s: 0.5, repetitions: 30, tolerances: {int8: {max_rel: 0.05}}}\n"
        "workloads: {m: {kind: mlp, width: 8, compile: false}, t: {kind: mlp, mode: train, lr: 1, compile: false}}\n")
    config = load_config(path)
    assert config["harness"]["threads"] == 1 and config["harness"]["steady_tolerance"] == 1
    assert config["optimize"]["decision_budget_s"] == 0.5 and config["optimize"]["repetitions"] == 30
    assert config["ceilings"]["stream_mib"] == 64 and config["workloads"]["m"]["width"] == 8
    assert config["workloads"]["t"]["lr"] == 1


def test_only_the_command_line_overrides_are_converted_from_text():
    """snakemake --config hands nested values over as text: those are converted; a value quoted in the config file
    (not among the overrides) is still refused."""
    given = {"harness": {"threads": "1", "iterations": "5"}, "optimize": {"decision_budget_s": "0.5"}}
    overrides = {"harness": {"threads": "1"}, "optimize": {"decision_budget_s": "0.5"}}
    with pytest.raises(ConfigError) as caught:
        validate_config(given, "config.yaml", overrides=overrides)
    message = str(caught.value)
    assert "at 'harness.iterations'" in message and "write it without quotes: iterations: 5" in message
    given["harness"]["iterations"] = 5
    config = validate_config(given, "config.yaml", overrides=overrides)
    assert config["harness"]["threads"] == 1 and config["optimize"]["decision_budget_s"] == 0.5


@pytest.mark.parametrize("key, written", [("optimize:\n  tolerances:\n    float32: {max_rel: .nan, min_cosine: 0.99}",
                                           "max_rel"),
                                          ("optimize:\n  tolerances:\n    float32: {max_rel: 0.001, min_cosine: .nan}",
                                           "min_cosine"),
                                          ("harness:\n  steady_tolerance: .inf", "steady_tolerance"),
                                          ("harness:\n  threads: .inf", "threads")])
def test_a_number_that_is_not_finite_is_refused(tmp_path, key, written):
    """A NaN tolerance compares False with every error, so it would pass every variant's numerics silently."""
    message = _refusal(tmp_path, key + "\n")
    assert f"{written}'" in message and "not a finite number" in message
