"""Which catalog metrics a GPU's chip has (:mod:`operator_profiler.ncu.availability`), and what the replay does
with metrics ncu refuses (:func:`operator_profiler.ncu.replay.run_replay`).

Real tool output: ``tests/data/ncu-2024.1.1/`` holds the REAL answers of Nsight Compute 2024.1.1 to
``ncu --query-metrics-mode suffix --metrics <catalog bases> --chips gh100|ga100`` (PROVENANCE.md there); they
are parsed here and the ``ncu`` test double prints them (no GPU and no ncu on the test machine). The ncu
messages for refused metrics and for counters held by DCGM are quoted from real ncu output (docs/formats.md,
"ncu metric query and errors"); the fake's exit statuses for them are assumptions (not seen in real output).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest
from fake_tools import NCU_QUERY_GA100, NCU_QUERY_GH100, FakeNcu, FakeSmi

from operator_profiler.ncu import availability, replay
from operator_profiler.ncu.catalog import load_catalog

LISTED = re.compile(r"^(\S+)\s+(Counter|Ratio|Throughput)\s")  # a table row: name, then its metric type


def real_text(path) -> str:
    return gzip.open(path, "rt").read()


def rows_of(text: str) -> set[str]:
    """The metric names of a query table, read independently of the parser: rows whose second column is a type."""
    return {m.group(1) for m in map(LISTED.match, text.splitlines()) if m}


@pytest.mark.parametrize("path, chip", [(NCU_QUERY_GH100, "gh100"), (NCU_QUERY_GA100, "ga100")])
def test_real_query_output_parses_to_the_table_rows(path, chip):
    text = real_text(path)
    parsed = availability.parse_query_output(text)
    assert parsed["chips"] == [chip] and parsed["device"] is None
    assert parsed["names"] == rows_of(text)
    warned = text.splitlines()[text.splitlines().index(
        "==WARNING== The below metrics are either invalid or don't have suffixes.") + 1]
    assert parsed["invalid"] == warned.split(",")
    # every full name the catalog asks for on that chip's architecture is in ncu's answer, except the
    # launch/occupancy attributes (no rollup suffix: ncu lists them as "invalid or without suffixes")
    arch = {"gh100": "hopper", "ga100": "ampere"}[chip]
    wanted = load_catalog().replay_metrics(arch)
    assert [n for n in wanted if n not in parsed["names"]] == [n for n in wanted if "." not in n]
    assert {n for n in wanted if "." not in n} <= set(parsed["invalid"])


def test_a_local_device_header_names_the_chip():
    # The header ncu prints for a local device (ncu 2023.2 on an A100; hibagus/ECE382N-GPU-Lab README, shortened
    # there), then a wrapped description line and ncu's closing note.
    text = ("Device NVIDIA A100-PCIE-40GB (GA100)\n----------------- ------------ ------------ ------\n"
            "Metric Name       Metric Type  Metric Unit  Metric Description\n"
            "----------------- ------------ ------------ ------\n"
            "dram__bytes       Counter      byte         # of bytes accessed in DRAM\n"
            "dram__bytes_read  Counter      byte         # of bytes read from DRAM\n"
            "                                            (wrapped description)\n"
            "==PROF== Note that these metrics must be appended with a valid suffix before profiling them.\n")
    parsed = availability.parse_query_output(text)
    assert parsed == {"chips": ["ga100"], "device": "NVIDIA A100-PCIE-40GB", "names": {"dram__bytes", "dram__bytes_read"},
                      "invalid": []}


@pytest.fixture
def ncu(tmp_path, monkeypatch):
    fake = FakeNcu(tmp_path, [["k", "(1, 1, 1)", "(32, 1, 1)"]] * 4)
    for k, v in fake.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    return fake


def test_the_chip_lacks_another_architectures_names_and_they_are_dropped_with_a_warning(ncu, tmp_path, caplog):
    union = load_catalog().replay_metrics()  # what a replay without the compute capability asked for
    record = availability.check_metrics(union, 0, (9, 0), "2024.1.1.0", tmp_path / "cache", "NVIDIA H200")
    expected_missing = [n for n in union if "." in n and n not in rows_of(real_text(NCU_QUERY_GH100))]
    assert expected_missing == ["sm__pipe_tensor_subpipe_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"]
    assert [d["name"] for d in record["dropped"]] == expected_missing
    assert record["collect"] == [n for n in union if n not in expected_missing]
    assert record["unchecked"] == ["sm__maximum_warps_per_active_cycle_pct", "launch__registers_per_thread",
                                   "launch__waves_per_multiprocessor"]
    assert record["query"]["chip"] == "gh100" and record["query"]["chip_source"] == "device"
    assert record["warnings"] == [f"1 catalog metric(s) do not exist on chip gh100 and are not collected: "
                                  f"{expected_missing[0]}"]
    assert any("do not exist on chip gh100" in r.message for r in caplog.records)
    (query,) = ncu.queries()
    assert query[:4] == ["--query-metrics-mode", "suffix", "--metrics",
                         ",".join(sorted({n.split(".")[0] for n in union if "." in n}))]
    assert query[-2:] == ["--devices", "0"]
    # cached per chip and ncu version: the next replay asks nothing
    cache = tmp_path / "cache" / "gh100.ncu-2024.1.1.0.json"
    assert json.loads(cache.read_text())["names"] == sorted(rows_of(real_text(NCU_QUERY_GH100)))
    again = availability.check_metrics(union, 0, (9, 0), "2024.1.1.0", tmp_path / "cache")
    assert again["dropped"] == record["dropped"] and again["query"]["from_cache"] is True
    assert len(ncu.queries()) == 1
    # another ncu version is another cache entry
    availability.check_metrics(union, 0, (9, 0), "2025.1.1.0", tmp_path / "cache")
    assert len(ncu.queries()) == 2


def test_a_failing_device_query_falls_back_to_the_chip_of_the_capability_and_then_keeps_every_name(
        ncu, tmp_path, monkeypatch):
    hopper = load_catalog().replay_metrics("hopper")
    monkeypatch.setenv("FAKE_NCU_QUERY_DEVICE", "fail")
    record = availability.check_metrics(hopper, 0, (9, 0), "2024.1.1.0")
    assert record["query"]["chip_source"] == "compute capability 9.0" and record["dropped"] == []
    assert [q[-2:] for q in ncu.queries()] == [["--devices", "0"], ["--chips", "gh100"]]
    monkeypatch.delenv("FAKE_NCU_QUERY")  # the fake then answers as ncu without a driver
    record = availability.check_metrics(hopper, 0, (9, 0), "2024.1.1.0")
    assert record["collect"] == hopper and record["dropped"] == []
    assert "Driver could not be loaded" in record["query"]["error"]
    assert record["warnings"][0].startswith("the chip's metrics could not be queried")


REAL_NCU_LINES = {
    # newer ncu (a warning; the collection goes on), with and without the MIG sentence
    "==WARNING== Unable to access the following 2 metrics: dram__bytes.sum, lts__t_bytes.sum.":
        {"unable": ["dram__bytes.sum", "lts__t_bytes.sum"], "not_found": []},
    "==WARNING== Unable to access the following 1 metrics: dram__bytes.sum. If profiling on a MIG instance, it is "
    "not possible to collect metrics from GPU units that are shared with other MIG instances.":
        {"unable": ["dram__bytes.sum"], "not_found": []},
    # older ncu (CUDA 11.4): the collection fails
    "==ERROR== Failed to access the following 2 metrics: dram__bytes.sum, sm__throughput.avg.pct_of_peak_sustained_elapsed":
        {"unable": ["dram__bytes.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"], "not_found": []},
    # an unknown base metric
    r"==ERROR== Failed to find metric regex:^dram__bytes\.(sum|min|max|avg|pct|ratio|max_rate)$":
        {"unable": [], "not_found": ["dram__bytes.sum"]},
}


@pytest.mark.parametrize("line", list(REAL_NCU_LINES))
def test_what_ncu_says_it_could_not_collect(line):
    requested = ["dram__bytes.sum", "lts__t_bytes.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__bytes_read.sum"]
    assert availability.inaccessible_metrics("==PROF== Connected to process 1 (python3)\n" + line, requested) == \
        REAL_NCU_LINES[line]


# ------------------------------------------------------------------------------ the replay with refused metrics

PLAN = {"class": "c", "instances": ["a", "b"], "replay_instances": ["a"], "kernel_count": 2,
        "segments": [{"launch_skip": 0, "launch_count": 2, "first_kernel_id": 0, "last_kernel_id": 1}],
        "window": {"kernel_ids": [0, 1], "pid": 1}, "warnings": []}


def test_a_collection_that_fails_on_metrics_is_run_again_without_them(ncu, tmp_path, monkeypatch):
    hopper = load_catalog().replay_metrics("hopper")
    refused = ["dram__bytes.sum", "lts__t_bytes.sum"]
    monkeypatch.setenv("FAKE_NCU_REFUSE", ",".join(refused))
    monkeypatch.setenv("FAKE_NCU_REFUSE_AS", "error")
    record = replay.run_replay(PLAN, hopper, tmp_path / "c.csv", tmp_path / "c.replay.json", {"locked": False}, ["p"])
    first, second = ncu.collections()
    assert first[first.index("--metrics") + 1].split(",") == hopper
    assert second[second.index("--metrics") + 1].split(",") == [n for n in hopper if n not in refused]
    assert record["segments"][0]["attempts"] == 2
    assert [d["name"] for d in record["metrics"]["dropped"]] == refused
    assert record["metrics"]["collect"] == [n for n in hopper if n not in refused]
    assert any("ncu refused 2 metric(s)" in w for w in record["warnings"])
    assert json.loads((tmp_path / "c.replay.json").read_text())["metrics"]["dropped"] == record["metrics"]["dropped"]


def test_metrics_ncu_goes_on_without_are_recorded_as_not_collected(ncu, tmp_path, monkeypatch):
    hopper = load_catalog().replay_metrics("hopper")
    monkeypatch.setenv("FAKE_NCU_REFUSE", "dram__bytes.sum")
    record = replay.run_replay(PLAN, hopper, tmp_path / "c.csv", tmp_path / "c.replay.json", {"locked": False}, ["p"])
    assert len(ncu.collections()) == 1 and record["segments"][0]["attempts"] == 1
    assert record["metrics"]["not_collected"] == ["dram__bytes.sum"] and record["metrics"]["dropped"] == []
    assert any("could not access 1 metric(s)" in w for w in record["warnings"])


def test_counters_held_by_dcgm_name_the_fix(ncu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_FAIL", "dcgm")
    with pytest.raises(replay.NcuReplayError) as e:
        replay.run_replay(PLAN, ["dram__bytes.sum"], tmp_path / "c.csv", tmp_path / "c.replay.json",
                          {"locked": False}, ["p"])
    msg = str(e.value)
    assert "\n" not in msg and "dcgmi profile --pause" in msg and "driver resource was unavailable" in msg
    assert not (tmp_path / "c.replay.json").exists()


def test_the_compute_capability_comes_from_nvidia_smi_or_torch_or_the_replay_refuses(tmp_path, monkeypatch):
    smi = FakeSmi(tmp_path / "smi")
    for k, v in smi.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    smi.gpu(cc="8.9")
    assert replay.compute_capability("cuda") == ((8, 9), "nvidia-smi compute_cap")
    assert replay.gpu_arch("cuda") == "ampere"
    smi.gpu(cc="[N/A]")  # no answer: torch next, which sees no CUDA GPU on this machine
    with pytest.raises(replay.NcuReplayError) as e:
        replay.compute_capability("cuda")
    assert "\n" not in str(e.value) and "compute capability of cuda is unknown" in str(e.value)
    assert "nvidia-smi gave no compute_cap" in str(e.value) and "torch sees no CUDA GPU" in str(e.value)

    class FakeCuda:  # a torch stand-in that sees a GPU (the test machine has none)
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def get_device_capability(index):
            return (9, 0)

    import torch

    monkeypatch.setattr(torch, "cuda", FakeCuda)
    assert replay.compute_capability("cuda") == ((9, 0), "torch.cuda.get_device_capability")


def test_the_report_lists_the_metrics_not_collected_and_the_cache_state():
    from operator_profiler.report.markdown import metric_lines
    from operator_profiler.report.roofline_view import analytic_and_measured, cache_controls

    records = [{"metrics": {"dropped": [{"name": "a__x.sum", "reason": "not a metric of chip gh100 (ncu 2025.1)"}],
                            "not_collected": ["b__y.sum"], "query": {"chip": "gh100"}}, "cache_control": "all"},
               {"metrics": {"dropped": [{"name": "a__x.sum", "reason": "not a metric of chip gh100 (ncu 2025.1)"}],
                            "not_collected": []}}]
    assert metric_lines(records) == [
        "**2 catalog metrics not collected** (missing counters, never zeros):", "",
        "- `a__x.sum`: not a metric of chip gh100 (ncu 2025.1)",
        "- `b__y.sum`: ncu could not access it during the replay", ""]
    assert metric_lines([{"metrics": {"dropped": [], "not_collected": []}}]) == []
    assert cache_controls(records) == ["all"]  # a replay without the field ran ncu's default
    assert "**cold-cache** values" in analytic_and_measured(True, ["all"])
    assert "warm caches" in analytic_and_measured(True, ["none"])
    assert "do not compare" in analytic_and_measured(True, ["all", "none"])
    assert "cache" not in analytic_and_measured(False, ["all"])


def test_odd_ncu_texts_never_name_a_metric_ncu_did_not_name():
    requested = ["sm__b.sum", "sm__b.avg.pct_of_peak_sustained_elapsed", "l1tex__t.sum", "dram__bytes.sum"]
    said = availability.inaccessible_metrics
    # a regex names what it matches, not every name of its base
    assert said(r"==ERROR== Failed to find metric regex:^sm__b\.avg\.pct_of_peak_sustained_elapsed$",
                requested)["not_found"] == ["sm__b.avg.pct_of_peak_sustained_elapsed"]
    assert said(r"==ERROR== Failed to find metric regex:^(sm__b)\.(sum|avg)$", requested)["not_found"] == ["sm__b.sum"]
    assert said("==ERROR== Failed to find metric regex:sm__b.*", requested)["not_found"] == requested[:2]
    assert said("==ERROR== Failed to find metric 'dram__bytes.sum'.", requested)["not_found"] == ["dram__bytes.sum"]
    # the list ends with its sentence: a comma in what follows names nothing
    line = ("==WARNING== Unable to access the following 1 metrics: sm__b.sum. On MIG, l1tex__t.sum, and others "
            "cannot be collected.")
    assert said(line, requested)["unable"] == ["sm__b.sum"]
    assert said("", requested) == {"unable": [], "not_found": []}


def test_odd_query_texts():
    parse = availability.parse_query_output
    assert parse("") == {"chips": [], "device": None, "names": set(), "invalid": []}
    crlf = "Chip gh100\r\n------ ----\r\nMetric Name   Metric Type\r\ndram__bytes.sum   Counter   byte   x\r\n"
    assert parse(crlf)["names"] == {"dram__bytes.sum"} and parse(crlf)["chips"] == ["gh100"]
    # a name printed with a trailing period is the name; an invalid list wrapped after a comma stays a list
    text = ("Chip gh100\n==WARNING== The below metrics are either invalid or don't have suffixes.\nlaunch__a,launch__b,\n"
            "launch__c\ndram__bytes.sum.   Counter   byte   x\n")
    got = parse(text)
    assert got["invalid"] == ["launch__a", "launch__b", "launch__c"] and got["names"] == {"dram__bytes.sum"}


def test_an_answer_cut_short_is_an_error_and_never_cached(ncu, tmp_path):
    cut = tmp_path / "cut.txt.gz"
    lines = real_text(NCU_QUERY_GH100).splitlines(True)
    with gzip.open(cut, "wt") as fh:
        fh.writelines(lines[:2000])  # ncu stopped (killed, a full disk) after 2000 of its 4729 lines, exit 0 faked
    os.environ["FAKE_NCU_QUERY"] = str(cut)
    try:
        record = availability.check_metrics(load_catalog().replay_metrics("hopper"), 0, (9, 0), "2024.1.1.0",
                                            tmp_path / "cache")
    finally:
        os.environ["FAKE_NCU_QUERY"] = str(NCU_QUERY_GH100)
    assert record["dropped"] == [] and record["collect"] == load_catalog().replay_metrics("hopper")
    assert "an incomplete answer" in record["query"]["error"]
    assert not list((tmp_path / "cache").glob("*.json"))


def test_a_hanging_query_is_stopped_with_everything_it_started(tmp_path, monkeypatch):
    import time

    hang = tmp_path / "bin"
    hang.mkdir()
    pidfile = tmp_path / "child.pid"
    (hang / "ncu").write_text(f"#!/bin/sh\nsleep 1000 &\necho $! > '{pidfile}'\nwait\n")
    (hang / "ncu").chmod(0o755)
    monkeypatch.setenv("PATH", f"{hang}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    record = availability.check_metrics(["dram__bytes.sum"], 0, (9, 0), "x", None, timeout_s=2)
    assert time.monotonic() - t0 < 10  # both attempts (device, chip) within the 2 s, plus the kill
    assert "no answer within the time limit" in record["query"]["error"]
    child = int(pidfile.read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{child}/stat")
    # the tool's own child was killed with it (gone, or a zombie its new parent has not reaped yet)
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
