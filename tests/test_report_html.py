"""report.html and compare.html (src/operator_profiler/report_html.py) on small synthetic results folders:
what the page's tables and figures hold, read back with tests/html_report.py, against the tables written.

The folders are written (tests/results_folders.py) in the layout of a finished run (``results/<workload>/``):
the workflow tests (tests/test_workflow.py, tests/test_ncu_replay.py) check the pages of real runs; the browser
test (tests/test_report_html_browser.py) renders them.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from html_report import column, figure, figure_ids, tables
from results_folders import CUDA_OPS, TEMPLATE, write_results

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = "<script>alert('x')</script>"


def opprof(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "operator_profiler.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


CPU_OPS = [("aten::addmm", 5_000_000), (TEMPLATE, 2_500_000), (SCRIPT, 1_000_000), ("aten::gelu", 250_001),
           ("(unattributed)", 1000)]


def test_operator_table_holds_every_operator_with_its_exact_time_and_escaped_names(tmp_path):
    operators = write_results(tmp_path / "gpt2", CPU_OPS)
    result = opprof("report-html", "--results", tmp_path / "gpt2", "-o", tmp_path / "report.html")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "report.html").read_text()
    table = tables(text)["operator-table"]
    assert len(table["rows"]) == len(operators)
    assert column(table, "operator", "text") == list(operators["operator"])  # unescaped by the parser: exact
    assert [int(v) for v in column(table, "time (ms)")] == list(operators["time_ns"])
    assert [float(v) for v in column(table, "share")] == pytest.approx(list(operators["time_share"]))
    assert column(table, "time (ms)", "text")[0] == "5.000"
    # Escaped everywhere: no tag from a name reaches the page, in tables or in the figures' labels.
    assert SCRIPT not in text and "alert('x')</script>" not in text
    assert "elementwise_kernel&lt;128, 4, at::native::Op&lt;float&gt;&amp;&gt;" in text
    bars = figure(text, "fig-operator-share")[0]
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in bars["y"]
    assert sorted(bars["x"]) == pytest.approx(sorted(operators["time_share"] * 100))
    # the unattributed kernels with their reason
    (row,) = tables(text)["unattributed-table"]["rows"]
    assert row[0]["title"] == TEMPLATE and row[3]["text"] == "no_enclosing_operator"


def test_cpu_run_shows_a_note_instead_of_the_sol_scatter(tmp_path):
    write_results(tmp_path / "lstm", CPU_OPS)
    assert opprof("report-html", "--results", tmp_path / "lstm", "-o", tmp_path / "r.html").returncode == 0
    text = (tmp_path / "r.html").read_text()
    assert "fig-sol" not in figure_ids(text)
    assert 'id="sol-note"' in text and "not collected on CPU (Nsight Compute is GPU-only)" in text
    assert figure_ids(text) == ["fig-operator-share", "fig-layer-classes", "fig-modules"]
    assert "clocks: not locked (CPU run)" in text
    assert len(tables(text)["module-table"]["rows"]) == 3


OFF = {"deterministic_requested": False, "cudnn_benchmark": False, "cudnn_benchmark_set_by_model": False,
       "cudnn_deterministic": False, "deterministic_algorithms": False, "deterministic_warn_only": False,
       "cublas_workspace_config": None}
FORCED = {**OFF, "deterministic_requested": True, "cudnn_deterministic": True, "deterministic_algorithms": True,
          "deterministic_warn_only": True, "cublas_workspace_config": ":4096:8"}
# before deterministic_requested was recorded the harness always forced determinism (no cuBLAS setting on CPU)
OLD_FORCED = {k: v for k, v in FORCED.items() if k not in ("deterministic_requested", "cudnn_benchmark_set_by_model")}


@pytest.mark.parametrize("settings, line", [
    (OFF, "determinism: off (the model's own settings: production kernels); cudnn.benchmark off"),
    (FORCED, "determinism: forced (deterministic algorithms, cuDNN deterministic, cuBLAS workspace :4096:8): "
             "kernels may differ from production; cudnn.benchmark off"),
    ({**OLD_FORCED, "cublas_workspace_config": None},
     "determinism: forced (deterministic algorithms, cuDNN deterministic): kernels may differ from production; "
     "cudnn.benchmark off"),
    ({**OFF, "deterministic_algorithms": True, "cudnn_benchmark_set_by_model": True},
     "determinism: not forced, but the model's or environment's own settings turn on deterministic algorithms "
     "(kernels may differ from production); cudnn.benchmark off (the model turned it on; the harness turned it off)"),
    # requested, yet the flags show it was not in effect (QA: the line read "forced (as requested)")
    ({**OFF, "deterministic_requested": True},
     "determinism: requested (harness.deterministic) but NOT in effect: deterministic algorithms were off in the "
     "measured iterations; cudnn.benchmark off"),
])
def test_both_reports_say_which_determinism_the_iterations_ran_under(tmp_path, settings, line):
    write_results(tmp_path / "gpt2", CUDA_OPS, device="cuda")
    run_path = tmp_path / "gpt2" / "capture" / "run.json"
    run_path.write_text(json.dumps({**json.loads(run_path.read_text()), "settings": settings}))
    assert opprof("report", "--results", tmp_path / "gpt2", "--run", run_path, "--out", tmp_path / "r.md").returncode == 0
    assert f"- {line}\n" in (tmp_path / "r.md").read_text()
    assert opprof("report-html", "--results", tmp_path / "gpt2", "-o", tmp_path / "r.html").returncode == 0
    assert html.escape(line) in (tmp_path / "r.html").read_text()


def test_cuda_sol_scatter_has_one_point_per_operator_with_counters(tmp_path):
    operators = write_results(tmp_path / "gpt2", CUDA_OPS, device="cuda")
    assert opprof("report-html", "--results", tmp_path / "gpt2", "-o", tmp_path / "r.html").returncode == 0
    text = (tmp_path / "r.html").read_text()
    traces = [t for t in figure(text, "fig-sol") if t["type"] == "scatter"]
    points = sorted((x, y) for t in traces for x, y in zip(t["x"], t["y"]))
    with_counters = operators.dropna(subset=["sm_sol", "memory_sol"])
    assert points == sorted(zip(with_counters["memory_sol"], with_counters["sm_sol"]))
    assert sorted(t["name"] for t in traces) == sorted(set(with_counters["bottleneck"]))
    table = tables(text)["operator-table"]
    # key counters with ncu's metric names in the header; an operator without counters has an empty cell
    sm = [h for h in table["headers"] if h.startswith("SM SOL %")]
    assert sm == ["SM SOL %sm__throughput.avg.pct_of_peak_sustained_elapsed"]
    assert any(h.endswith("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed") for h in table["headers"])
    values = column(table, "SM SOL %")
    assert [float(v) if v else None for v in values] == [None if pd.isna(v) else v for v in operators["sm_sol"]]
    assert "NVIDIA H100 80GB HBM3" in text and "hardware counters (ncu) for 75.0% of kernels" in text
    assert "durations may drift with boost clocks" in text  # clocks not locked, from report.py's text


def test_compare_page_deltas_are_b_minus_a_per_iteration(tmp_path):
    a = write_results(tmp_path / "a" / "gpt2", CUDA_OPS, device="cuda", iterations=2)
    b_ops = [("aten::addmm", 6_000_000, 85.0, 41.0), ("aten::softmax", 8_000_000, 10.0, 70.0),
             (TEMPLATE, 1_000_000, 3.5, 9.0), ("aten::new_op", 400_000, 1.0, 2.0)]
    b = write_results(tmp_path / "b" / "gpt2", b_ops, device="cuda", iterations=4)
    out = tmp_path / "compare.html"
    result = opprof("compare", tmp_path / "a" / "gpt2", tmp_path / "b" / "gpt2", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "5 operators (3 in both, 1 only in A, 1 only in B)" in result.stdout
    text = out.read_text()
    table = tables(text)["compare-table"]
    names = column(table, "operator", "text")
    assert sorted(names) == sorted(set(a["operator"]) | set(b["operator"]))
    per_a = dict(zip(a["operator"], a["time_ns"] / 2 / 1e6))
    per_b = dict(zip(b["operator"], b["time_ns"] / 4 / 1e6))
    deltas = dict(zip(names, map(float, column(table, "delta (ms)"))))
    for name in names:
        assert deltas[name] == pytest.approx(per_b.get(name, 0.0) - per_a.get(name, 0.0), abs=1e-12), name
    ratios = dict(zip(names, column(table, "ratio B/A")))
    assert float(ratios["aten::addmm"]) == pytest.approx((6e6 / 4) / (5e6 / 2))
    assert ratios["aten::copy_"] == "" and ratios["aten::new_op"] == ""
    sides = dict(zip(names, column(table, "change", "text")))
    assert sides["aten::copy_"] == "only in A" and sides["aten::new_op"] == "only in B"
    assert sides["aten::softmax"] == "slower" and sides["aten::addmm"] == "faster"
    # no per-iteration columns in these tables: means, and the page says so
    assert "per-iteration means" in text and "by per-iteration means" in result.stdout
    # sorted by the size of the change; counter deltas B - A
    assert [abs(deltas[n]) for n in names] == sorted((abs(d) for d in deltas.values()), reverse=True)
    sm = dict(zip(names, column(table, "Δ SM SOL %")))
    assert float(sm["aten::addmm"]) == pytest.approx(85.0 - 81.5) and sm["aten::copy_"] == ""
    (bars,) = figure(text, "fig-compare-delta")
    assert sorted(bars["x"]) == pytest.approx(sorted(d for d in deltas.values() if d))
    assert not any(math.isnan(x) for x in bars["x"])


def _one_line_error(result: subprocess.CompletedProcess, *words: str, command: str = "compare") -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"opprof {command}: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_compare_refuses_what_is_not_a_results_folder_and_different_workloads(tmp_path):
    write_results(tmp_path / "gpt2", CPU_OPS)
    write_results(tmp_path / "lstm", CPU_OPS, kind="lstm")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "compare.html"
    _one_line_error(opprof("compare", tmp_path / "gpt2", tmp_path / "nowhere", "-o", out), "nowhere", "is not a folder")
    _one_line_error(opprof("compare", tmp_path / "empty", tmp_path / "gpt2", "-o", out), "holds no operators.parquet",
                    "results/<workload>/")
    shutil.copytree(tmp_path / "gpt2", tmp_path / "broken")
    (tmp_path / "broken" / "operators.parquet").write_text("not parquet")
    _one_line_error(opprof("compare", tmp_path / "gpt2", tmp_path / "broken", "-o", out), "not a readable parquet")
    _one_line_error(opprof("compare", tmp_path / "gpt2", tmp_path / "lstm", "-o", out), "different workloads",
                    "'gpt2'", "'lstm'", "--force")
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
    forced = opprof("compare", tmp_path / "gpt2", tmp_path / "lstm", "-o", out, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "These are different workloads" in out.read_text()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# (-o as typed, relative to the test's folder, which is the working directory; what the one error line says)
BAD_OUTS = [("", "--out '' is empty"), (".", "--out . is a folder"), ("/", "--out / is a folder"),
            ("..", "--out .. is a folder"), ("gpt2", "--out gpt2 is a folder"), ("gpt2/", "--out gpt2/ is a folder"),
            ("new/", "--out new/ is a folder"),
            # a file the command reads out of its input folder: refused for every opprof command (cli.py)
            ("gpt2/operators.parquet", "--out gpt2/operators.parquet lies inside the input"),
            ("gpt2/coverage.json", "--out gpt2/coverage.json lies inside the input"),
            ("gpt2/capture/run.json", "--out gpt2/capture/run.json lies inside the input"),
            ("no/such/page.html", "--out no/such/page.html: the folder no/such does not exist")]


@pytest.mark.parametrize("command", ["compare", "report-html"])
def test_html_out_must_be_an_html_file_and_never_overwrites_the_inputs(tmp_path, command):
    """-o onto an input file (the parquet became HTML), a folder ('.', '/', ''), or into a missing folder: one
    error line naming what was typed, exit 1, no traceback, and every file of the results folder unchanged."""
    write_results(tmp_path / "gpt2", CPU_OPS)
    before = _snapshot(tmp_path)
    args = ["compare", "gpt2", "gpt2"] if command == "compare" else ["report-html", "--results", "gpt2"]
    for typed, says in BAD_OUTS:
        line = _one_line_error(opprof(*args, "-o", typed, cwd=tmp_path), says, command=command)
        assert ".tmp" not in line, line
        assert _snapshot(tmp_path) == before, typed  # bytes equal; nothing new (no folder made, no tmp file)
    # a page that cannot be written: the error names the path typed, not the temporary file beside it
    if Path("/proc/self").is_dir():
        line = _one_line_error(opprof(*args, "-o", "/proc/page.html", cwd=tmp_path), "'/proc/page.html'",
                               command=command)
        assert ".tmp" not in line, line
    ok = opprof(*args, "-o", "page.HTM", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "page.HTM").read_text().startswith("<!DOCTYPE html>")
    assert _snapshot(tmp_path / "gpt2") == {k[len("gpt2/"):]: v for k, v in before.items()}


def test_html_out_refuses_another_results_folders_report_html(tmp_path):
    """report.html in a results folder is the workflow's output: writing another workload's page (or a comparison)
    there would make Snakemake take it as up to date. Refused in one line, the file unchanged; a workload's own
    report.html (report-html --results of that folder) is rebuilt."""
    write_results(tmp_path / "gpt2", CPU_OPS)
    write_results(tmp_path / "lstm", CPU_OPS, kind="lstm")
    (tmp_path / "lstm" / "report.html").write_text("lstm's page")
    (tmp_path / "gpt2" / "report.html").write_text("gpt2's page")
    before = _snapshot(tmp_path)
    for args, command in ((["report-html", "--results", "gpt2", "-o", "lstm/report.html"], "report-html"),
                          (["report-html", "--results", "gpt2", "-o", "./lstm/../lstm/REPORT.html"], "report-html"),
                          (["compare", "gpt2", "lstm", "--force", "-o", "lstm/report.html"], "compare"),
                          (["compare", "gpt2", "gpt2", "-o", "gpt2/report.html"], "compare"),
                          (["compare", "lstm", "gpt2", "--force", "-o", "lstm/report.html"], "compare")):
        line = _one_line_error(opprof(*args, cwd=tmp_path), command=command)
        assert f"--out {args[-1]} is the report.html of the results folder" in line and "up to date" in line, line
        assert _snapshot(tmp_path) == before, args
    # its own page, and a report.html outside any results folder, are written
    own = opprof("report-html", "--results", "gpt2", "-o", "gpt2/report.html", cwd=tmp_path)
    assert own.returncode == 0, own.stderr
    assert "Operator profile: gpt2" in (tmp_path / "gpt2" / "report.html").read_text()
    assert (tmp_path / "lstm" / "report.html").read_text() == "lstm's page"
    elsewhere = opprof("compare", "gpt2", "gpt2", "-o", "report.html", cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert tables((tmp_path / "report.html").read_text())["compare-table"]["rows"]


# A's first measured iteration is 5x slower for aten::copy_ (the machine was busy): its mean doubles, its median
# does not move. B (5 iterations, steady) runs the same code except a slower aten::addmm.
NOISY_A = {"aten::copy_": [5_050_000, 1_010_000, 1_000_000], "aten::addmm": [2_000_000, 2_010_000, 1_990_000],
           "aten::gelu": [300_000, 310_000, 290_000], "aten::tiny": [500, 600, 400]}
STEADY_B = {"aten::copy_": [1_000_000, 1_005_000, 995_000, 1_000_000, 1_002_000],
            "aten::addmm": [3_000_000, 3_010_000, 2_990_000, 3_000_000, 3_000_000],
            "aten::gelu": [301_000, 305_000, 299_000, 300_000, 302_000], "aten::tiny": [900, 1000, 1100, 1000, 1000]}


def test_compare_uses_per_iteration_medians_and_tags_noise_as_same(tmp_path):
    ops = [(name, 0) for name in NOISY_A]
    write_results(tmp_path / "a" / "gpt2", ops, per_iteration=NOISY_A)
    write_results(tmp_path / "b" / "gpt2", ops, per_iteration=STEADY_B)
    out = tmp_path / "compare.html"
    result = opprof("compare", tmp_path / "a" / "gpt2", tmp_path / "b" / "gpt2", "-o", out, "--top", "1")
    assert result.returncode == 0, result.stderr
    assert "by per-iteration medians: 1 slower, 0 faster, 3 the same within noise" in result.stdout
    text = out.read_text()
    table = tables(text)["compare-table"]
    names = column(table, "operator", "text")
    deltas = dict(zip(names, map(float, column(table, "delta (ms)"))))
    a_ms = dict(zip(names, map(float, column(table, "A (median ms / it)"))))
    for name in NOISY_A:  # the medians, computed here from the per-iteration times
        assert a_ms[name] == pytest.approx(statistics.median(NOISY_A[name]) / 1e6, abs=1e-12)
        assert deltas[name] == pytest.approx((statistics.median(STEADY_B[name]) - statistics.median(NOISY_A[name]))
                                             / 1e6, abs=1e-12), name
    # the mean would call copy_ 2.3x faster; the median moved 1% (noise), tiny +80% but 0.5 µs (noise)
    assert sum(NOISY_A["aten::copy_"]) / 3 > 2 * statistics.median(STEADY_B["aten::copy_"])
    changes = dict(zip(names, column(table, "change", "text")))
    assert changes == {"aten::copy_": "same", "aten::gelu": "same", "aten::tiny": "same", "aten::addmm": "slower"}
    (bars,) = figure(text, "fig-compare-delta")  # only changes beyond the noise tolerance; --top 1
    assert bars["x"] == pytest.approx([deltas["aten::addmm"]]) and bars["y"] == ["aten::addmm"]
    # the page says what it compares and the tolerance
    assert "per-iteration median" in text and "ranges [min, max] not overlapping" in text
    assert "at least 2% of A&#x27;s time and 1 µs" in text
    # each side's iteration spread in the header: A's slowest iteration (its first, copy_ 5x) is named, B's is not
    assert 'id="spread-a"' in text and 'id="spread-b"' in text
    spread_a = text.split('id="spread-a">')[1].split("</p>")[0]
    totals_a = sorted(sum(t[i] for t in NOISY_A.values()) for i in range(3))
    assert f"median {totals_a[1] / 1e6:.3f} ms" in spread_a
    assert f"The slowest iteration took {totals_a[2] / totals_a[0]:.1f}x the fastest" in spread_a
    assert "slowest" not in text.split('id="spread-b">')[1].split("</p>")[0]
    # the headline is the sum of the table's per-operator medians (recomputed here from the times), not the
    # median iteration's total (coverage.json) nor the mean: the figures the rows show, summed
    kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>', text))
    sum_a = sum(statistics.median(t) for t in NOISY_A.values()) / 1e6
    sum_b = sum(statistics.median(t) for t in STEADY_B.values()) / 1e6
    shown = {k: float(v.split()[0]) for k, v in kpis.items() if "sum of operator medians" in k}
    # 3 decimals shown (3.3105 ms is a rounding tie: compared within the last digit)
    assert shown == pytest.approx({"A: kernel time / iteration (sum of operator medians)": sum_a,
                                   "B: kernel time / iteration (sum of operator medians)": sum_b}, abs=5.01e-4)
    assert kpis["change"].endswith(f"({(sum_b / sum_a - 1) * 100:+.1f}%)")


# Two runs of the same code on a loaded machine: every operator's median moved by 40% and more, but each side's
# per-iteration ranges overlap (noise). Only "aten::moved" is beyond it: B's range lies wholly above (or below) A's.
SAME_A = {"aten::addmm": [1_000_000, 1_000_000, 1_400_000], "aten::gelu": [500_000, 300_000, 320_000],
          "aten::moved": [1_000_000, 1_010_000, 990_000]}
SAME_B = {"aten::addmm": [1_400_000, 1_400_000, 1_000_000], "aten::gelu": [300_000, 500_000, 500_000],
          "aten::moved": [1_100_000, 1_120_000, 1_110_000]}


@pytest.mark.parametrize("direction", ["slower", "faster"])
def test_compare_counts_a_change_only_when_the_per_iteration_ranges_do_not_overlap(tmp_path, direction):
    a_times, b_times = (SAME_A, SAME_B) if direction == "slower" else (SAME_B, SAME_A)
    ops = [(name, 0) for name in SAME_A]
    write_results(tmp_path / "a" / "gpt2", ops, per_iteration=a_times)
    write_results(tmp_path / "b" / "gpt2", ops, per_iteration=b_times)
    out = tmp_path / "compare.html"
    result = opprof("compare", tmp_path / "a" / "gpt2", tmp_path / "b" / "gpt2", "-o", out)
    assert result.returncode == 0, result.stderr
    counts = "1 slower, 0 faster" if direction == "slower" else "0 slower, 1 faster"
    assert f"by per-iteration medians: {counts}, 2 the same within noise (a change counts when the per-iteration " \
           "ranges [min, max] do not overlap and it is at least 2% of A's time and 1 µs)" in result.stdout
    table = tables(out.read_text())["compare-table"]
    names = column(table, "operator", "text")
    ratios = dict(zip(names, map(float, column(table, "ratio B/A"))))
    # the medians moved by 40% (addmm) and 36-67% (gelu), far beyond the 2% floor, and are still noise
    assert ratios["aten::addmm"] == pytest.approx(1.4 if direction == "slower" else 1 / 1.4)
    assert abs(ratios["aten::gelu"] - 1) > 0.35
    assert dict(zip(names, column(table, "change", "text"))) == {
        "aten::addmm": "same", "aten::gelu": "same", "aten::moved": direction}
    (bars,) = figure(out.read_text(), "fig-compare-delta")
    assert bars["y"] == ["aten::moved"]


def test_compare_without_per_iteration_columns_keeps_the_share_and_floor_rule(tmp_path):
    write_results(tmp_path / "a" / "gpt2", [("aten::addmm", 2_000_000), ("aten::gelu", 1_000_000)])
    write_results(tmp_path / "b" / "gpt2", [("aten::addmm", 2_030_000), ("aten::gelu", 1_050_000)])
    result = opprof("compare", tmp_path / "a" / "gpt2", tmp_path / "b" / "gpt2", "-o", tmp_path / "c.html")
    assert result.returncode == 0, result.stderr
    # per iteration (2): addmm +1.5% (same), gelu +5% (slower)
    assert ("by per-iteration means: 1 slower, 0 faster, 1 the same within noise (a change counts when it is at "
            "least 2% of A's time and 1 µs)") in result.stdout
    text = (tmp_path / "c.html").read_text()
    assert "a change counts when it is at least 2% of A&#x27;s time and 1 µs" in text


def test_operator_table_has_the_per_iteration_median_min_max_and_the_headline_is_the_median(tmp_path):
    operators = write_results(tmp_path / "gpt2", [(name, 0) for name in NOISY_A], per_iteration=NOISY_A)
    assert opprof("report-html", "--results", tmp_path / "gpt2", "-o", tmp_path / "r.html").returncode == 0
    text = (tmp_path / "r.html").read_text()
    table = tables(text)["operator-table"]
    assert column(table, "operator", "text") == list(operators["operator"])
    assert [float(v) for v in column(table, "median / iteration (ms)")] == pytest.approx(
        list(operators["iteration_median_ns"] / 1e6), abs=1e-12)
    # min and max in one column: "min – max" shown, sorted by the max (data-v)
    assert [float(v) for v in column(table, "min – max / iteration (ms)")] == pytest.approx(
        list(operators["iteration_max_ns"] / 1e6), abs=1e-12)
    assert column(table, "min – max / iteration (ms)", "text") == [
        f"{lo / 1e6:,.3f} – {hi / 1e6:,.3f}" for lo, hi in zip(operators["iteration_min_ns"], operators["iteration_max_ns"])]
    assert not any(h.startswith(("min /", "max /")) for h in table["headers"])
    copy_row = column(table, "operator", "text").index("aten::copy_")
    assert column(table, "median / iteration (ms)", "text")[copy_row] == "1.010"
    assert column(table, "min – max / iteration (ms)", "text")[copy_row] == "1.000 – 5.050"
    assert column(table, "mean / iteration (ms)", "text")[copy_row] == f"{sum(NOISY_A['aten::copy_']) / 3 / 1e6:.3f}"
    coverage = json.loads((tmp_path / "gpt2" / "coverage.json").read_text())
    median = statistics.median(coverage["iteration_time_ns"].values())
    kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>', text))
    assert kpis["kernel time / iteration (median)"] == f"{median / 1e6:.3f} ms"
    # the spread is in the header ("What was profiled"), above the operator table it points to: A's slowest
    # iteration is its first measured one (copy_ 5x), said so plainly, not as a warning with advice
    header = text.split('<section id="measurement">')[1].split("</section>")[0]
    assert 'class="" id="iteration-spread"' in header and "the first measured iteration is the slowest" in header


def _spread_pages(folder: Path, times: dict[str, int]) -> tuple[str, str]:
    """report.md and report.html's header of a results folder whose coverage.json has ``times`` per iteration."""
    coverage = json.loads((folder / "coverage.json").read_text())
    coverage["iteration_time_ns"] = times
    (folder / "coverage.json").write_text(json.dumps(coverage))
    md, page = folder.parent / f"{folder.name}.md", folder.parent / f"{folder.name}.html"
    for args in (["report", "--results", folder, "--run", folder / "capture" / "run.json", "--out", md],
                 ["report-html", "--results", folder, "-o", page]):
        result = opprof(*args)
        assert result.returncode == 0, result.stderr
    return md.read_text(), page.read_text().split('<section id="measurement">')[1].split("</section>")[0]


def test_slowest_iteration_first_is_said_plainly_and_any_other_is_a_warning(tmp_path):
    first = "the first measured iteration is the slowest, as is usual right after the profiler starts; " \
            "the per-iteration medians are not affected"
    generic = "the machine was busy or the model is not in steady state; compare the per-iteration medians below, " \
              "or add warm-up iterations"
    # iteration indices 9, 10, 11 (keys are indices, compared as numbers: "10" < "9" as text): 9 is the first
    write_results(tmp_path / "startup", CPU_OPS)
    md, header = _spread_pages(tmp_path / "startup", {"10": 1_000_000, "9": 1_600_000, "11": 1_050_000})
    line = "Kernel time per iteration: median 1.050 ms, min 1.000, max 1.600. The slowest iteration took 1.6x the " \
           f"fastest: {first}."
    assert line in md and "**The slowest" not in md and "add warm-up" not in md
    assert f'<p class="" id="iteration-spread">{line}</p>' in header and "add warm-up" not in header
    # the slowest is a later one (iteration 10): the warning with its advice, in bold, a note on the page
    write_results(tmp_path / "busy", CPU_OPS)
    md, header = _spread_pages(tmp_path / "busy", {"9": 1_000_000, "10": 1_600_000, "11": 1_050_000})
    line = "Kernel time per iteration: median 1.050 ms, min 1.000, max 1.600. **The slowest iteration took 1.6x " \
           f"the fastest**: {generic}."
    assert line in md and "first measured" not in md
    assert 'class="note" id="iteration-spread"' in header and "<strong>The slowest iteration took 1.6x the fastest" \
        "</strong>: the machine was busy" in header and "first measured" not in header


def test_long_names_sharing_their_first_60_characters_get_one_bar_each(tmp_path):
    prefix = "void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, at::native::FillFunctor<"
    long_ops = [(prefix + "float>, std::array<char*, 1> >(int, at::native::FillFunctor<float>, std::array<char*, 1>)",
                 3_000_000), (prefix + "double>, std::array<char*, 1> >(int)", 2_000_000),
                ("aten::addmm", 4_000_000), ("aten::gelu", 1_000_000)]
    operators = write_results(tmp_path / "gpt2", long_ops)
    result = opprof("report-html", "--results", tmp_path / "gpt2", "-o", tmp_path / "r.html", "--top", "4")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "r.html").read_text()
    (bars,) = figure(text, "fig-operator-share")
    assert len(bars["y"]) == len(set(bars["y"])) == 4  # one category per operator: no two bars stacked
    by_label = dict(zip(bars["y"], bars["x"]))
    share = dict(zip(operators["operator"], operators["time_share"] * 100))
    assert by_label["aten::addmm"] == pytest.approx(share["aten::addmm"])
    long_bars = sorted(v for label, v in by_label.items() if label.startswith(html.escape(prefix[:30])))
    assert long_bars == pytest.approx(sorted([share[long_ops[0][0]], share[long_ops[1][0]]]))
    # cut in the middle (head … tail): these two end differently, so their tails tell them apart, no " #2"
    for name, _ in long_ops[:2]:
        (label,) = [html.unescape(y) for y in bars["y"] if html.unescape(y).endswith(name[-29:])]
        assert label == name[:30] + "…" + name[-29:]
    assert not any(label.endswith(" #2") for label in bars["y"])
    # the hover shows the full name, wrapped in lines of at most 90 characters
    hovers = [h for h in bars["hovertext"] if "FillFunctor" in h]
    for hover, (name, _) in zip(sorted(hovers, key=len, reverse=True), long_ops[:2]):
        lines = [html.unescape(line) for line in hover.split("<br>")]
        assert len(lines) > 1 and all(len(line) <= 90 for line in lines)
        assert "".join(lines).replace(" ", "").startswith(name.replace(" ", ""))
    # the compare plot labels them apart too
    b = tmp_path / "b" / "gpt2"
    write_results(b, [(n, t * 2) for n, t in long_ops])
    assert opprof("compare", tmp_path / "gpt2", b, "-o", tmp_path / "c.html").returncode == 0
    (delta,) = figure((tmp_path / "c.html").read_text(), "fig-compare-delta")
    assert len(delta["y"]) == len(set(delta["y"])) == 4


def test_no_kernels_shows_why_at_the_top_and_no_empty_plots(tmp_path):
    """A trace with no kernel records (CUPTI range-profiler mode): imported, so no run.json and no iterations."""
    folder = tmp_path / "agg"
    folder.mkdir()
    pd.DataFrame({"operator": pd.Series(dtype=str), "calls": pd.Series(dtype="int64"),
                  "kernels": pd.Series(dtype="int64"), "time_ns": pd.Series(dtype="int64"),
                  "time_share": pd.Series(dtype=float), "mean_kernel_ns": pd.Series(dtype="int64"),
                  "paths": pd.Series(dtype=str), "bottleneck": pd.Series(dtype=str)}
                 ).to_parquet(folder / "operators.parquet", index=False)
    pd.DataFrame({"module": pd.Series(dtype=str), "kernels": pd.Series(dtype="int64"), "time_ns": pd.Series(dtype="int64"),
                  "time_share": pd.Series(dtype=float)}).to_parquet(folder / "modules.parquet", index=False)
    pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
        ("layer_class", str), ("module_class", str), ("instances", "int64"), ("kernels_per_instance", "int64"),
        ("time_ns", "int64"), ("mean_instance_time_ns", "int64"), ("representative", str),
        ("replays_without_dedup", "int64"), ("replays_with_dedup", "int64"))}
    ).to_parquet(folder / "layer_classes.parquet", index=False)
    (folder / "coverage.json").write_text(json.dumps({
        "attributed_count": 0, "by_path": {}, "counters_coverage": None, "coverage_time": 0.0,
        "counters_note": "hardware counters: not collected", "iteration_time_ns": {}, "kernel_count": 0,
        "kernel_time_ns": 0, "unattributed": []}))
    why = ("no kernel events: t.json has GPU launch calls but no 'kernel' records; it was recorded in CUPTI "
           "range-profiler mode")
    (folder / "timeline").mkdir()
    (folder / "timeline" / "diagnostics.json").write_text(json.dumps({"format": "kineto", "file": "t.json",
                                                                       "warnings": [why]}))
    result = opprof("report-html", "--results", folder, "-o", tmp_path / "r.html")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "r.html").read_text()
    assert figure_ids(text) == []  # no empty axes
    assert 'id="fig-operator-share-none"' in text and 'id="fig-modules-none"' in text
    header = text.split('<section id="measurement">')[1].split("</section>")[0]
    assert 'id="no-kernels-note"' in header and "CUPTI range-profiler mode" in header
    assert "top 0 of 0" not in text and "<h3>No operator found</h3>" in text
    kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>', text))
    assert kpis["operators"] == "none found"
    assert "every kernel is in the class" not in text and "No kernels, so no layers" in text
    # no iteration ranges: the subtitle and the headline say so instead of "1 measured iteration"
    assert "1 measured iteration" not in text and "no iteration ranges: totals over the whole trace" in text
    assert "kernel time (whole trace)" in text and "mean / iteration" not in text


def test_one_operator_and_cpu_layer_classes_are_worded_right(tmp_path):
    write_results(tmp_path / "lstm", [("aten::lstm", 1_000_000)], kind="lstm")
    assert opprof("report-html", "--results", tmp_path / "lstm", "-o", tmp_path / "r.html").returncode == 0
    text = (tmp_path / "r.html").read_text()
    assert "1 operators" not in text and "<h3>The one operator</h3>" in text and "<h3>Time share per operator</h3>" in text
    # nothing is replayed on CPU: K is what a CUDA run would replay
    table = tables(text)["layer-class-table"]
    assert "would replay K (CUDA)" in table["headers"] and "replayed K" not in table["headers"]
    assert [t["name"] for t in figure(text, "fig-layer-classes")] == ["would replay K (CUDA)", "instances N"]


def test_bar_labels_cut_in_the_middle_and_number_only_what_still_collides():
    sys.path.insert(0, str(ROOT / "src"))
    from operator_profiler.report.html import bar_labels

    prefix = "void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, at::native::FillFunctor<"
    names = [prefix + t + ">, std::array<char*, 1> >(int)" for t in ("float", "double", "c10::Half")]
    tail = "x" * 80
    labels = bar_labels([*names, "aten::addmm", "kernel_" + tail + "_a", "kernel_" + tail + "_b", "k" * 70, "k" * 70])
    assert labels[:3] == ["void at::native::(anonymous na…lFunctor<float>, std::array<…",
                          "void at::native::(anonymous na…lFunctor<double>, std::array…",
                          "void at::native::(anonymous na…lFunctor<c10::Half>, std::ar…"]
    assert labels[3] == "aten::addmm"
    # names differing at their end: head … tail shows the difference as it is
    assert labels[4] == "kernel_" + "x" * 23 + "…" + "x" * 27 + "_a" and labels[5].endswith("x_b")
    # identical long names (two "other" rows, say) still collide: numbered
    assert labels[6] == "k" * 30 + "…" + "k" * 29 and labels[7] == labels[6] + " #2"
    assert all(len(label) <= 60 for label in labels[:7])


@pytest.mark.parametrize("command", [["report-html", "--results", "r"], ["compare", "a", "b", "-o", "c.html"]])
@pytest.mark.parametrize("typed", ["abc", "0", "-3", "1.5"])
def test_top_must_be_a_positive_integer(tmp_path, command, typed):
    result = opprof(*command, "--top", typed, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"argument --top: must be a positive integer, got '{typed}'" in result.stderr.splitlines()[-1]
    assert "_positive_int" not in result.stderr


def test_kernels_beside_the_per_iteration_headline_are_per_iteration_on_both_pages(tmp_path):
    """CPU_OPS: 5 operators of 3 kernels each, so coverage.json counts 15 kernels: over 2 measured iterations
    7.5 per iteration, over 3 iterations 5 (no trailing .0)."""
    write_results(tmp_path / "a" / "gpt2", CPU_OPS, iterations=2)
    write_results(tmp_path / "b" / "gpt2", CPU_OPS, iterations=3)
    for side, expect in (("a", "7.5"), ("b", "5")):
        assert opprof("report-html", "--results", tmp_path / side / "gpt2", "-o", tmp_path / f"{side}.html").returncode == 0
        kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>',
                               (tmp_path / f"{side}.html").read_text()))
        assert kpis["kernels / iteration"] == expect and "kernels" not in kpis
    assert opprof("compare", tmp_path / "a" / "gpt2", tmp_path / "b" / "gpt2", "-o", tmp_path / "c.html").returncode == 0
    facts = {row[0]["text"]: (row[1]["text"], row[2]["text"])
             for row in tables((tmp_path / "c.html").read_text())["facts-table"]["rows"]}
    assert facts["kernels / iteration"] == ("7.5", "5")


# ------------------------------------------------------------------------------ details seen on real traces

QWEN = "tracelens_h100_qwen1.5_0.5b_chat.json.gz"  # H100, 436 orphan kernels, 1 memcpy and 241 memsets
BERT = "tracelens_h100_bert_small_uncased.json.gz"


def _main(*args) -> None:
    """One opprof command in-process (cli.main, the same code path as the command line, faster)."""
    from operator_profiler import cli

    assert cli.main([str(a) for a in args]) == 0, args


def _imported(tmp_path: Path, trace: Path, name: str) -> tuple[Path, Path]:
    """opprof timeline / classify / attribute / aggregate of a trace captured elsewhere, in-process (cli.main):
    (timeline folder, results folder)."""
    tl, agg, layers = tmp_path / f"{name}_tl", tmp_path / name, tmp_path / f"{name}_layers"
    (tmp_path / "layers.json").write_text("[]")
    _main("timeline", "--kineto", trace, "--out", tl)
    _main("classify", "--timeline", tl, "--layers", tmp_path / "layers.json", "--out", layers)
    _main("attribute", "--timeline", tl, "--kernel-layers", layers / "kernel_layers.parquet", "--out",
          tmp_path / f"{name}_attribution.parquet")
    _main("aggregate", "--attribution", tmp_path / f"{name}_attribution.parquet", "--instances",
          layers / "instances.parquet", "--classes", layers / "classes.json", "--device", "cuda", "--out", agg)
    return tl, agg


def test_report_html_takes_the_timeline_of_a_real_trace_like_report(tmp_path):
    """A real H100 Kineto trace captured elsewhere: report-html --timeline shows the GPU name and the memcpy line
    as report --timeline does; the (unattributed) row is not counted as an operator; long unattributed kernel
    names are cut in the middle and stay distinct. Expected figures from the trace's JSON."""
    import gzip

    from conftest import real_file

    trace = real_file("kineto", QWEN)
    with gzip.open(trace, "rt") as fh:
        data = json.load(fh)
    (gpu,) = {d["name"] for d in data["deviceProperties"]}
    kinds = {cat: sum(1 for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat)
             for cat in ("gpu_memcpy", "gpu_memset")}
    assert gpu == "NVIDIA H100 80GB HBM3" and kinds == {"gpu_memcpy": 1, "gpu_memset": 241}  # PROVENANCE

    tl, agg = _imported(tmp_path, trace, "qwen")
    md, page, bare = tmp_path / "r.md", tmp_path / "r.html", tmp_path / "bare.html"
    _main("report", "--results", agg, "--timeline", tl, "--out", md)
    _main("report-html", "--results", agg, "--timeline", tl, "-o", page)
    _main("report-html", "--results", agg, "-o", bare)
    md, text, bare = md.read_text(), page.read_text(), bare.read_text()
    memcpy = (f"besides kernels the GPU ran {kinds['gpu_memcpy']} memcpy (", f" and {kinds['gpu_memset']} memsets (")
    for shown in (md, text):
        assert f"GPU(s): {gpu}" in shown and all(part in shown for part in memcpy)
        assert f"trace: <code>{trace}</code>" in shown or f"trace: `{trace}`" in shown
    # without --timeline the page knows nothing of the trace (no timeline/ in an aggregate folder)
    assert gpu not in bare and "besides kernels" not in bare and "no run.json" in bare

    operators = pd.read_parquet(agg / "operators.parquet")
    n = int((operators["operator"] != "(unattributed)").sum())
    assert 0 < n < len(operators)  # the trace's 436 orphan kernels form the (unattributed) row
    kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>', text))
    assert kpis["operators"] == str(n)
    assert f"<h3>All {n} operators and the unattributed kernels</h3>" in text
    shown_in_md = min(20, len(operators)) - int("(unattributed)" in set(operators["operator"].head(20)))
    assert f"## Top {shown_in_md} of {n} operators" in md and "`(unattributed)` is not an operator" in md

    # unattributed kernels: distinct names stay distinct, cut in the middle (head … tail) to at most 120 characters
    coverage = json.loads((agg / "coverage.json").read_text())
    names = [u["name"] for u in coverage["unattributed"]]
    assert len(set(names)) == len(names) and max(map(len, names)) > 120
    long_names = [name for name in names if len(name) > 120]
    assert len({name[:60] + name[-59:] for name in long_names}) < len(long_names)  # a plain head + tail cut merges two
    rows = tables(text)["unattributed-table"]["rows"]
    assert [row[0]["title"] for row in rows] == [row[0]["v"] for row in rows] == names
    cells = [row[0]["text"] for row in rows]
    assert len(set(cells)) == len(cells) and all(len(c) <= 120 for c in cells)
    for name, cell in zip(names, cells):
        if len(name) <= 120:
            assert cell == name
        else:
            head, tail = cell.split("…", 1)
            assert name.startswith(head) and len(head) == 60 and (tail.endswith("…") or name.endswith(tail))
    md_rows = [line.split("|")[1].strip().strip("`") for line in md.split("## Unattributed kernels")[1].splitlines()
               if line.startswith("| `")]
    assert md_rows == cells


def test_report_html_refuses_the_timeline_of_another_trace(tmp_path):
    from conftest import real_file

    _, agg = _imported(tmp_path, real_file("kineto", BERT), "bert")
    other = tmp_path / "other_tl"
    _main("timeline", "--kineto", real_file("kineto", QWEN), "--out", other)
    kernels = len(pd.read_parquet(other / "kernels.parquet"))
    line = _one_line_error(opprof("report-html", "--results", agg, "--timeline", other, "-o", tmp_path / "r.html"),
                           "describes a timeline of", command="report-html")
    assert f"{kernels} kernels" in line and not (tmp_path / "r.html").exists()
    _one_line_error(opprof("report-html", "--results", agg, "--timeline", tmp_path / "nowhere", "-o",
                           tmp_path / "r.html"), "nowhere", command="report-html")


LONG = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8<" + "T, " * 30
LONG_OPS = [(LONG + "float>>(Params)", 3_000_000), (LONG + "double>>(Params)", 2_000_000),
            (LONG[:70] + "<float>" + LONG[70:] + ">(Params)", 1_500_000), (LONG[:70] + "<half>" + LONG[70:] + ">(Params)",
                                                                           1_400_000),
            ("aten::addmm", 1_000_000), ("(unattributed)", 500_000)]


def test_unattributed_row_is_not_an_operator_and_long_names_stay_distinct_on_every_page(tmp_path, capsys):
    operators = write_results(tmp_path / "a" / "gpt2", LONG_OPS)
    write_results(tmp_path / "b" / "gpt2", [(o, t * 2) for o, t in LONG_OPS])
    n = sum(1 for o, _ in LONG_OPS if o != "(unattributed)")
    md, page, cmp = tmp_path / "r.md", tmp_path / "r.html", tmp_path / "c.html"
    _main("report", "--results", tmp_path / "a" / "gpt2", "--out", md, "--top", "3")
    _main("report-html", "--results", tmp_path / "a" / "gpt2", "-o", page, "--top", "3")
    capsys.readouterr()
    _main("compare", tmp_path / "a" / "gpt2", tmp_path / "b" / "gpt2", "-o", cmp)
    summary = capsys.readouterr().out
    md, text, cmp_text = md.read_text(), page.read_text(), cmp.read_text()
    assert f"## Top 3 of {n} operators" in md
    kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>', text))
    assert kpis["operators"] == str(n)
    assert f"<h3>Time share, top 3 of {n} operators</h3>" in text
    assert f"<h3>All {n} operators and the unattributed kernels</h3>" in text
    assert f"{n} operators ({n} in both, 0 only in A, 0 only in B)" in summary
    assert f"<h2>All {n} operators and the unattributed kernels</h2>" in cmp_text
    cmp_kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>', cmp_text))
    assert cmp_kpis["operators slower / faster / same"] == f"{n} / 0 / 0"  # every one twice as slow; not the row

    # long names: cut in the middle (at most 120 characters), distinct, the whole name in title and data-v
    for table_id, html_text in (("operator-table", text), ("compare-table", cmp_text)):
        rows = tables(html_text)[table_id]["rows"]
        full = [row[0]["v"] for row in rows]
        shown = [row[0]["text"] for row in rows]
        assert sorted(full) == sorted(operators["operator"]) and [row[0]["title"] for row in rows] == full
        assert len(set(shown)) == len(shown) and all(len(s) <= 120 for s in shown)
        assert all("…" in s for s, f in zip(shown, full) if len(f) > 120)
    md_names = [line.split("|")[1].strip() for line in md.split("## Top")[1].split("## Layer")[0].splitlines()
                if line.startswith("| ") and not line.startswith("| operator")]
    assert len(md_names) == 3 and len(set(md_names)) == 3 and all(len(s) <= 120 for s in md_names)
    # the first two differ only at their end: head … tail
    assert md_names[:2] == [name[:60] + "…" + name[-59:] for name, _ in LONG_OPS[:2]]


def test_only_unattributed_kernels_means_no_operator_found(tmp_path):
    write_results(tmp_path / "gpt2", [("(unattributed)", 1_000_000)])
    md, page = tmp_path / "r.md", tmp_path / "r.html"
    _main("report", "--results", tmp_path / "gpt2", "--out", md)
    _main("report-html", "--results", tmp_path / "gpt2", "-o", page)
    md, text = md.read_text(), page.read_text()
    assert "No operator found: every kernel is unattributed" in md and "## Top" not in md
    assert "<h3>No operator found: only unattributed kernels</h3>" in text
    kpis = dict(re.findall(r'<div class="k">([^<]+)</div><div class="v">([^<]+)</div>', text))
    assert kpis["operators"] == "none found"


def test_a_cpu_report_says_nothing_of_cudnn():
    from operator_profiler.report.markdown import determinism_text

    cpu = {"versions": {"device": "cpu"}, "settings": OFF}
    assert determinism_text(cpu) == "determinism: off (the model's own settings: production kernels)"
    assert determinism_text({**cpu, "settings": FORCED}).endswith("kernels may differ from production")
