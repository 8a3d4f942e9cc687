"""Long CPU stages show progress in their log while they read, not only when a stage ends.

The real Kineto trace hta_df_index_resolver (54 MB of JSON, 216k events) is read in several ~8 MB
chunks; with the progress interval set to 0 every chunk logs one line, so the lines can be checked
against the reader's own chunk boundaries and the file size.
"""

from __future__ import annotations

import logging
import re
import sqlite3

import pytest
from conftest import real_file

from operator_profiler import progress
from operator_profiler.timeline.kineto import read_kineto
from operator_profiler.timeline.nsys import read_nsys
from operator_profiler.timeline.trace_json import KinetoTrace

LINE = re.compile(r"^reading (?P<file>\S+): (?P<events>[\d,]+) events, (?P<share>\d+)% of the file, [\d.]+ s$")


@pytest.fixture
def every_tick(monkeypatch):
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)


def test_kineto_read_logs_events_and_share_of_the_file_per_chunk(every_tick, caplog):
    path = real_file("kineto", "hta_df_index_resolver.json.gz")
    chunk_starts = [first for first, _ in KinetoTrace(path).chunks()]
    assert len(chunk_starts) >= 3  # a multi-chunk read, or the test proves nothing

    with caplog.at_level(logging.INFO, logger="operator_profiler.progress"):
        timeline = read_kineto(path)
    lines = [r.getMessage() for r in caplog.records if r.name == "operator_profiler.progress"]
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert {m["file"] for m in parsed} == {path.name}
    # one line per chunk (the first tick comes before anything is parsed), events counted at chunk starts
    events = [int(m["events"].replace(",", "")) for m in parsed]
    assert events == chunk_starts[1:] if events[0] else events == chunk_starts
    shares = [int(m["share"]) for m in parsed]
    assert shares == sorted(shares) and 0 < shares[-1] <= 100
    total = sum(timeline.diagnostics["event_categories"].values())
    assert events[-1] < total


def test_default_interval_keeps_a_fast_read_quiet(caplog):
    path = real_file("kineto", "hta_nccl_parser_config__nccl_data.json.gz")
    with caplog.at_level(logging.INFO, logger="operator_profiler.progress"):
        read_kineto(path)
    assert [r for r in caplog.records if r.name == "operator_profiler.progress"] == []


def test_nsys_read_logs_each_table(caplog):
    path = real_file("nsys", "fuser_test_matmul_h100x8_nsys2024.6.sqlite")
    with caplog.at_level(logging.INFO, logger="operator_profiler.progress"):
        timeline = read_nsys(path)
    lines = [r.getMessage() for r in caplog.records if r.name == "operator_profiler.progress"]
    assert len(lines) == 3, lines
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        kernel_rows = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert len(timeline.kernels) == kernel_rows
    assert f" {len(timeline.launches):,} launch calls" in lines[0]
    assert f"read {len(timeline.kernels):,} kernels" in lines[1]
    assert f"read {len(timeline.ranges):,} NVTX ranges" in lines[2]
    assert all(line.startswith(path.name + ": ") for line in lines)
