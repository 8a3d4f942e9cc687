"""``operator_profiler.ncu.csv_reader`` on the eight real ncu CSVs and on small synthetic CSVs, one per documented
variant of docs/formats.md#ncu-csv (raw page with units row, digit grouping in two locales, ``n/a``, ``==PROF==``
and application-stdout preambles, the 20-column layout with estimated speedups) and per bad input.

Expected real values were read by hand from the files in ../shared/data/real/ncu/ (provenance in PROVENANCE.md
there); each carries the 1-based line number it comes from.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import pytest
from conftest import real_file
from fake_tools import write_tool

from operator_profiler.files import InputError
from operator_profiler.ncu.csv_reader import (
    LONG_COLUMNS,
    NcuCsvError,
    normalize_unit,
    read_ncu_csv,
    wide_metrics,
)

BERT = "a100_pytorch_bert_mha_eager_details_kerneltime_rules.csv"
GPT2 = "a100_pytorch_gpt2_flashattn_details_kerneltime_rules.csv"
DROPOUT = "a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv"
POOL = "a100_pytorch_adaptive_avgpool_details_blockgrid_rules_preamble.csv"
CONV = "a100_cudnn_conv2d_details_kerneltime_rules_app_stdout_preamble.csv"
# DeepSeek-OCR on an RTX 5090 (CC 12.0), one kernel per file, newer 20-column details layout (PROVENANCE.md).
CC120_GEMM = "llmperfopt_dsocr_cc120_cutlass_bf16_gemm_256x128_details.csv"
CC120_FMHA = "llmperfopt_dsocr_cc120_fmha_cutlassF_bf16_attention_details.csv"
CC120_SILU = "llmperfopt_dsocr_cc120_silu_elementwise_details.csv"


def _real(name: str) -> Path:
    return real_file("ncu", name)


def _one(df, ncu_id, metric):
    row = df[(df.ncu_id == ncu_id) & (df.metric == metric)]
    assert len(row) == 1, (ncu_id, metric, len(row))
    return row.iloc[0]


# ---------------------------------------------------------------- real files


def test_dropout_162_launches_in_id_order():
    df = read_ncu_csv(_real(DROPOUT))
    assert list(df.columns) == LONG_COLUMNS
    assert df.attrs["page"] == "details" and df.attrs["rules"] == []
    ids = list(df.drop_duplicates("ncu_id").ncu_id)
    assert ids == list(range(162))
    assert df.name.nunique() == 1 and df.name.iloc[0].startswith(
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<double, double, unsigned int, 1, 4>")
    assert df.groupby("ncu_id").size().eq(21).all()
    assert df.grid.isna().all() and df.block.isna().all()  # "Kernel Time" layout has no Grid/Block Size
    # line 2: "0",...,"dram__bytes.sum","byte","4,194,688"
    r = _one(df, 0, "dram__bytes.sum")
    assert (r.value, r.text, r.unit, r.raw_unit, r.pid, r.stream) == (4194688.0, "4,194,688", "byte", "byte", 33512, 7)
    # line 5: "0",...,"gpu__time_duration.sum","nsecond","11,744" -> seconds
    r = _one(df, 0, "gpu__time_duration.sum")
    assert r.value == pytest.approx(11744e-9) and (r.unit, r.raw_unit, r.text) == ("second", "nsecond", "11,744")
    # line 3386: "161",...,"gpu__time_duration.sum","nsecond","34,208"
    assert _one(df, 161, "gpu__time_duration.sum").value == pytest.approx(34208e-9)
    # line 3383: "161",...,"dram__bytes.sum","byte","23,473,664"
    assert _one(df, 161, "dram__bytes.sum").value == 23473664.0
    wide = wide_metrics(df)
    assert list(wide.ncu_id) == list(range(162)) and wide.shape == (162, 7 + 21)
    assert wide.attrs["units"]["gpu__time_duration.sum"] == "second"
    assert wide.loc[161, "dram__bytes.sum"] == 23473664.0


def test_bert_global_ids_rules_and_hz():
    df = read_ncu_csv(_real(BERT))
    assert df.ncu_id.nunique() == 26 and sorted(df.ncu_id.unique()) == list(range(26))
    # docs/formats.md#ncu-id: IDs are global across kernel names
    assert sorted(df[df.name == "ampere_sgemm_32x32_sliced1x4_tn"].ncu_id.unique()) == [6, 10, 14, 22]
    # line 32: "0",...,"sm__cycles_elapsed.avg.per_second","cycle/second","967,585,940.83"
    r = _one(df, 0, "sm__cycles_elapsed.avg.per_second")
    assert r.value == pytest.approx(967585940.83) and (r.unit, r.raw_unit) == ("hz", "cycle/second")
    # line 373: "6",...,"ampere_sgemm_32x32_sliced1x4_tn",...,"dram__bytes.sum","byte","303,360"
    r = _one(df, 6, "dram__bytes.sum")
    assert (r["name"], r.value, r.section) == ("ampere_sgemm_32x32_sliced1x4_tn", 303360.0,
                                               "Command line profiler metrics")
    # text-valued metric: NaN value, text kept
    r = _one(df, 0, "Function Cache Configuration")
    assert math.isnan(r.value) and r.text == "cudaFuncCachePreferNone" and r.unit == ""
    assert len(df.attrs["rules"]) == 51
    assert not df.metric.eq("").any()  # rule rows are not metrics
    assert wide_metrics(df).shape == (26, 7 + 60)


def test_gpt2_flashattn():
    df = read_ncu_csv(_real(GPT2))
    assert df.ncu_id.nunique() == 10 and len(df) == 600
    # line 604: "9",...,"void splitKreduce_kernel<...",...,"Launch Statistics","Registers Per Thread","register/thread","32"
    r = _one(df, 9, "Registers Per Thread")
    assert r["name"].startswith("void splitKreduce_kernel<(int)32, (int)16, int, __half")
    assert (r.value, r.unit, r.section) == (32.0, "register/thread", "Launch Statistics")
    assert len(df.attrs["rules"]) == 18


def test_pooling_prof_preamble_block_grid_layout():
    df = read_ncu_csv(_real(POOL))  # 3 ==PROF== lines before the header (line 4)
    assert df.ncu_id.nunique() == 240 and list(df.drop_duplicates("ncu_id").ncu_id) == list(range(240))
    wide = wide_metrics(df)
    assert wide.shape == (240, 7 + 38)
    # line 26: "0",...,"(32, 16, 1)","(1, 1, 1)","0","8.0","Launch Statistics","Function Cache Configuration","","CachePreferNone"
    k0 = wide.iloc[0]
    assert (k0.ncu_id, k0.pid, k0.stream, k0.block, k0.grid) == (0, 102476, 7, "32,16,1", "1,1,1")
    assert _one(df, 0, "Function Cache Configuration").text == "CachePreferNone"
    # line 29: "0",...,"Shared Memory Configuration Size","byte","16,384"
    assert _one(df, 0, "Shared Memory Configuration Size").value == 16384.0
    # line 9392: "239",...,"(32, 8, 1)","(32768, 1, 1)",...,"Registers Per Thread","register/thread","38"
    k = wide.iloc[239]
    assert (k.block, k.grid, k["Registers Per Thread"]) == ("32,8,1", "32768,1,1", 38.0)
    assert k["name"].startswith("void at::native::<unnamed>::adaptive_average_pool<float>")
    assert len(df.attrs["rules"]) == 283


def test_conv2d_app_stdout_preamble():
    df = read_ncu_csv(_real(CONV))  # 12 lines of ==PROF== and application stdout before the header
    assert df.ncu_id.unique().tolist() == [0] and len(df) == 60
    # line 14: "0","17313",...,"dram__bytes.sum","byte","66,048"
    r = _one(df, 0, "dram__bytes.sum")
    assert (r.value, r.pid, r.stream) == (66048.0, 17313, 7)
    assert r["name"].startswith("void implicit_convolve_sgemm<float, float, (int)128")
    # line 66: "LaunchStats","","","","LaunchConfiguration","WRN","The grid for this launch ..."
    (rule,) = [x for x in df.attrs["rules"] if x["rule"] == "LaunchConfiguration"]
    assert (rule["ncu_id"], rule["section"], rule["type"]) == (0, "LaunchStats", "WRN")
    assert rule["description"].startswith("The grid for this launch is configured to execute only 64 blocks")


# ---------------------------------------------------------------- CC 12.0 details files (auto-scaled units)

# docs/formats.md#ncu-units: --print-units auto scales with SI factor 1000 (also bytes); what each printed unit is in base units.
BY_HAND = {"Mbyte": ("byte", 1e6), "Kbyte": ("byte", 1e3), "byte": ("byte", 1.0), "us": ("second", 1e-6),
           "Ghz": ("hz", 1e9), "Gbyte/s": ("byte/second", 1e9)}
# (file, line, metric, printed unit, printed value, value in base units) read by hand from the files
CC120_VALUES = [
    (CC120_GEMM, 2, "dram__bytes_read.sum", "Mbyte", "17.50", 17_500_000.0),
    (CC120_GEMM, 7, "gpu__time_duration.sum", "us", "111.81", 111.81e-6),
    (CC120_GEMM, 12, "SM Frequency", "Ghz", "2.00", 2.0e9),
    (CC120_GEMM, 23, "Memory Throughput", "Gbyte/s", "156.55", 156.55e9),
    (CC120_FMHA, 3, "dram__bytes_write.sum", "Mbyte", "6.02", 6_020_000.0),
    (CC120_FMHA, 7, "gpu__time_duration.sum", "us", "160.74", 160.74e-6),
    (CC120_SILU, 2, "dram__bytes_read.sum", "Kbyte", "97.54", 97_540.0),
    (CC120_SILU, 7, "gpu__time_duration.sum", "us", "3.14", 3.14e-6),
]


def _csv_rows(path: Path) -> tuple[list[str], list[dict]]:
    """The header and the rows (as dicts; a short metric row has no rule fields) by the csv module; lines before
    the header (``==PROF==`` preamble, docs/formats.md#ncu-numbers) and ``==PROF==`` lines after it are skipped."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("==")]
    start = next(i for i, r in enumerate(rows) if r[0] == "ID")
    return rows[start], [dict(zip(rows[start], r)) for r in rows[start + 1:]]


@pytest.mark.parametrize("name", [CC120_GEMM, CC120_FMHA, CC120_SILU])
def test_cc120_details_counts_identity_and_na(name):
    header, rows = _csv_rows(_real(name))
    metric_rows = [r for r in rows if r["Metric Name"]]
    rule_rows = [r for r in rows if not r["Metric Name"]]
    na = [r["Metric Name"] for r in metric_rows if r["Metric Value"] == "n/a"]
    kernels = {(r["ID"], r["Grid Size"], r["Block Size"], r["Device"], r["CC"], r["Process ID"], r["Stream"])
               for r in rows}
    # What PROVENANCE.md reports: 20 columns, 44 metric rows (43 names), 3 n/a, 4 rule rows, 1 kernel on CC 12.0.
    assert len(header) == 20 and {"Block Size", "Grid Size", "Device", "CC"} <= set(header)
    assert "Kernel Time" not in header
    assert (len(metric_rows), len({r["Metric Name"] for r in metric_rows}), len(na), len(rule_rows)) == (44, 43, 3, 4)
    assert len(kernels) == 1
    ((ncu_id, grid, block, device, cc, pid, stream),) = kernels
    assert cc == "12.0"

    df = read_ncu_csv(_real(name))
    assert list(df.columns) == LONG_COLUMNS and df.attrs["page"] == "details"
    assert len(df) == len(metric_rows) and df["metric"].nunique() == len({r["Metric Name"] for r in metric_rows})
    assert list(df["metric"]) == [r["Metric Name"] for r in metric_rows]
    # n/a is missing (NaN), never 0; its text is kept
    missing = df[df["value"].isna()]
    assert sorted(missing["metric"]) == sorted(na) and set(missing["text"]) == {"n/a"}
    assert len(df.attrs["rules"]) == len(rule_rows)
    assert [(x["section"], x["rule"], x["type"], x["speedup_type"]) for x in df.attrs["rules"]] == [
        (r["Section Name"], r["Rule Name"], r["Rule Type"], r["Estimated Speedup Type"]) for r in rule_rows]
    assert [x["speedup"] for x in df.attrs["rules"] if x["speedup_type"]] == [
        float(r["Estimated Speedup"]) for r in rule_rows if r["Estimated Speedup Type"]]
    # identity: "(332, 1, 1)" -> "332,1,1"; Device as an integer ordinal; CC per device
    assert set(df["ncu_id"]) == {int(ncu_id)}
    assert set(df["grid"]) == {grid.strip("()").replace(" ", "")} and set(df["block"]) == {block.strip("()").replace(" ", "")}
    assert set(df["device"]) == {int(device)} and str(df["device"].dtype) == "Int64"
    assert set(df["pid"]) == {int(pid)} and set(df["stream"]) == {int(stream)}
    assert df.attrs["compute_capability"] == {int(device): cc}

    wide = wide_metrics(df)
    assert len(wide) == 1
    # "Memory Throughput" is in two sections (% of peak and Gbyte/s): two columns, named by section
    doubled = [r["Section Name"] for r in metric_rows if r["Metric Name"] == "Memory Throughput"]
    assert len(doubled) == 2
    assert [c for c in wide.columns if c.endswith("Memory Throughput")] == [f"{s}: Memory Throughput" for s in doubled]
    # the identity columns (ncu_id, pid, device, name, stream, grid, block), then one column per metric row
    assert wide.shape[1] == 7 + len(metric_rows) and wide.loc[0, "device"] == int(device)
    assert wide.loc[0, ["grid", "block"]].tolist() == [df["grid"].iloc[0], df["block"].iloc[0]]
    # every numeric cell converts with the unit's SI factor, computed here from the CSV text
    for r in metric_rows:
        if r["Metric Unit"] in BY_HAND:
            unit, factor = BY_HAND[r["Metric Unit"]]
            got = df[(df["section"] == r["Section Name"]) & (df["metric"] == r["Metric Name"])].iloc[0]
            assert got["unit"] == unit and got["raw_unit"] == r["Metric Unit"], r["Metric Name"]
            assert got["value"] == pytest.approx(float(r["Metric Value"].replace(",", "")) * factor), r["Metric Name"]


@pytest.mark.parametrize(("name", "line", "metric", "raw_unit", "printed", "expected"), CC120_VALUES)
def test_cc120_auto_scaled_units_by_hand(name, line, metric, raw_unit, printed, expected):
    with open(_real(name), newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    header, row = rows[0], dict(zip(rows[0], rows[line - 1]))
    assert (row["Metric Name"], row["Metric Unit"], row["Metric Value"]) == (metric, raw_unit, printed)
    df = read_ncu_csv(_real(name))
    got = df[(df["metric"] == metric) & (df["section"] == row["Section Name"])]
    assert len(got) == 1
    assert got["value"].iloc[0] == pytest.approx(expected, rel=1e-12)
    assert (got["unit"].iloc[0], got["raw_unit"].iloc[0], got["text"].iloc[0]) == (BY_HAND[raw_unit][0], raw_unit, printed)


def test_kernel_time_layout_has_no_device():
    df = read_ncu_csv(_real(BERT))  # 2021-era "Kernel Time" identity columns: no Device, no CC
    assert df["device"].isna().all() and str(df["device"].dtype) == "Int64"
    assert df.attrs["compute_capability"] == {}
    pool = read_ncu_csv(_real(POOL))  # "Block Size"/"Grid Size"/"Device"/"CC" layout on an A100
    _, rows = _csv_rows(_real(POOL))
    assert set(pool["device"]) == {int(r["Device"]) for r in rows if r.get("Device")}
    assert pool.attrs["compute_capability"] == {int(r["Device"]): r["CC"] for r in rows if r.get("Device")}


# ---------------------------------------------------------------- synthetic variants

DETAILS_HDR = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream",'
               '"Section Name","Metric Name","Metric Unit","Metric Value"\n')
K0 = '"0","11","python","h","k_a","2023-May-09 15:12:33","1","7",'
K1 = '"1","11","python","h","k_b, with comma","2023-May-09 15:12:34","1","13",'


def _write(tmp_path, text: str, name="run.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_raw_page_with_units_row(tmp_path):
    hdr = ('"ID","Process ID","Process Name","Host Name",'
           '"thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg","Kernel Name","Context",'
           '"Stream","Block Size","Grid Size","Device","CC","dram__bytes.sum","gpu__time_duration.sum",'
           '"launch__func_cache_config","sm__cycles_elapsed.avg.per_second","smsp__inst_executed.sum"\n')
    units = '"","","","","","","","","","","","","Kbyte","usecond","","Ghz","inst"\n'
    r0 = '"0","5","python","h","1  ""<default domain>:step:none:none:none:none:none:none""","k_a","1","7","(128, 1, 1)","(64, 2, 1)","0","9.0","1.5","2.5","CachePreferNone","1.98","1,024"\n'
    r1 = '"1","5","python","h","","k_b","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","n/a","0.5","CachePreferL1","1.98","7"\n'
    df = read_ncu_csv(_write(tmp_path, hdr + units + r0 + r1))
    assert df.attrs["page"] == "raw"
    assert set(df.metric) == {"dram__bytes.sum", "gpu__time_duration.sum", "launch__func_cache_config",
                              "sm__cycles_elapsed.avg.per_second", "smsp__inst_executed.sum"}  # NVTX column is not a metric
    r = _one(df, 0, "dram__bytes.sum")
    assert (r.value, r.unit, r.raw_unit, r.text, r.grid, r.block) == (1500.0, "byte", "Kbyte", "1.5", "64,2,1", "128,1,1")
    assert r.section is None
    r = _one(df, 0, "gpu__time_duration.sum")
    assert r.value == pytest.approx(2.5e-6) and r.unit == "second"
    assert _one(df, 0, "sm__cycles_elapsed.avg.per_second").value == pytest.approx(1.98e9)
    assert _one(df, 0, "smsp__inst_executed.sum").value == 1024.0
    assert math.isnan(_one(df, 1, "dram__bytes.sum").value) and _one(df, 1, "dram__bytes.sum").text == "n/a"
    wide = wide_metrics(df)
    assert wide.attrs["units"] == {"dram__bytes.sum": "byte", "gpu__time_duration.sum": "second",
                                   "launch__func_cache_config": "", "sm__cycles_elapsed.avg.per_second": "hz",
                                   "smsp__inst_executed.sum": "inst"}
    assert list(wide.columns[:7]) == ["ncu_id", "pid", "device", "name", "stream", "grid", "block"]
    assert math.isnan(wide.loc[1, "launch__func_cache_config"])


def test_thousands_separators_en(tmp_path):
    text = (DETAILS_HDR + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","1,234.5"\n'
            + K0 + '"Command line profiler metrics","smsp__inst_executed.sum","inst","6,400"\n'
            + K1 + '"Command line profiler metrics","dram__bytes.sum","byte","2,508,800"\n')
    df = read_ncu_csv(_write(tmp_path, text))
    assert df.attrs["locale"] == (",", ".")
    assert df.value.tolist() == [1234.5, 6400.0, 2508800.0]
    assert df.name.tolist()[-1] == "k_b, with comma" and df.stream.tolist() == [7, 7, 13]


def test_thousands_separators_dot_grouping_locale(tmp_path):
    text = (DETAILS_HDR + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","1.234,5"\n'
            + K0 + '"Command line profiler metrics","smsp__inst_executed.sum","inst","6.400"\n'
            + K1 + '"Command line profiler metrics","dram__bytes.sum","byte","2.508.800"\n')
    df = read_ncu_csv(_write(tmp_path, text))
    assert df.attrs["locale"] == (".", ",")
    assert df.value.tolist() == [1234.5, 6400.0, 2508800.0]


def test_na_and_text_values(tmp_path):
    text = (DETAILS_HDR + K0 + '"Command line profiler metrics","dram__bytes_read.sum","","n/a"\n'
            + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","n/a"\n'
            + K0 + '"Launch Statistics","Function Cache Configuration","","CachePreferNone"\n'
            + K0 + '"Command line profiler metrics","l1tex__t_bytes.sum","byte","1.5e+03"\n')
    df = read_ncu_csv(_write(tmp_path, text))
    assert df.value.iloc[:3].isna().all() and df.text.tolist() == ["n/a", "n/a", "CachePreferNone", "1.5e+03"]
    assert df.value.iloc[3] == 1500.0


def test_prof_and_app_stdout_preamble(tmp_path):
    pre = ("==PROF== Connected to process 11 (/usr/bin/python3)\n"
           "loss = 0.5, step 1\n"
           "==WARNING== Found outstanding GPU clock reset, trying to revert...\n"
           '"not", "a", "header"\n'
           '==PROF== Profiling "k_a" - 0: 0%....50%....100% - 8 passes\n'
           "==PROF== Disconnected from process 11\n")
    text = pre + DETAILS_HDR + K0 + '"Command line profiler metrics","gpu__time_duration.sum","ns","3,200"\n'
    text += "==PROF== Report: run.ncu-rep\n"
    df = read_ncu_csv(_write(tmp_path, text))
    assert len(df) == 1 and df.value.iloc[0] == pytest.approx(3.2e-6) and df.unit.iloc[0] == "second"


def test_speedup_layout_ragged_rule_rows(tmp_path):
    hdr = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
           '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
           '"Rule Description","Estimated Speedup Type","Estimated Speedup"\n')
    k = '"0","9","python","h","k_a","1","7","(384, 1, 1)","(9, 32, 1)","0","10.0",'
    text = (hdr + k + '"GPU Speed Of Light Throughput","Duration","ns","5,120",\n'
            + k + '"GPU Speed Of Light Throughput","SM Frequency","hz","1980000000",\n'
            + k + '"LaunchStats","","","","LaunchConfiguration","OPT","grid too small","global","50"\n')
    df = read_ncu_csv(_write(tmp_path, text))
    assert df.metric.tolist() == ["Duration", "SM Frequency"]
    assert df.value.tolist() == [pytest.approx(5.12e-6), 1.98e9] and df.unit.tolist() == ["second", "hz"]
    assert df.attrs["rules"] == [{"ncu_id": 0, "section": "LaunchStats", "rule": "LaunchConfiguration",
                                  "type": "OPT", "description": "grid too small", "speedup_type": "global",
                                  "speedup": 50.0}]


@pytest.mark.parametrize(
    ("raw", "unit", "factor"),
    [("nsecond", "second", 1e-9), ("ns", "second", 1e-9), ("usecond", "second", 1e-6), ("msecond", "second", 1e-3),
     ("Kbyte", "byte", 1e3), ("Mbyte", "byte", 1e6), ("cycle/second", "hz", 1.0), ("hz", "hz", 1.0),
     ("Ghz", "hz", 1e9), ("cycle/nsecond", "hz", 1e9), ("Gbyte/second", "byte/second", 1e9),
     ("register/thread", "register/thread", 1.0), ("byte/block", "byte/block", 1.0), ("%", "%", 1.0),
     ("", "", 1.0), ("SM", "SM", 1.0), ("cluster", "cluster", 1.0), ("inst", "inst", 1.0)],
)
def test_normalize_unit(raw, unit, factor):
    got_unit, got_factor = normalize_unit(raw)
    assert got_unit == unit and got_factor == pytest.approx(factor)


# ---------------------------------------------------------------- bad input


def test_empty_file(tmp_path):
    p = _write(tmp_path, "\n  \n")
    with pytest.raises(NcuCsvError) as e:
        read_ncu_csv(p)
    assert isinstance(e.value, InputError)
    assert str(e.value) == (
        f"{p}: line 1: the file is empty. Re-export it with `ncu -i run.ncu-rep --csv --page raw --print-units base "
        "> file.csv`; with -o/--export and no --page, ncu prints nothing (docs/DESIGN.md §3, ncu)")


def test_no_header(tmp_path):
    p = _write(tmp_path, "==PROF== Connected to process 3\nhello\n  k_a  Duration  ns  3200\n")
    with pytest.raises(NcuCsvError) as e:
        read_ncu_csv(p)
    assert str(e.value) == (
        f'{p}: lines 1-3: no ncu CSV header (a line starting with "ID",) was found. Pass the output of `ncu --csv` '
        "(details or raw page), not the console report; the expected header starts "
        '"ID","Process ID","Process Name","Host Name","Kernel Name",...')


def test_non_numeric_metric(tmp_path):
    text = (DETAILS_HDR + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","128"\n'
            + K1 + '"Command line profiler metrics","dram__bytes.sum","byte","lots"\n')
    p = _write(tmp_path, text)
    with pytest.raises(NcuCsvError) as e:
        read_ncu_csv(p)
    assert str(e.value) == (
        f"{p}: line 3, field 'Metric Value' (metric 'dram__bytes.sum', ID 1): 'lots' is not a number but the metric "
        "has unit 'byte'. The file is damaged or not ncu output; re-export it with `ncu -i run.ncu-rep --csv "
        "--print-units base` (docs/DESIGN.md §3, ncu)")


def test_non_numeric_raw_column(tmp_path):
    text = ('"ID","Kernel Name","dram__bytes.sum"\n"","","byte"\n"0","k_a","12"\n"1","k_b","?"\n')
    p = _write(tmp_path, text)
    with pytest.raises(NcuCsvError, match=r"line 4, field 'dram__bytes.sum' \(metric 'dram__bytes.sum', ID 1\): "
                                          r"'\?' is not a number"):
        read_ncu_csv(p)


def test_err_nvgpuctrperm_only(tmp_path):
    line = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
            "Counters on the target device 0. For instructions on enabling permissions and to get more "
            "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM")
    p = _write(tmp_path, f"==PROF== Connected to process 42 (/usr/bin/python3)\n{line}\n"
                         "==PROF== Disconnected from process 42\n==WARNING== No kernels were profiled.\n")
    with pytest.raises(NcuCsvError) as e:
        read_ncu_csv(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: line 2: this is the output of a failed ncu run, ncu reported: {line!r}. ")
    assert "permission to access GPU performance counters" in msg
    assert "https://developer.nvidia.com/ERR_NVGPUCTRPERM" in msg and "--clock-control none" in msg
    assert "\n" not in msg


def test_header_without_rows(tmp_path):
    p = _write(tmp_path, DETAILS_HDR + "==WARNING== No kernels were profiled.\n")
    with pytest.raises(NcuCsvError, match=r"line 1: the CSV header has no result rows: ncu profiled no kernel"):
        read_ncu_csv(p)


def test_mixed_locales(tmp_path):
    text = (DETAILS_HDR + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","1,234.5"\n'
            + K1 + '"Command line profiler metrics","dram__bytes.sum","byte","1.234,5"\n')
    with pytest.raises(NcuCsvError, match="two different digit-grouping conventions"):
        read_ncu_csv(_write(tmp_path, text))


def test_bad_id(tmp_path):
    text = DETAILS_HDR + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","1"\n' + "step 2 done\n"
    with pytest.raises(NcuCsvError, match=r"line 3, field ID: 'step 2 done' is not a result ID"):
        read_ncu_csv(_write(tmp_path, text))


# The stage and the CLI (opprof ncu, rule parse_ncu) ----------------------------------------------------


def test_opprof_ncu_writes_one_row_per_kernel_with_occurrences_and_units(tmp_path):
    import subprocess
    import sys

    import pandas as pd

    dropout = _real("a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv")
    out = tmp_path / "ncu.parquet"
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "ncu", str(dropout), "--out", str(out)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    table = pd.read_parquet(out)
    assert len(table) == 162 and table["ncu_id"].tolist() == list(range(162))
    assert table["occurrence"].tolist() == list(range(162))  # one kernel name, in launch order
    assert (table["match_key"] == table["name"]).all()
    assert table.attrs["units"]["dram__bytes.sum"] == "byte"


def test_opprof_ncu_on_a_failed_run_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "failed.csv"
    bad.write_text("==PROF== Connected to process 4242 (/usr/bin/python3.11)\n"
                   "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
                   "Counters on the target device 0. For instructions on enabling permissions and to get more "
                   "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n")
    out = tmp_path / "ncu.parquet"
    result = subprocess.run([sys.executable, "-m", "operator_profiler.cli", "ncu", str(bad), "--out", str(out)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ERR_NVGPUCTRPERM" in lines[0] and str(bad) in lines[0]
    assert not out.exists()


def test_an_ncu_rep_is_exported_with_ncu_from_path_or_refused_clearly(tmp_path):
    """The ``ncu`` here is a fake (a test double that writes a saved CSV): real Nsight Compute cannot
    run on the test machine. Without ncu on PATH the error says how to export by hand."""
    import json
    import subprocess
    import sys

    report = tmp_path / "run.ncu-rep"
    report.write_bytes(b"binary report")
    dropout = _real("a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv")
    empty_bin = tmp_path / "empty"
    empty_bin.mkdir()
    cmd = [sys.executable, "-m", "operator_profiler.cli", "ncu", str(report), "--out", str(tmp_path / "n.parquet")]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "PATH": str(empty_bin)})
    assert result.returncode == 1 and "needs Nsight Compute's 'ncu' on PATH" in result.stderr
    assert "Traceback" not in result.stderr
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.jsonl"
    write_tool(bin_dir, "ncu", "# FAKE ncu (test double)\nimport json, sys\n"
               f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
               f"sys.stdout.write(open({str(dropout)!r}).read())\n")
    result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    (args,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert args[:2] == ["-i", str(report)] and "--csv" in args and args[args.index("--page") + 1] == "raw"
    assert args[args.index("--print-kernel-base") + 1] == "mangled"
    assert "162 kernels" in result.stdout


def test_concatenated_runs_are_refused_not_merged(tmp_path):
    """Found by a new user: two ncu outputs concatenated (IDs 0..n, then 0.. again, no second header) lost half of
    their results without a word (rows of equal ID merged). Now a one-line error names the line."""
    text = (DETAILS_HDR + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","1"\n'
            + K0.replace('"0",', '"1",', 1) + '"Command line profiler metrics","dram__bytes.sum","byte","2"\n'
            + K0 + '"Command line profiler metrics","dram__bytes.sum","byte","3"\n')
    path = tmp_path / "two_runs.csv"
    path.write_text(text)
    with pytest.raises(NcuCsvError, match=r"line 4, field ID: ID 0 follows ID 1: the IDs start again"):
        read_ncu_csv(path)


def test_ids_naming_two_results_are_refused(tmp_path):
    """Found by a new user: IDs numbered per process and interleaved (process 7001's 0, process 7002's 0, ...), or
    one ID written twice, were merged into one result each: half the results gone, the metrics renamed."""
    metric = '"Command line profiler metrics","dram__bytes.sum","byte","{}"\n'
    per_process = (DETAILS_HDR + K0 + metric.format(1) + K0.replace('"11"', '"12"') + metric.format(2))
    twice = DETAILS_HDR + K0 + metric.format(1) + K0 + metric.format(2)
    for name, text in (("per_process.csv", per_process), ("twice.csv", twice)):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(NcuCsvError, match=r"line 3, field ID: ID 0 names more than one result"):
            read_ncu_csv(path)


def test_thousands_told_apart_by_whole_number_counters(tmp_path, caplog):
    """Found by a new user: written where '.' groups thousands, 4.096 bytes was read as 4.096 (1000x too small).
    A byte counter (dram__bytes.sum) is a whole number, so its 4.096 is 4,096. Without such a counter the file
    cannot tell, and opprof ncu says so."""
    from operator_profiler import stages

    cell = '"Command line profiler metrics","{}","{}","{}"\n'
    grouped = DETAILS_HDR + K0 + cell.format("dram__bytes.sum", "byte", "4.096") \
        + K0 + cell.format("lts__t_bytes.sum", "byte", "12.288")
    path = tmp_path / "de.csv"
    path.write_text(grouped)
    assert read_ncu_csv(path)["value"].tolist() == [4096.0, 12288.0]
    unsure = DETAILS_HDR + K0 + cell.format("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "1.234")
    path = tmp_path / "unsure.csv"
    path.write_text(unsure)
    with caplog.at_level("WARNING"):
        table = stages.parse_ncu_files([path], tmp_path / "unsure.parquet")
    assert table["sm__throughput.avg.pct_of_peak_sustained_elapsed"].tolist() == [1.234]
    assert any("'1.234', which reads as 1.234 (decimal point) or as 1234" in r.message for r in caplog.records)
