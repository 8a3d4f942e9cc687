"""Incremental re-analysis and logs, beyond what the workflow modules test.

Where each case of item 5 is tested (dry runs on finished runs, exact job counts):

* (a) aggregation / report option edit: tests/test_workflow.py
  ``test_aggregation_option_edit_reruns_only_aggregate_and_reports``, ``test_report_option_edit_reruns_only_the_reports``
  (and, nsys, tests/test_workflow_nsys.py ``test_ignore_ranges_edit_reruns_only_attribute...``).
* (b) metric-catalog edit: tests/test_ncu_replay.py
  ``test_workflow_metric_catalog_edit_reruns_replay_and_what_follows_never_the_capture``.
* (c) a new workload: tests/test_workflow.py ``test_new_workload_runs_only_its_own_jobs``.
* (d) touch / git checkout: tests/test_workflow.py
  ``test_touching_library_code_reruns_nothing_and_editing_a_custom_model_recaptures_it`` (captures that ran,
  with metadata), tests/test_ncu_replay.py (the replay's modules), and here: the GPU rules are ``shell:``
  rules (no script whose mtime could re-run them), a CPU script's touch re-runs that rule only, and the
  documented recipes (``--touch``, ``--rerun-triggers`` without ``code``) accept it.
* (e) a recapture with identical layer classes: tests/test_ncu_replay.py
  ``test_workflow_recapture_with_identical_classes_reruns_no_replay``.

Item 6: every rule has ``log:`` and ``benchmark:`` (here); progress lines of the long CPU stages:
tests/test_workflow.py ``test_long_cpu_stages_log_their_progress``; a failed job's log ends with one
``FAILED:`` line: here (a CPU rule on a corrupt export) and tests/test_workflow.py (capture failures).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
from nsys_workflow import CUDA_NSYS, TARGETS, W, make_setup, snakemake
from workflow_runs import job_counts

ROOT = Path(__file__).resolve().parents[1]
GPU_RULES = {"select_clocks", "capture_timeline", "capture_kineto", "replay_ncu", "measure_ceilings",
             "verify_variants"}


def rule_blocks() -> dict[str, str]:
    """{rule name: its source block} of every rule and checkpoint in Snakefile and workflow/*.smk."""
    blocks = {}
    for path in (ROOT / "Snakefile", *sorted((ROOT / "workflow").glob("*.smk"))):
        text = path.read_text()
        starts = [(m.start(), m.group(1)) for m in re.finditer(r"^(?:rule|checkpoint) (\w+):", text, re.M)]
        for (start, name), (end, _) in zip(starts, [*starts[1:], (len(text), "")]):
            blocks[name] = text[start:end]
    return blocks


def test_every_rule_has_log_and_benchmark():
    import subprocess

    listed = subprocess.run([sys.executable, "-m", "snakemake", "--list-rules", "--cores", "1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = set(listed.stdout.split())
    blocks = rule_blocks()
    assert names == set(blocks) and len(names) == 21, (names, set(blocks))  # incl. advise, verify_variants, optimize_report
    for name in names - {"all"}:  # `all` only collects the targets: it runs no job
        block = blocks[name]
        assert re.search(r"^    log:\n        f?\"logs/%s/" % name, block, re.M), name
        # per workload; the machine's ceilings are one per device
        folder = r"results/ceilings" if name == "measure_ceilings" else r"results/\{workload\}"
        assert re.search(r"^    benchmark:\n        f?\"%s/benchmarks/%s" % (folder, name), block, re.M), name


def test_gpu_rules_are_shell_rules_so_a_checkout_never_reruns_them():
    """Snakemake's code trigger of a script: rule is the script's mtime; of a shell: rule, the command text."""
    blocks = rule_blocks()
    for name, block in blocks.items():
        if name in GPU_RULES:
            assert "    script:" not in block and f'gpu_shell("{name}")' in block, name
            assert "resources:\n        gpu=GPU,\n        slurm_extra=GPU_SLURM_EXTRA," in block
        elif name != "all":
            assert f'script:\n        "../scripts/{name}.py"' in block, name
    assert {p.stem for p in (ROOT / "scripts").glob("*.py")} == set(blocks) - GPU_RULES - {"all"}


@pytest.mark.workflow
def test_touching_a_cpu_script_reruns_that_rule_only_and_the_recipes_accept_it(nsys_finished_run):
    setup, _ = nsys_finished_run
    # A git checkout that rewrote scripts/attribute.py with the same content: now, newer than its outputs.
    now = time.time()
    os.utime(setup["repo"] / "scripts" / "attribute.py", (now, now))
    dry = snakemake(setup, "-n", *TARGETS, *CUDA_NSYS)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert job_counts(dry.stdout) == {"attribute": 1}, dry.stdout[-3000:]
    assert "Code has changed since last execution" in dry.stdout
    # Recipe 1: drop the code trigger for this invocation.
    # (It takes several values: the targets go before it.)
    dry = snakemake(setup, "-n", *TARGETS, "--rerun-triggers", "mtime", "params", "input", "software-env",
                    *CUDA_NSYS)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    # Recipe 2: --touch marks the planned job done without running it.
    attribution = (setup["work"] / TARGETS[0]).read_bytes()
    touch = snakemake(setup, "--touch", *TARGETS, *CUDA_NSYS)
    assert touch.returncode == 0, touch.stderr[-2000:]
    assert (setup["work"] / TARGETS[0]).read_bytes() == attribution
    dry = snakemake(setup, "-n", *TARGETS, *CUDA_NSYS)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]


@pytest.mark.workflow
def test_failed_cpu_job_log_ends_with_one_failed_line(tmp_path):
    """A corrupt nsys export (what the fake nsys hands export_timeline): the log's last line says what failed."""
    setup = make_setup(tmp_path)
    (tmp_path / "synthetic_export.sqlite").write_bytes(b"this is not an SQLite file" * 10)
    result = snakemake(setup, f"results/{W}/timeline/diagnostics.json", *CUDA_NSYS)
    assert result.returncode != 0
    lines = (setup["work"] / "logs" / "export_timeline" / f"{W}.log").read_text().strip().splitlines()
    assert lines[-1].startswith("FAILED: ") and "Traceback" not in "\n".join(lines), lines[-5:]
    assert sum(line.startswith("FAILED") for line in lines) == 1
    print(lines[-1])
    # The same line on the terminal, with the log's path.
    assert lines[-1] in result.stderr
