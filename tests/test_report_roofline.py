"""The work and roofline sections of report.html and report.md (src/operator_profiler/report/roofline_view.py,
html.py, markdown.py) on small results folders whose work columns the workflow's own functions wrote
(tests/results_folders.add_work: operator_profiler.roofline on a per-kernel work table built here).

Every expected figure is computed here from the operators' time and work given to the folder, or from the
ceilings (tests/results_folders.CEILINGS), not read back from the code under test; the page is read back with
tests/html_report.py.
"""

from __future__ import annotations

import html
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from html_report import column, figure, figure_ids, figure_layout, tables
from results_folders import CEILINGS, CUDA_OPS, TEMPLATE, add_work, write_results

ROOT = Path(__file__).resolve().parents[1]

# operator, time over the 2 measured iterations (ns)
OPS = [("aten::addmm", 40_000_000), ("aten::mm", 10_000_000), ("aten::gelu", 8_000_000), ("aten::copy_", 4_000_000),
       ("aten::custom_scan", 3_000_000), ("aten::view", 1_000_000), (TEMPLATE, 500_000), ("(unattributed)", 1000)]
# FLOPs, bytes (totals over the 2 iterations), dtype[, why unknown]
WORK = {"aten::addmm": (1.6e9, 8.0e7, "float32"),        # 20 FLOP/byte: above the fp32 ridge 50e9/12e9
        "aten::mm": (2.0e8, 1.0e8, "bfloat16"),          # 2 FLOP/byte: below the bf16 ridge
        "aten::gelu": (2.0e7, 1.6e8, "float32"),         # 0.125 FLOP/byte
        "aten::copy_": (0.0, 6.0e8, "float32"),          # moves data only: 150 GB/s, above the bandwidth
        "aten::custom_scan": (None, None, "float32", "no FLOP rule for aten::custom_scan"),
        "aten::view": (0.0, 0.0, "float32"),             # a view: no work of its own
        TEMPLATE: (1.0e6, 4.0e6, "float16"),              # no measured fp16 ceiling: no bound
        "(unattributed)": (None, None, None, "work unknown for 2 of 2 kernels: no enclosing operator")}
ITERATIONS = 2


def opprof(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "operator_profiler.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)


def expected(op: str) -> dict:
    """The figures of ``op``, from OPS and WORK alone."""
    time_s = dict(OPS)[op] / 1e9
    flops, nbytes = WORK[op][:2]
    return {"flops_per_s": flops / time_s, "bytes_per_s": nbytes / time_s,
            "intensity": flops / nbytes if nbytes else None}


def with_known_work() -> list[str]:
    return [op for op, _ in OPS if WORK[op][0] is not None and (WORK[op][0] > 0 or WORK[op][1] > 0)]


def page(folder: Path) -> str:
    """report.html of ``folder`` as ``opprof report-html`` writes it (in this process: faster)."""
    from operator_profiler import stages
    from operator_profiler.results import ReportPaths

    out = folder.parent / "report.html"
    stages.report_html_files(folder.name, ReportPaths.of_folder(folder), {"top_operators": 20}, out)
    return out.read_text()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A CPU results folder with the work of WORK and the ceilings CEILINGS."""
    root = tmp_path_factory.mktemp("roofline")
    write_results(root / "gpt2", OPS, iterations=ITERATIONS)
    add_work(root / "gpt2", WORK)
    return root / "gpt2"


@pytest.fixture(scope="module")
def text(folder) -> str:
    return page(folder)


def points(text: str) -> dict[str, dict]:
    """Every operator's point on the roofline (operator -> x, y, trace name, marker symbol, hover)."""
    out = {}
    for trace in figure(text, "fig-roofline"):
        if trace.get("mode") != "markers":
            continue
        for i, op in enumerate(trace["customdata"]):
            assert op not in out, f"{op} has two points"
            out[op] = {"x": trace["x"][i], "y": trace["y"][i], "trace": trace["name"],
                       "symbol": trace["marker"]["symbol"], "hover": trace["hovertext"][i]}
    return out


def test_roofline_has_one_point_per_operator_with_known_work_at_its_intensity(folder, text):
    operators = pd.read_parquet(folder / "operators.parquet")
    assert "fig-roofline" in figure_ids(text) and "fig-sol" not in figure_ids(text)  # replaces the empty SOL note
    assert 'id="sol-note"' not in text
    drawn = points(text)
    # counted from the table fed to the report: known work that is not zero
    known = operators[operators["work_known"] & ((operators["flops"] > 0) | (operators["bytes"] > 0))]
    assert sorted(drawn) == sorted(known["operator"]) == sorted(with_known_work())
    for op in ("aten::addmm", "aten::mm", "aten::gelu", TEMPLATE):
        assert drawn[op]["x"] == pytest.approx(expected(op)["intensity"])
        assert drawn[op]["y"] == pytest.approx(expected(op)["flops_per_s"])
        assert drawn[op]["symbol"] == "circle"
    # bound by intensity against the ridge of the operator's dtype: 20 >= 50/12 (fp32); 2 < 80/12 (bf16)
    assert drawn["aten::addmm"]["trace"] == "compute-bound"
    assert drawn["aten::mm"]["trace"] == drawn["aten::gelu"]["trace"] == "memory-bound"
    assert drawn[TEMPLATE]["trace"] == "bound unknown (no ceiling for its dtype)"
    assert "no measured compute ceiling for float16" in drawn[TEMPLATE]["hover"]
    share = 1.6e9 / (40e6 / 1e9) / 5e10  # achieved FLOP/s over the fp32 peak
    assert f"{share * 100:.0f}% of fp32 GEMM peak (compute-bound)" in drawn["aten::addmm"]["hover"]
    assert f"time {40e6 / ITERATIONS / 1e6:.3f} ms / iteration" in drawn["aten::addmm"]["hover"]


def test_data_movement_operator_sits_at_the_left_edge_with_its_own_marker(text):
    drawn = points(text)
    copy = drawn["aten::copy_"]
    assert copy["symbol"] == "triangle-right" and copy["trace"].startswith("data movement only")
    assert {p["symbol"] for op, p in drawn.items() if op != "aten::copy_"} == {"circle"}
    # at the plot's left edge (a log axis), left of every other point, at y = bytes/s x that intensity
    axis = figure_layout(text, "fig-roofline")["xaxis"]
    assert axis["type"] == "log" and figure_layout(text, "fig-roofline")["yaxis"]["type"] == "log"
    assert axis["range"][0] < math.log10(copy["x"]) < axis["range"][0] + 0.1
    assert copy["x"] < min(p["x"] for op, p in drawn.items() if op != "aten::copy_")
    assert copy["y"] / copy["x"] == pytest.approx(expected("aten::copy_")["bytes_per_s"])
    gbs = expected("aten::copy_")["bytes_per_s"]
    assert (f"data movement only: {gbs / 1e9:.3g} GB/s = {gbs / CEILINGS['memory_bytes_per_s']['best'] * 100:.0f} % "
            "of bandwidth") in copy["hover"]


def test_ceiling_lines_are_the_measured_ceilings(text):
    traces = [t for t in figure(text, "fig-roofline") if t.get("mode") == "lines"]
    bandwidth = CEILINGS["memory_bytes_per_s"]["best"]
    (memory,) = [t for t in traces if t["name"].startswith("memory bandwidth")]
    assert [y / x for x, y in zip(memory["x"], memory["y"])] == pytest.approx([bandwidth, bandwidth])
    compute = {t["name"]: t for t in traces if "GEMM peak" in t["name"]}
    assert sorted(compute) == ["bf16 GEMM peak 80 GFLOP/s", "fp32 GEMM peak 50 GFLOP/s"]
    for label, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        peak = CEILINGS["compute_flops_per_s"][dtype]
        line = compute[f"{label} GEMM peak {peak / 1e9:.0f} GFLOP/s"]
        assert line["y"] == [peak, peak]
        assert line["x"][0] == pytest.approx(peak / bandwidth)  # from its ridge point on
    # the memory roof ends at the highest ridge
    assert memory["x"][-1] == pytest.approx(max(CEILINGS["compute_flops_per_s"].values()) / bandwidth)
    assert len(traces) == 3


def test_operators_without_a_point_are_listed_with_why(text):
    unknown = tables(text)["work-unknown-table"]
    assert column(unknown, "operator", "v") == ["aten::custom_scan", "(unattributed)"]
    notes = column(unknown, "why", "text")
    assert "no FLOP rule for aten::custom_scan" in notes[0] and "no enclosing operator" in notes[1]
    assert "aten::view" in text[text.index('id="work-none"'):text.index("</p>", text.index('id="work-none"'))]


def test_operator_table_has_the_roofline_columns(folder, text):
    operators = pd.read_parquet(folder / "operators.parquet")
    table = tables(text)["operator-table"]
    names = column(table, "operator", "v")
    assert names == list(operators["operator"])
    flops = dict(zip(names, column(table, "GFLOP/s")))
    gbs = dict(zip(names, column(table, "GB/s")))
    intensity = dict(zip(names, column(table, "FLOP/byte")))
    for op in ("aten::addmm", "aten::mm", "aten::gelu", "aten::copy_"):
        assert float(flops[op]) == pytest.approx(expected(op)["flops_per_s"])
        assert float(gbs[op]) == pytest.approx(expected(op)["bytes_per_s"])
    assert float(intensity["aten::addmm"]) == pytest.approx(20.0) and float(intensity["aten::copy_"]) == 0.0
    assert flops["aten::custom_scan"] == "" and dict(zip(names, column(table, "bound", "text")))[
        "aten::custom_scan"] == "work unknown"
    bound = dict(zip(names, column(table, "bound")))
    assert bound["aten::addmm"] == "compute" and bound["aten::copy_"] == "memory"
    # a view: no work of its own, not a slow operator: no rate shown, said so
    assert dict(zip(names, column(table, "GB/s", "text")))["aten::view"] == "–"
    assert dict(zip(names, column(table, "bound", "text")))["aten::view"] == "none of its own"
    fraction = dict(zip(names, column(table, "% of ceiling")))
    assert float(fraction["aten::addmm"]) == pytest.approx(expected("aten::addmm")["flops_per_s"] / 5e10)
    assert float(fraction["aten::copy_"]) == pytest.approx(expected("aten::copy_")["bytes_per_s"] / 1.2e10)
    assert float(fraction["aten::copy_"]) > 1  # cache-resident: above the measured bandwidth
    # sorted as numbers, like the other numeric columns
    for label in ("GFLOP/s", "GB/s", "FLOP/byte", "% of ceiling"):
        assert f'<th data-type="num" class="num">{label}<span class="metric words">' in text


def test_markdown_section_quotes_the_work_the_ceilings_and_the_readings(folder):
    out = folder.parent / "report.md"
    result = opprof("report", "--results", folder, "--out", out)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    section = text[text.index("## Work and roofline"):text.index("## Layer classes")]
    known = [op for op in WORK if WORK[op][0] is not None and WORK[op][1] is not None]
    flops = sum(WORK[op][0] for op in known) / ITERATIONS
    nbytes = sum(WORK[op][1] for op in known) / ITERATIONS
    assert f"analytic work per measured iteration: {flops / 1e6:.3g} MFLOP" in section
    assert f"{nbytes / 1e6:.3g} MB ideal bytes" in section
    unknown_ns = dict(OPS)["aten::custom_scan"] + dict(OPS)["(unattributed)"]
    share = 1 - unknown_ns / sum(t for _, t in OPS)
    assert f"work known for {share * 100:.1f}% of kernel time (4 kernels without known work)" in section
    assert ("ceilings: fp32 GEMM peak 50 GFLOP/s, bf16 GEMM peak 80 GFLOP/s, memory bandwidth 12 GB/s, measured "
            "with 1 thread(s) from `results/ceilings/cpu.json`") in section
    fraction = expected("aten::addmm")["flops_per_s"] / 5e10
    assert "| `aten::addmm` |" in section and f"{fraction:.0%} of fp32 GEMM peak, compute-bound |" in section
    assert "- `aten::custom_scan`: work unknown for 2 of 2 kernels: no FLOP rule for aten::custom_scan" in section
    assert "| `aten::view` | " in section and "| – | – | – | no work of its own" in section
    assert "| `aten::custom_scan` | " in section and "|  |  |  | work unknown |" in section
    assert "**Analytic**" in section and "**Measured**" in section and "Nsight Compute" not in section


def test_without_ceilings_the_points_stay_and_the_page_says_so(tmp_path):
    write_results(tmp_path / "gpt2", OPS, iterations=ITERATIONS)
    operators = add_work(tmp_path / "gpt2", WORK, ceilings=None)
    text = page(tmp_path / "gpt2")
    traces = figure(text, "fig-roofline")
    assert not [t for t in traces if t.get("mode") == "lines"]
    assert sorted(points(text)) == sorted(with_known_work())
    assert {t["name"] for t in traces if not t["name"].startswith("data movement")} == {"no ceilings measured"}
    assert 'id="roofline-no-ceilings"' in text and "ceilings were not measured" in text
    assert operators["bound"].isna().all()
    from operator_profiler import stages
    from operator_profiler.results import ReportPaths

    out = tmp_path / "report.md"
    stages.report_files("gpt2", ReportPaths.of_folder(tmp_path / "gpt2"), {"top_operators": 20}, out)
    assert "- ceilings: **not measured**" in out.read_text()


def test_ceilings_of_another_thread_count_are_flagged(tmp_path):
    write_results(tmp_path / "gpt2", OPS, iterations=ITERATIONS)  # run.json: torch ran 1 CPU thread
    add_work(tmp_path / "gpt2", WORK, ceilings={**CEILINGS, "threads": 4})
    text = page(tmp_path / "gpt2")
    assert 'id="roofline-threads"' in text and "measured with 4 CPU thread(s), the profile ran torch with 1" in text


def test_an_operator_above_its_peak_flags_the_ceilings_in_both_reports(tmp_path):
    """aten::addmm runs 1.6 GFLOP in 40 ms (40 GFLOP/s) against an fp32 peak measured at 33 GFLOP/s: 121 %. Both
    reports warn that the ceiling was likely measured low, with how to re-measure, and list the ceilings' own
    warnings (here: its best trial ran under load)."""
    under_load = ("the best of 3 trial(s) for gemm_float32 (trial 2) ran while other processes kept 1.6 CPUs busy on "
                  "average (1 spare beside its 1 thread(s)): these figures may be low; measure again on a quiet "
                  "machine (snakemake --forcerun measure_ceilings)")
    write_results(tmp_path / "gpt2", OPS, iterations=ITERATIONS)
    low = {**CEILINGS, "compute_flops_per_s": {**CEILINGS["compute_flops_per_s"], "float32": 3.3e10},
           "warnings": [under_load]}
    operators = add_work(tmp_path / "gpt2", WORK, ceilings=low).set_index("operator")
    fraction = expected("aten::addmm")["flops_per_s"] / 3.3e10
    assert round(fraction * 100) == 121 and operators.loc["aten::addmm", "ceiling_exceeded"]
    assert not operators["ceiling_exceeded"].drop("aten::addmm").fillna(False).any()  # copy_: no cache size known
    warning = ("1 operator(s) above the measured ceiling they are held against ({name} at 121 % of fp32 GEMM peak): "
               "no kernel beats the peak it is measured against, so the ceiling was likely measured low (under load?) "
               "or part of the work ran in other operators' kernels; re-measure: snakemake --forcerun measure_ceilings")
    text = page(tmp_path / "gpt2")
    assert 'id="roofline-above-ceiling"' in text and html.escape(warning.format(name="aten::addmm")) in text
    assert html.escape(f"the ceilings' measurement warns: {under_load}") in text
    out = tmp_path / "report.md"
    assert opprof("report", "--results", tmp_path / "gpt2", "--out", out).returncode == 0
    md = out.read_text()
    assert f"- **warning**: {warning.format(name='`aten::addmm`')}" in md
    assert f"- the ceilings' measurement warns: {under_load}" in md
    assert ("| `aten::addmm` |" in md and "121% of fp32 GEMM peak, compute-bound; above the measured peak (121 %): "
            "the ceiling was likely measured low (under load?)" in md)


def test_results_without_work_columns_still_render_and_say_why(tmp_path):
    """An older results folder: operators.parquet without the work columns."""
    operators = write_results(tmp_path / "lstm", [(op, t) for op, t in OPS])
    assert "flops" not in operators
    result = opprof("report-html", "--results", tmp_path / "lstm", "-o", tmp_path / "report.html")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "report.html").read_text()
    assert "fig-roofline" not in figure_ids(text)
    assert 'id="roofline-note"' in text and "results from an older version: re-run the workflow" in text
    assert 'id="sol-note"' in text  # the CPU note stays: no hardware view at all
    table = tables(text)["operator-table"]
    assert len(table["rows"]) == len(operators) and not [h for h in table["headers"] if h.startswith("GFLOP/s")]
    out = tmp_path / "report.md"
    result = opprof("report", "--results", tmp_path / "lstm", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "No work computed: operators.parquet has no work columns (results from an older version" in out.read_text()


def test_cuda_page_keeps_the_sol_scatter_and_adds_the_roofline(tmp_path):
    write_results(tmp_path / "gpt2", CUDA_OPS, device="cuda")
    work = {op: (1e9, 1e8, "float32") for op, *_ in CUDA_OPS}
    add_work(tmp_path / "gpt2", work, ceilings={**CEILINGS, "device": "cuda"})
    text = page(tmp_path / "gpt2")
    ids = figure_ids(text)
    assert "fig-sol" in ids and "fig-roofline" in ids and ids.index("fig-sol") < ids.index("fig-roofline")
    assert sorted(points(text)) == sorted(op for op, *_ in CUDA_OPS)
    statement = text[text.index('id="analytic-measured"'):]
    assert "Nsight Compute counters" in statement[:statement.index("</p>")]


def test_every_measured_ceiling_is_drawn_also_of_a_dtype_no_operator_ran_in():
    """An fp32 model's page still shows the bf16 ceiling coverage.json ``work`` lists (what bf16 could reach)."""
    import pandas as pd

    from operator_profiler.report.roofline_view import table_ceilings

    operators = pd.DataFrame({"operator": ["aten::mm"], "work_dtype": ["float32"], "ceiling_flops_per_s": [1e11],
                              "ceiling_bytes_per_s": [1e10]})
    coverage = {"work": {"compute_flops_per_s": {"float32": 1e11, "bfloat16": 3e10}, "memory_bytes_per_s": 1e10,
                         "ceilings": "results/ceilings/cpu.json", "ceilings_threads": 1}}
    ceilings = table_ceilings(operators, coverage)
    assert [(dtype, value) for _, dtype, value in ceilings.compute] == [("bfloat16", 3e10), ("float32", 1e11)]
    assert ceilings.bandwidth == 1e10


def test_report_md_lists_the_operators_whose_measured_work_is_far_from_the_analytic():
    import pandas as pd

    from operator_profiler.report.roofline_view import measured_lines

    operators = pd.DataFrame({"operator": ["aten::copy_", "aten::gelu", "aten::mm"],
                              "bytes_ratio": [2.5, 1.0, None], "flops_ratio": [None, 1.0, None],
                              "work_check": ["DRAM bytes 2.50x the ideal: extra traffic (layout copies, spills, "
                                             "rematerialization or padding)", None, None]})
    lines = measured_lines(operators, {})
    assert "2 operators compared, 1 far from 1" in lines[1]
    assert lines[-1] == "- `aten::copy_`: " + operators.loc[0, "work_check"]
    assert measured_lines(operators.drop(columns=["bytes_ratio", "flops_ratio", "work_check"]), {}) == []
