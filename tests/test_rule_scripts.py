"""The report rules' scripts (``scripts/report.py``, ``scripts/report_html.py``) run as Snakemake's ``script:`` runs
them, without Snakemake: a fresh interpreter executes the script with a ``snakemake`` object in its globals.

Their module level imports only the light package core and their work imports the rest
(``operator_profiler.results``, pandas): the job must still write its report, say in the ``job phases`` line
that pandas came with the work, and end a user error with one FAILED line (no traceback of ours).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from results_folders import write_results

ROOT = Path(__file__).resolve().parents[1]

#: Builds a stand-in for Snakemake's ``snakemake`` object from JSON (named inputs, params, one output, one log)
#: and runs the script the way Snakemake's script preamble leaves it: ``snakemake`` a global of the script.
PROBE = r"""
import json, runpy, sys

class Named(list):
    '''A Snakemake Namedlist: a list whose items also have names.'''
    def __init__(self, items=(), **named):
        super().__init__(items)
        self.__dict__.update(named)

    def items(self):
        return self.__dict__.items()

spec = json.loads(sys.argv[2])
inputs = {k: Named(v) if isinstance(v, list) else v for k, v in spec["input"].items()}
smk = Named(rule=spec["rule"])
smk.rule = spec["rule"]
smk.input = Named(inputs.values(), **inputs)
smk.params = Named(**spec["params"])
smk.wildcards = Named(**spec["wildcards"])
smk.output = Named([spec["output"]])
smk.log = Named([spec["log"]])
runpy.run_path(sys.argv[1], init_globals={"snakemake": smk}, run_name="__main__")
"""


def _run_script(name: str, folder: Path, out: Path, log: Path) -> subprocess.CompletedProcess:
    spec = {"rule": name, "wildcards": {"workload": "toy"}, "output": str(out), "log": str(log),
            "params": {"options": json.dumps({"top_operators": 5})},
            "input": {"coverage": str(folder / "coverage.json"), "operators": str(folder / "operators.parquet"),
                      "modules": str(folder / "modules.parquet"),
                      "layer_classes": str(folder / "layer_classes.parquet"),
                      "run": str(folder / "capture" / "run.json"), "diagnostics": "", "matching": "", "replays": [],
                      "clocks": str(folder / "capture" / "clocks_applied.json"), "phases": None, "advice": None}}
    return subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "scripts" / f"{name}.py"), json.dumps(spec)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("name,suffix,title", [("report", "md", "# "), ("report_html", "html", "<!DOCTYPE html>")])
def test_a_report_script_writes_its_report_and_imports_pandas_in_its_work(tmp_path, name, suffix, title):
    write_results(tmp_path / "toy", [("aten::addmm", 5_000_000), ("aten::softmax", 2_000_000)])
    out, log = tmp_path / f"report.{suffix}", tmp_path / f"{name}.log"
    proc = _run_script(name, tmp_path / "toy", out, log)
    assert proc.returncode == 0, proc.stderr[-2000:] + log.read_text()
    assert out.read_text().lstrip().startswith(title)
    assert "aten::addmm" in out.read_text()
    phases = log.read_text().strip().splitlines()[-1]
    assert phases.startswith("job phases: start-up ")
    # the report's table reading came with the work, not with the script's imports
    assert "imported during the work: " in phases and "pandas" in phases.split("imported during the work: ")[1]


def test_a_report_script_given_no_results_ends_with_one_failed_line(tmp_path):
    (tmp_path / "empty" / "capture").mkdir(parents=True)
    out, log = tmp_path / "report.md", tmp_path / "report.log"
    proc = _run_script("report", tmp_path / "empty", out, log)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    failed = [line for line in proc.stderr.splitlines() if line.startswith("FAILED: ")]
    assert len(failed) == 1 and "missing input" in failed[0] and "coverage.json" in failed[0], proc.stderr
    assert not out.exists()
