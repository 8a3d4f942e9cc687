"""The ncu metric catalog (``ncu/metrics.yaml``): validation, spelling against the docs and the real
CSVs, aggregation rules (the two-kernel acceptance example) and bottleneck labels."""

from __future__ import annotations

import csv
import math
import re
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REAL_DATA, SHARED, need_real

from operator_profiler.config import ConfigError
from operator_profiler.ncu.catalog import (
    ARCHS,
    aggregate,
    arch_for_cc,
    bottleneck,
    label_bottlenecks,
    load_catalog,
    validate_catalog,
)

NCU_DIR = REAL_DATA / "ncu"
NCU_MD = SHARED / "docs" / "ncu.md"
PACKAGED = Path(__file__).resolve().parents[1] / "src" / "operator_profiler" / "ncu" / "metrics.yaml"

# Names taken from widespread public ncu usage but not (yet) in ncu.md or a real CSV: each is marked
# "check:" in metrics.yaml, to be confirmed with `ncu --query-metrics` on a GPU machine (docs/formats.md#ncu-gpu-checks).
UNVERIFIED = {
    "lts__t_sectors_lookup_miss.sum",
    "sm__inst_executed.avg.per_cycle_active",
    "smsp__thread_inst_executed_per_inst_executed.ratio",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "sm__pipe_tensor_subpipe_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
}


@cache
def _real_rows(name: str) -> tuple[tuple[str, ...], list[list[str]]]:
    """Header and rows of a real details-page CSV (preamble lines skipped)."""
    lines = (NCU_DIR / name).read_text(encoding="utf-8", errors="replace").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    reader = csv.reader(lines[start:])
    return tuple(next(reader)), list(reader)


@cache
def _real_metric_names() -> frozenset[str]:
    names = set()
    for path in sorted(need_real(NCU_DIR).glob("*.csv")):
        header, rows = _real_rows(path.name)
        col = header.index("Metric Name")
        names.update(row[col] for row in rows if len(row) > col and row[col])
    return frozenset(names)


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


# --------------------------------------------------------------------------------------------------
# The packaged catalog


def test_packaged_catalog_loads_and_covers_the_issue(catalog):
    assert len(catalog.metrics) >= 20
    assert len(set(catalog.names)) == len(catalog.names)
    units = {m.name: m.unit for m in catalog.metrics}
    rules = {m.name: m.rule for m in catalog.metrics}
    assert units["kernel_time"] == "ns" and rules["kernel_time"] == "sum"
    assert units["dram_bytes"] == "bytes" and rules["dram_bytes"] == "sum"
    assert units["dram_throughput"] == "bytes/s" and rules["dram_throughput"] == "ratio"
    assert rules["sm_sol"] == rules["memory_sol"] == rules["achieved_occupancy"] == "duration_weighted_mean"
    assert rules["l2_hit_rate"] == "ratio" and rules["registers_per_thread"] == "max"
    for key in ("l1_hit_rate", "tensor_pipe_active", "issue_active", "stall_long_scoreboard", "inst_executed",
                "ipc", "threads_per_warp", "local_load_bytes", "local_store_bytes", "shared_bank_conflicts"):
        assert key in catalog.names
    assert catalog.bottleneck["compute_metric"] == "sm_sol"


def test_replay_metrics_per_architecture(catalog):
    ampere, hopper, blackwell = (catalog.replay_metrics(a) for a in ARCHS)
    gmma = "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_elapsed"
    assert gmma in hopper and gmma not in ampere and gmma not in blackwell
    assert "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed" in hopper  # inherited
    assert "sm__pipe_tensor_subpipe_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed" in blackwell
    union = catalog.replay_metrics()
    assert set(ampere) | set(hopper) | set(blackwell) == set(union) and len(union) == len(set(union))
    assert "Duration" not in union  # details-page labels are never passed to --metrics
    arg = catalog.metrics_argument("hopper")
    assert arg.split(",") == hopper and " " not in arg
    assert [arch_for_cc(cc) for cc in ("8.0", "8.9", 9.0, "10.0", "12.1")] == \
        ["ampere", "ampere", "hopper", "blackwell", "blackwell"]
    with pytest.raises(ValueError, match="unknown architecture"):
        catalog.replay_metrics("volta")


def test_resolve_first_present_wins_then_labels(catalog):
    columns = ["ID", "gpu__time_duration.sum", "Duration", "Registers Per Thread", "dram__bytes.sum"]
    resolved = catalog.resolve(columns)
    assert resolved["kernel_time"] == "gpu__time_duration.sum"
    assert resolved["registers_per_thread"] == "Registers Per Thread"
    assert resolved["dram_bytes"] == "dram__bytes.sum"
    assert "sm_sol" not in resolved
    assert catalog.resolve(["Duration"])["kernel_time"] == "Duration"


def test_every_ncu_name_is_spelled_as_documented(catalog):
    doc = need_real(NCU_MD).read_text()
    known = _real_metric_names()
    stall = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
    reasons = doc.split("reasons:", 1)[1].split("\n", 1)[0]
    yaml_lines = PACKAGED.read_text().splitlines()
    for name in catalog.replay_metrics():
        if name in known or f"`{name}`" in doc or name in doc.replace("`", " ").split():
            continue
        if (m := stall.fullmatch(name)) and re.search(rf"\b{m.group(1)}\b", reasons):
            continue
        assert name in UNVERIFIED, f"{name} is neither in ncu.md nor in a real CSV"
        assert any(name in line and "check:" in line for line in yaml_lines), f"{name} lacks a 'check:' mark"
    for metric in catalog.metrics:
        for label in metric.labels:
            assert label in known or f"`{label}`" in doc, label


def test_real_csv_names_resolve(catalog):
    known = _real_metric_names()
    resolved = catalog.resolve(known)
    for name in ("kernel_time", "dram_bytes", "dram_sol", "sm_sol", "memory_sol", "l2_sol", "l1_sol", "l2_bytes",
                 "l1_bytes", "tensor_inst", "shared_wavefronts", "shared_bank_conflicts",
                 "achieved_occupancy", "theoretical_occupancy", "registers_per_thread", "waves_per_sm"):
        assert name in resolved, name


def test_real_dropout_file_aggregates(catalog):
    need_real(NCU_DIR / "a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv")
    header, rows = _real_rows("a100_pytorch_dropout_162launches_metrics_only_kerneltime.csv")
    idx = {k: header.index(k) for k in ("ID", "Metric Name", "Metric Value")}
    long = pd.DataFrame({k: [r[i] for r in rows] for k, i in idx.items()})
    long["Metric Value"] = pd.to_numeric(long["Metric Value"].str.replace(",", ""), errors="coerce")
    wide = long.pivot(index="ID", columns="Metric Name", values="Metric Value").reset_index()
    wide["op"] = "dropout"
    table = aggregate(wide, "op", catalog, duration_column="absent")  # weights fall back to ncu's kernel_time
    row = table.iloc[0]
    assert row["kernels"] == row["counters_kernels"] == 162
    assert row["dram_bytes"] == pytest.approx(wide["dram__bytes.sum"].sum())
    t = wide["gpu__time_duration.sum"]
    sol = wide["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"]
    assert row["memory_sol"] == pytest.approx((sol * t).sum() / t.sum())
    assert row["dram_throughput"] == pytest.approx(wide["dram__bytes.sum"].sum() / t.sum() * 1e9)


# --------------------------------------------------------------------------------------------------
# Broken catalogs


def _raw() -> dict:
    return yaml.safe_load(PACKAGED.read_text())


def _metric(raw: dict, name: str) -> dict:
    return next(m for m in raw["metrics"] if m["name"] == name)


def test_unknown_rule_names_the_key():
    raw = _raw()
    _metric(raw, "sm_sol")["rule"] = "average"
    with pytest.raises(ConfigError, match=r"metrics\[\d+\]\.rule \(metric 'sm_sol'\).*'average'.*duration_weighted_mean"):
        validate_catalog(raw)


def test_missing_unit_names_the_key():
    raw = _raw()
    del _metric(raw, "dram_bytes")["unit"]
    with pytest.raises(ConfigError, match=r"metrics\[\d+\] \(metric 'dram_bytes'\): missing key 'unit'"):
        validate_catalog(raw)


def test_ratio_naming_unknown_metric():
    raw = _raw()
    _metric(raw, "l2_hit_rate")["denominator"] = ["l2_sector_hits", "l2_sectors_missed"]
    with pytest.raises(ConfigError, match=r"metrics\[\d+\]\.denominator \(metric 'l2_hit_rate'\): unknown metric "
                                          r"'l2_sectors_missed'"):
        validate_catalog(raw)


def test_other_broken_catalogs(tmp_path):
    raw = _raw()
    del _metric(raw, "l2_hit_rate")["numerator"]
    with pytest.raises(ConfigError, match=r"\(metric 'l2_hit_rate'\): missing key 'numerator'"):
        validate_catalog(raw)
    raw = _raw()
    _metric(raw, "sm_sol")["ncu"] = {"ampere": ["sm throughput"]}
    with pytest.raises(ConfigError, match=r"metrics\[\d+\]\.ncu\.ampere\[0\] \(metric 'sm_sol'\).*ncu metric name"):
        validate_catalog(raw)
    raw = _raw()
    raw["bottleneck"]["memory_metric"] = "mem"
    with pytest.raises(ConfigError, match=r"bottleneck\.memory_metric: unknown metric 'mem'"):
        validate_catalog(raw)
    raw = _raw()
    raw["metrics"].append(dict(_metric(raw, "sm_sol")))
    with pytest.raises(ConfigError, match="duplicate metric name 'sm_sol'"):
        validate_catalog(raw)
    bad = tmp_path / "bad.yaml"
    bad.write_text("metrics: [\n")
    with pytest.raises(ConfigError, match="cannot read metric catalog"):
        load_catalog(bad)
    good = tmp_path / "good.yaml"
    good.write_text(PACKAGED.read_text())
    assert load_catalog(good).names == load_catalog().names


# --------------------------------------------------------------------------------------------------
# Aggregation rules

SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM = "dram__bytes.sum"
HIT, MISS, HITRATE = "lts__t_sectors_lookup_hit.sum", "lts__t_sectors_lookup_miss.sum", "lts__t_sector_hit_rate.pct"


def test_acceptance_two_kernel_operator(catalog):
    """The acceptance example: durations 900/100 ns, SM SOL 80/20 % -> 74 %; DRAM bytes 1000 + 3000 -> 4000.
    ncu's own kernel time (deliberately the other way round) is not the weight."""
    df = pd.DataFrame({"op": ["gemm", "gemm"], "duration_ns": [900.0, 100.0], SM: [80.0, 20.0], DRAM: [1000, 3000],
                       "gpu__time_duration.sum": [100.0, 900.0]})
    row = aggregate(df, ["op"], catalog).iloc[0]
    assert row["sm_sol"] == pytest.approx(74.0)
    assert row["dram_bytes"] == 4000
    assert row["kernel_time"] == 1000
    assert row["kernels"] == row["counters_kernels"] == 2
    assert row["sm_sol_coverage"] == row["dram_bytes_coverage"] == 1.0


def test_ratio_recomputed_from_summed_components(catalog):
    df = pd.DataFrame({"op": ["a", "a"], "duration_ns": [500.0, 500.0], HIT: [90, 10], MISS: [10, 990],
                       HITRATE: [90.0, 1.0]})
    row = aggregate(df, "op", catalog).iloc[0]
    assert row["l2_hit_rate"] == pytest.approx(100 * 100 / 1100)  # 9.09 %, not the mean of rates 45.5 %
    assert row["l2_hit_rate"] != pytest.approx(df[HITRATE].mean())
    # Without the components, the metric's own column is duration-weighted instead.
    row = aggregate(df.drop(columns=[MISS]), "op", catalog).iloc[0]
    assert row["l2_hit_rate"] == pytest.approx(45.5)


def test_nan_safe_and_grouped(catalog):
    df = pd.DataFrame({
        "model": ["m"] * 5, "op": ["a", "a", "a", "b", "b"],
        "duration_ns": [100.0, 300.0, 600.0, 10.0, 10.0],
        SM: [50.0, None, 10.0, None, None],
        DRAM: [1.0, 2.0, None, None, None],
        "launch__registers_per_thread": [32, 128, 64, None, 40],
        HIT: [1, 2, None, None, None], MISS: [1, None, 3, None, None],
    })
    table = aggregate(df, ["model", "op"], catalog).set_index("op")
    a, b = table.loc["a"], table.loc["b"]
    assert list(table.columns[:3]) == ["model", "kernels", "counters_kernels"]
    assert a["sm_sol"] == pytest.approx((50 * 100 + 10 * 600) / 700)  # the NaN kernel's 300 ns is no weight
    assert a["sm_sol_coverage"] == pytest.approx(2 / 3)
    assert a["dram_bytes"] == 3 and a["registers_per_thread"] == 128
    assert a["l2_hit_rate"] == pytest.approx(50.0)  # only the kernel with both hits and misses
    assert a["l2_hit_rate_coverage"] == pytest.approx(1 / 3)
    assert math.isnan(b["sm_sol"]) and b["sm_sol_coverage"] == 0
    assert math.isnan(b["dram_bytes"]) and math.isnan(b["l2_hit_rate"])
    assert b["registers_per_thread"] == 40 and b["counters_kernels"] == 1 and b["kernels"] == 2
    assert "tensor_pipe_active" not in table.columns  # metrics absent from the data are omitted


def test_string_values_and_missing_weights(catalog):
    df = pd.DataFrame({"op": ["a", "a"], SM: ["n/a", "40"], DRAM: ["5", "n/a"]})
    with pytest.raises(ValueError, match="cannot weight 'sm_sol'"):
        aggregate(df, "op", catalog)
    row = aggregate(df.assign(duration_ns=[1.0, 1.0]), "op", catalog).iloc[0]
    assert row["sm_sol"] == 40 and row["dram_bytes"] == 5


# --------------------------------------------------------------------------------------------------
# Bottleneck labels


@pytest.mark.parametrize(("sm", "mem", "label"), [
    (85.0, 20.0, "compute-bound"),
    (15.0, 90.0, "memory-bound"),
    (10.0, 12.0, "latency-bound"),
    (70.0, 75.0, "balanced"),
    (None, 50.0, "unknown"),
    (float("nan"), 50.0, "unknown"),
])
def test_bottleneck_labels(catalog, sm, mem, label):
    assert bottleneck({"sm_sol": sm, "memory_sol": mem}, catalog) == label


def test_bottleneck_on_aggregated_table(catalog):
    df = pd.DataFrame({"op": ["gemm", "copy"], "duration_ns": [1.0, 1.0], SM: [90.0, 10.0], MEM: [30.0, 95.0]})
    table = aggregate(df, "op", catalog)
    assert list(label_bottlenecks(table, catalog)) == ["compute-bound", "memory-bound"]
    assert bottleneck({}, catalog) == "unknown"
