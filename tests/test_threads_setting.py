"""harness.threads: validated against the usable CPUs (one line naming the key), applied by the harness to every
capture and recorded in run.json; the verification's thread count (harness.threads, else every usable CPU), its
1-thread round of FP32 eager and the scaling verdict the optimize page states (timing.measure replaced by seeded
samples here: the real measurement is tests/test_optimize_timing.py's)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from operator_profiler.config import ConfigError, resolved_threads, threads_problem, usable_cpus, validate_config
from operator_profiler.optimize import verify

USABLE = usable_cpus() or 1


def test_threads_absent_stays_absent_and_an_int_within_the_cpus_is_kept():
    assert "threads" not in validate_config({})["harness"]  # absent: cached captures keep their params
    assert validate_config({"harness": {"threads": 1}})["harness"]["threads"] == 1
    text = {"harness": {"threads": str(USABLE)}}  # snakemake --config harness='{threads: N}' hands over text
    assert validate_config(text, overrides=text)["harness"]["threads"] == USABLE


@pytest.mark.parametrize("threads, says", [(0, "less than the minimum of 1"), (USABLE + 1, "more than the"),
                                           ("many", "is not of type")])
def test_a_thread_count_this_machine_cannot_run_is_refused_naming_the_key(threads, says):
    with pytest.raises(ConfigError) as caught:
        validate_config({"harness": {"threads": threads}})
    assert "at 'harness.threads'" in str(caught.value) and says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_verification_uses_the_setting_or_every_usable_cpu():
    assert resolved_threads(None, usable=8) == 8 and resolved_threads(3, usable=8) == 3
    assert verify.verification_threads(None) == (USABLE, "usable CPUs")
    assert verify.verification_threads(1) == (1, "harness.threads")
    assert threads_problem(9, usable=8).startswith("9 threads, more than the 8 CPUs")
    with pytest.raises(ConfigError, match="harness.threads"):
        resolved_threads(9, usable=8)


MODEL = """
import torch

def build():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)), (torch.randn(2, 8),)
"""


def test_the_harness_runs_with_the_setting_and_records_it(tmp_path, monkeypatch):
    from operator_profiler.capture import harness

    (tmp_path / "threads_toy.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(USABLE)
        run = harness.run_capture({"kind": "custom", "factory": "threads_toy:build"},
                                  {"warmup": 1, "warmup_max": 1, "iterations": 2, "threads": 1}, "cpu", None,
                                  tmp_path / "layers.json", tmp_path / "run.json", profiler="none")
    finally:
        torch.set_num_threads(before)
    assert run["threads"] == {"count": 1, "requested": 1, "source": "harness.threads"}
    assert json.loads((tmp_path / "run.json").read_text())["threads"]["count"] == 1
    assert run["versions"]["cpu_threads"] == 1 and run["machine_load"]["threads"] == 1
    with pytest.raises(ConfigError, match="harness.threads"):
        harness.harness_settings({"threads": USABLE + 1})


def _entry(samples):
    return {"changes": [], "rejected": None, "samples_ms": samples, "median_ms": float(np.median(samples))}


def test_scaling_verdicts():
    rng = np.random.default_rng(1)
    one, flat, fast = (rng.normal(m, 0.5, 20).tolist() for m in (10.0, 10.0, 4.0))
    scales = verify.thread_scaling(_entry(one), _entry(fast), 4)
    assert scales["verdict"] == "scales" and scales["ci"][0] > 1 and 2 < scales["speedup"] < 3
    assert "uses the 4 threads" in scales["text"]
    small = verify.thread_scaling(_entry(one), _entry(flat), 4)
    assert small["verdict"] == "single_thread" and "too small to use more than one thread" in small["text"]
    assert verify.thread_scaling(None, None, 1)["verdict"] == "one_thread"
    assert verify.thread_scaling({**_entry(one), "rejected": "numerics"}, _entry(fast), 4)["verdict"] == "unknown"


@pytest.mark.parametrize("threads", [1, 4])
def test_verify_times_fp32_eager_at_one_thread_beside_the_threads_it_measures_with(monkeypatch, tmp_path, threads):
    rng = np.random.default_rng(7)
    calls = []

    def measure(spec, work_dir=None, **kwargs):  # no gain from threads: the same times at 1 and at 4
        calls.append((spec["threads"], sorted(spec["variants"])))
        means = {"fp32_eager": 10.0}
        return {"variants": {n: _entry(rng.normal(means.get(n, 8.0), 0.2, 20).tolist())
                             for n in spec["variants"]}, "warnings": [], "seed": 0, "baseline": "fp32_eager",
                "threads": spec["threads"]}

    monkeypatch.setattr(verify.timing, "measure", measure)
    record = verify.verify("w", {"kind": "mlp"}, {"repetitions": 20, "processes": 2}, "cpu",
                           {"advised_changes": ["compile"], "advice": []}, tmp_path, threads=threads,
                           features={"native_bf16": False}, threads_source="harness.threads")
    assert calls[0][0] == threads and record["threads"] == threads and record["threads_source"] == "harness.threads"
    if threads == 1:
        assert len(calls) == 1 and record["thread_scaling"]["verdict"] == "one_thread"
    else:
        assert calls[-1] == (1, ["fp32_eager"])
        assert record["thread_scaling"]["verdict"] == "single_thread"
        assert record["thread_scaling"]["threads"] == 4


def test_the_optimize_page_states_the_thread_count_and_the_scaling():
    from operator_profiler.report.optimize_page import _threads_html

    scaling = verify.thread_scaling(_entry([10.0, 10.1, 9.9] * 5), _entry([10.0, 10.2, 9.8] * 5), 2)
    html = _threads_html({"thread_scaling": scaling, "threads_source": "usable CPUs"})
    assert "Threads: 2 (usable CPUs)" in html and "<strong>" in html and "too small" in html
    assert _threads_html({}) == ""
    from operator_profiler.report.optimize_page import _threads_kpi

    assert _threads_kpi({"thread_scaling": scaling}) == [("threads", "2: too small for more than 1")]


def test_a_busy_machine_or_a_slower_threaded_run_is_said():
    rng = np.random.default_rng(2)
    one, slow = rng.normal(1.0, 0.02, 20).tolist(), rng.normal(5.0, 0.1, 20).tolist()
    said = verify.thread_scaling(_entry(one), _entry(slow), 2, busy=True)
    assert said["verdict"] == "single_thread" and "and is slower with 2" in said["text"]
    assert said["busy"] and "measure again on a quiet machine" in said["text"]
    assert verify._busy({"threads": 2, "processes_info": [{"other_cpu_load": 1.2, "usable_cpus": 2}]})
    assert not verify._busy({"threads": 1, "processes_info": [{"other_cpu_load": 1.2, "usable_cpus": 2}]})
    assert not verify._busy(None)


def _job_params(stdout: str, rule: str) -> tuple[int, dict]:
    """A job of a dry run with -p: its threads and the params JSON its gpu_jobs command runs with."""
    import re
    import shlex

    block = stdout.split(f"rule {rule}:", 1)[1]
    threads = re.search(r"^    threads: (\d+)$", block, re.M)
    command = next(line for line in block.splitlines() if f"operator_profiler.gpu_jobs {rule}" in line)
    argv = shlex.split(command.split("Shell command:", 1)[-1].strip())
    return int(threads.group(1)) if threads else 1, json.loads(argv[argv.index(rule) + 1])


@pytest.mark.workflow
def test_the_workflow_gives_the_setting_to_the_captures_the_ceilings_and_the_verification(tmp_path):
    """harness.threads reaches every job whose result depends on it as a params value (a change re-runs it):
    the captures (the whole harness; the compiled workload's Inductor debug output comes from the capture's own
    compile), the ceilings and verify_variants; the capture jobs hold that many cores."""
    import yaml
    from workflow_runs import custom_env, snakemake

    threads = min(2, USABLE)
    raw = {"device": "cpu", "workloads": {"mlp": {"kind": "mlp", "compile": True, "width": 8, "n_block": 1,
                                                  "batch_size": 1, "seq_len": 4}},
           "optimize": {"workloads": ["mlp"]}}
    config, default = tmp_path / "config.yaml", tmp_path / "default.yaml"
    config.write_text(yaml.safe_dump({**raw, "harness": {"threads": threads}}))
    default.write_text(yaml.safe_dump(raw))
    plan = snakemake(tmp_path / "work", config, "-n", "-p", env=custom_env(tmp_path), cores=2)
    assert plan.returncode == 0, plan.stderr[-3000:]
    held, capture = _job_params(plan.stdout, "capture_timeline")
    assert held == threads and json.loads(capture["harness"])["threads"] == threads
    assert "compile_artifacts" not in plan.stdout and "inductor/debug" in plan.stdout
    assert _job_params(plan.stdout, "measure_ceilings")[1]["threads"] == threads
    assert _job_params(plan.stdout, "verify_variants")[1]["threads"] == threads
    plan = snakemake(tmp_path / "work2", default, "-n", "-p", env=custom_env(tmp_path), cores=2)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "threads" not in json.loads(_job_params(plan.stdout, "capture_timeline")[1]["harness"])
    assert _job_params(plan.stdout, "verify_variants")[1]["threads"] is None  # every usable CPU, resolved by the job


def test_the_rules_verification_with_harness_threads_names_where_the_count_came_from(monkeypatch, tmp_path):
    """The workflow's verify_variants job passes harness.threads and no source: verification.json says
    ``harness.threads`` (the page then reads "Threads: 1 (harness.threads)"), not null."""
    from operator_profiler.gpu_jobs import _verify_variants, parse_job

    def measure(spec, work_dir=None, **kwargs):
        return {"variants": {n: _entry([10.0 + 0.01 * i for i in range(20)]) for n in spec["variants"]},
                "warnings": [], "seed": 0, "baseline": "fp32_eager", "threads": spec["threads"]}

    monkeypatch.setattr(verify.timing, "measure", measure)
    advice = tmp_path / "advice.json"
    advice.write_text(json.dumps({"advised_changes": ["compile"], "advice": []}))
    out = tmp_path / "optimize" / "verification.json"
    job = parse_job(json.dumps({"workload": json.dumps({"kind": "mlp"}), "device": "cpu", "threads": 1,
                                "optimize": json.dumps({"repetitions": 20, "processes": 2})}),
                    json.dumps({"wildcards": {"workload": "w"}, "input": {"advice": str(advice)},
                                "output": {"verification": str(out)}}))
    func, args = _verify_variants(job)
    func(*args)
    record = json.loads(out.read_text())
    assert record["threads"] == 1 and record["threads_source"] == "harness.threads"
