"""The nsys reader, NVTX attribution and ``opprof timeline --nsys`` on the eight real Nsight Systems exports.

Every expected figure is computed here, independently of the reader, with plain ``sqlite3`` SQL on the real files
(../shared/data/real/nsys/, provenance in PROVENANCE.md there), following docs/formats.md#nsys-identifiers for
``pid = (globalTid >> 24) & 0xFFFFFF`` / ``tid = globalTid & 0xFFFFFF``, formats.md#nsys-tables for the tables, formats.md#nsys-queries Q1 for
kernel -> launching call (same correlationId and process, ``eventClass IN (0, 1)``), Q2 for the innermost enclosing
push/pop range of a launch call and Q3 for the GPU projection of a range. The SQL results are also pinned to the
figures that docs/formats.md#nsys-queries and PROVENANCE.md report, so a query that silently returned nothing could not
make a broken reader pass.

Bad input goes through the CLI as a subprocess (like tests/test_cli.py): exit 1, one line on stderr naming the
file and what is wrong, no traceback, no kernels.parquet. Real ``nsys`` cannot run on this machine (no Nsight
Systems install, no GPU), so the ``.nsys-rep`` path is tested with a fake ``nsys`` script on PATH.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
from conftest import REAL_DATA, real_file
from nsys_export import c01_export, fake_nsys

from operator_profiler.attribution.nvtx import (
    NvtxOptions,
    attribute_nvtx,
    gpu_projection,
)
from operator_profiler.layers import classify_layers
from operator_profiler.timeline.nsys import read_nsys

NSYS_DIR = REAL_DATA / "nsys"

THUNDER = "fuser_thunder_xentropy_phi3_h200_nsys2025.1.sqlite"
MATMUL = "fuser_test_matmul_h100x8_nsys2024.6.sqlite"
SAXPY = "pipit_saxpy_mpi_cuda_a100_nsys2022.2.sqlite"
EXTRAP_WIN = "extrap_concurrent_streams_nvtx_gtx1060_win_nsys2022.1.sqlite"
EXGPU_OLD = "extrap_exgpu_a100x4_oldschema_nsys2021.sqlite"
NOKERNELS = "uvmtorch_gptneo_nokernels_a5000_nsys2025.3.sqlite"
# Two processes on two H100s, cut to a time window by nsys-ai's derive_test_fixture.py (PROVENANCE.md).
FASTVIDEO = "nsysai_fastvideo_h100x2_window1s_nsys2026.sqlite"
MFU = "nsysai_mfu_2gpu_before.sqlite"
EXTRAP_DOMAIN = "de.tu-darmstadt.parallel.extra_prof"

# What the SQL below must find (docs/formats.md#nsys-queries, PROVENANCE.md): kernels, launches (eventClass 0/1),
# push/pop ranges, start/end ranges, memcpy rows, memset rows, (product version, schema version).
PINNED = {
    THUNDER: (18, 990, 13513, 0, 3, 3, ("2025.1.1.110", "3.17.1")),
    MATMUL: (19, 967, 639, 0, 1, 1, ("2024.6.2.25", "3.16.1")),
    SAXPY: (5, 57, 22, 0, 15, 0, ("2022.2.1.31", "2.9.1")),
    EXTRAP_WIN: (12, 184, 76, 0, 30, 17, ("2022.1.1.61", "2.9.1")),
    EXGPU_OLD: (6, 18, 0, 0, 0, 0, (None, None)),
    NOKERNELS: (0, 2, 0, 0, 0, 0, ("2025.3.2.367", "3.20.3")),
    # kernels and push/pop ranges from PROVENANCE.md; the rest counted with the sqlite3 shell
    FASTVIDEO: (3442, 5796, 16782, 0, 904, 22, ("2026.2.1.210", "3.25.0")),
    MFU: (4010, 7466, 19118, 0, 1020, 269, ("2026.2.1.210", "3.25.0")),
}
FILES = list(PINNED)
# Kernels whose launch row (same process and correlationId) is in the file: all of them, except in the windowed
# exports, whose window cut the launch calls of the kernels that ran first (PROVENANCE.md: 1,632 and 3,986).
WITH_LAUNCH = {FASTVIDEO: 1632, MFU: 3986}

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
PUSH_POP, START_END = (59, 70), (60, 71)
TIMELINE_FILES = ("kernels.parquet", "launches.parquet", "ranges.parquet", "gpu_activities.parquet",
                  "nvtx_gpu_projection.parquet", "diagnostics.json")


def _real(name: str) -> Path:
    return real_file("nsys", name)


def _db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode("utf-8", "replace")  # non-UTF-8 bytes in some tables (formats.md#nsys-export)
    return conn


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]


def _launch_filter(conn: sqlite3.Connection, alias: str = "") -> str:
    """``eventClass IN (0, 1)`` when RUNTIME has the column (drops backtrace duplicates, formats.md#nsys-tables), else nothing."""
    return f"{alias}eventClass IN (0, 1)" if "eventClass" in _columns(conn, RUNTIME) else "1 = 1"


def _launched(conn: sqlite3.Connection) -> str:
    """API rows that launched GPU work: their (process, correlation id) is on a kernel, memcpy or memset row of the
    same process (correlation ids are unique per process only, formats.md#nsys-tables)."""
    tables = [t for t in (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if t in _tables(conn)]
    if not tables:
        return "0 = 1"
    return ("((globalTid >> 24) & 0xFFFFFF, correlationId) IN ("
            + " UNION ".join(f"SELECT (globalPid >> 24) & 0xFFFFFF, correlationId FROM {t}" for t in tables) + ")")


@cache
def _timeline(name: str):
    """read_nsys of a real file, read once per session (tests only read it)."""
    return read_nsys(_real(name))


def opprof(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "operator_profiler.cli", *map(str, args)], cwd=cwd, env=env,
                          check=False, capture_output=True, text=True, timeout=120)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------
# 1. Counts, joins, names and versions: reader == SQL, per real file


def _sql_facts(conn: sqlite3.Connection) -> dict:
    tables = _tables(conn)
    facts: dict = {}
    has_kernels = KERNEL in tables
    facts["kernels"] = conn.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0] if has_kernels else 0
    facts["launches"] = (conn.execute(f"SELECT count(*) FROM {RUNTIME} WHERE {_launch_filter(conn)}").fetchone()[0]
                         if RUNTIME in tables else 0)
    # The reader keeps, as launches, only the API calls that launched GPU work.
    facts["launch_calls"] = (conn.execute(f"SELECT count(*) FROM {RUNTIME} WHERE {_launch_filter(conn)} "
                                          f"AND {_launched(conn)}").fetchone()[0] if RUNTIME in tables else 0)
    # Q1 per kernel: how many launch rows join, and the launch (thread, start, API name) when exactly one does.
    facts["joins"] = {}
    if has_kernels:
        rows = conn.execute(f"""
            SELECT (k.globalPid >> 24) & 0xFFFFFF, k.correlationId, count(r.rowid),
                   min(r.globalTid & 0xFFFFFF), min(r.start), min(rn.value)
            FROM {KERNEL} AS k
            LEFT JOIN {RUNTIME} AS r
              ON r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid
             AND {_launch_filter(conn, "r.")}
            LEFT JOIN StringIds AS rn ON rn.id = r.nameId
            GROUP BY k.rowid""").fetchall()
        facts["joins"] = {(pid, corr): (n, tid, start, api) for pid, corr, n, tid, start, api in rows}
        assert len(facts["joins"]) == len(rows), "(pid, correlationId) does not identify a kernel in this file"
        facts["kernel_rows"] = {
            (pid, corr): (name, start, end, grid) for pid, corr, name, start, end, grid in conn.execute(f"""
                SELECT (k.globalPid >> 24) & 0xFFFFFF, k.correlationId, s.value, k.start, k."end",
                       k.gridX || ',' || k.gridY || ',' || k.gridZ
                FROM {KERNEL} AS k JOIN StringIds AS s ON s.id = k.demangledName""")}
    nvtx = "NVTX_EVENTS" in tables
    kinds = Counter()
    if nvtx:
        for event_type, count in conn.execute("SELECT eventType, count(*) FROM NVTX_EVENTS GROUP BY eventType"):
            if event_type in PUSH_POP:
                kinds["nvtx_push_pop"] += count
            elif event_type in START_END:
                kinds["nvtx_start_end"] += count
    facts["ranges"] = kinds
    facts["memcpy"] = (conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
                       if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables else 0)
    facts["memset"] = (conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()[0]
                       if "CUPTI_ACTIVITY_KIND_MEMSET" in tables else 0)
    per_process: dict[int, Counter] = {}

    def add(what: str, sql: str) -> None:
        for pid, count in conn.execute(sql):
            per_process.setdefault(pid, Counter())[what] += count

    if has_kernels:
        add("kernels", f"SELECT (globalPid >> 24) & 0xFFFFFF, count(*) FROM {KERNEL} GROUP BY 1")
    if RUNTIME in tables:
        add("launches", f"SELECT (globalTid >> 24) & 0xFFFFFF, count(*) FROM {RUNTIME} WHERE {_launch_filter(conn)} "
                        f"AND {_launched(conn)} GROUP BY 1")
    if RUNTIME in tables:  # every process that made CUDA API calls, launches or not
        add("cuda_api_calls", f"SELECT (globalTid >> 24) & 0xFFFFFF, count(*) FROM {RUNTIME} WHERE {_launch_filter(conn)} "
                              "GROUP BY 1")
    if nvtx:
        add("ranges", f"SELECT (globalTid >> 24) & 0xFFFFFF, count(*) FROM NVTX_EVENTS "
                      f"WHERE eventType IN {PUSH_POP + START_END} GROUP BY 1")
        add("threads_with_ranges", f"SELECT (globalTid >> 24) & 0xFFFFFF, count(DISTINCT globalTid & 0xFFFFFF) "
                                   f"FROM NVTX_EVENTS WHERE eventType IN {PUSH_POP + START_END} GROUP BY 1")
    facts["per_process"] = per_process
    facts["versions"] = (None, None)
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables:
            meta = dict(conn.execute(f"SELECT name, value FROM {table}"))
            facts["versions"] = (meta.get("EXPORT_PRODUCT_VERSION"), meta.get("EXPORT_SCHEMA_VERSION"))
            break
    return facts


def test_the_folder_holds_the_eight_exports_and_tests_read_only_those(real_nsys_files):
    _real(THUNDER)
    assert sorted(p.name for p in NSYS_DIR.glob("*.sqlite")) == sorted(FILES)
    # The fixture the other real-data tests loop over lists the exports only: not the nbody CSV, nor a stray file
    # such as the one-page SQLite file named "-h" in the shared folder (no nsys table; left by a 'sqlite3 -h').
    assert [p.name for p in real_nsys_files] == sorted(FILES)
    strays = [p for p in NSYS_DIR.iterdir() if p.suffix not in (".sqlite", ".md", ".csv") and not p.name.startswith("LICENSE")]
    for stray in strays:
        assert stray not in real_nsys_files


@pytest.mark.parametrize("name", FILES)
def test_reader_matches_sql(name):
    path = _real(name)
    facts = _sql_facts(_db(path))
    kernels_n, launches_n, _, _, memcpy_n, memset_n, versions = PINNED[name]
    # The SQL finds what the docs report ...
    assert (facts["kernels"], facts["launches"], facts["ranges"]["nvtx_push_pop"], facts["ranges"]["nvtx_start_end"],
            facts["memcpy"], facts["memset"], facts["versions"]) == PINNED[name]
    # ... every kernel joins exactly one launch call of its process (formats.md#nsys-queries Q1 results), except those of a windowed
    # export whose launch call lies before the window (none) ...
    joined = WITH_LAUNCH.get(name, kernels_n)
    assert Counter(n for n, *_ in facts["joins"].values()) == {k: v for k, v in ((1, joined), (0, kernels_n - joined))
                                                              if v}

    t = _timeline(name)
    d = t.diagnostics
    # ... and the reader agrees with the SQL.
    assert len(t.kernels) == kernels_n
    assert len(t.launches) == facts["launch_calls"]
    assert d["cuda_api_calls"] == launches_n
    assert dict(Counter(t.ranges["kind"])) == {k: v for k, v in facts["ranges"].items() if v}
    assert (t.activities["kind"] == "memcpy").sum() == memcpy_n
    assert (t.activities["kind"] == "memset").sum() == memset_n
    assert (d["product_version"], d["schema_version"]) == versions
    assert d["counts"]["kernels"] == kernels_n and d["counts"]["launches"] == facts["launch_calls"]

    assert set(d["per_process"]) == {str(pid) for pid in facts["per_process"]}
    for pid, counts in facts["per_process"].items():
        entry = d["per_process"][str(pid)]
        fields = ("kernels", "launches", "ranges", "threads_with_ranges", "cuda_api_calls")
        assert {k: entry[k] for k in fields} == {k: counts[k] for k in fields}, pid

    reader = {(int(r.pid), int(r.correlation_id)): r for r in t.kernels.itertuples()}
    assert set(reader) == set(facts["joins"])
    for key, (n, tid, start, api) in facts["joins"].items():
        row = reader[key]
        if n:
            assert (row.launch_tid, row.launch_start_ns, row.launch_api) == (tid, start, api), key
        else:
            assert pd.isna(row.launch_tid) and pd.isna(row.launch_start_ns) and pd.isna(row.launch_api), key
        name_, k_start, k_end, grid = facts["kernel_rows"][key]
        assert (row.name, row.start_ns, row.end_ns, row.grid) == (name_, k_start, k_end, grid), key


# --------------------------------------------------------------------------------------------------
# 2. Attribution and GPU projection of the PyTorch + Thunder + nvFuser run


Q1_LAUNCHES = f"""
    SELECT k.start AS k_start, k."end" AS k_end, k.streamId, k.correlationId, k.globalPid,
           r.start AS api_start, r."end" AS api_end, r.globalTid
    FROM {KERNEL} AS k
    JOIN {RUNTIME} AS r
      ON r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid
     AND r.eventClass IN (0, 1)"""


def _sql_enclosure(conn: sqlite3.Connection, domain_id: int) -> tuple[dict, dict]:
    """Per kernel (pid, correlationId): (innermost range name or None, depth) by formats.md#nsys-queries Q2, restricted to push/pop
    ranges of one NVTX domain; and the stack of all enclosing ranges, outermost first."""
    on = f"""n.globalTid = l.globalTid AND n.eventType IN {PUSH_POP} AND n.endGlobalTid IS NULL
             AND coalesce(n.domainId, 0) = {domain_id}
             AND n.start <= l.api_start AND coalesce(n."end", 9223372036854775807) >= l.api_end"""
    innermost = {}
    for pid, corr, name, depth in conn.execute(f"""
            WITH launches AS ({Q1_LAUNCHES}),
            enc AS (
              SELECT l.correlationId, l.globalPid, coalesce(n.text, s.value) AS nvtx_name,
                     ROW_NUMBER() OVER (PARTITION BY l.globalPid, l.correlationId
                                        ORDER BY n.start DESC, n."end" ASC) AS rk,
                     COUNT(n.start) OVER (PARTITION BY l.globalPid, l.correlationId) AS depth
              FROM launches AS l
              LEFT JOIN NVTX_EVENTS AS n ON {on}
              LEFT JOIN StringIds AS s ON s.id = n.textId)
            SELECT (globalPid >> 24) & 0xFFFFFF, correlationId, nvtx_name, depth FROM enc WHERE rk = 1"""):
        innermost[(pid, corr)] = (name, depth)
    stacks: dict = {key: [] for key in innermost}
    for pid, corr, name in conn.execute(f"""
            WITH launches AS ({Q1_LAUNCHES})
            SELECT (l.globalPid >> 24) & 0xFFFFFF, l.correlationId, coalesce(n.text, s.value)
            FROM launches AS l JOIN NVTX_EVENTS AS n ON {on}
            LEFT JOIN StringIds AS s ON s.id = n.textId
            ORDER BY l.globalPid, l.correlationId, n.start ASC, n."end" DESC"""):
        stacks[(pid, corr)].append(name)
    return innermost, stacks


def _attribution(name: str, options: NvtxOptions | None = None) -> dict:
    """(pid, correlation_id) -> attribution row (with the parsed evidence); default NvtxOptions unless given."""
    t = _timeline(name)
    kernel_layers, _, _ = classify_layers(t.kernels, t.ranges, [])
    result = attribute_nvtx(t.kernels, t.ranges, kernel_layers, options or NvtxOptions())
    assert len(result) == len(t.kernels)
    keys = {int(k.kernel_id): (int(k.pid), int(k.correlation_id)) for k in t.kernels.itertuples()}
    rows = {}
    for row in result.itertuples():
        # missing values as None (a str column holds NaN for them)
        fields = {k: (None if not isinstance(v, (list, dict)) and pd.isna(v) else v) for k, v in row._asdict().items()}
        rows[keys[int(row.kernel_id)]] = {**fields, "nvtx": json.loads(row.evidence)["nvtx"]}
    return rows


def test_thunder_attribution_is_the_innermost_default_domain_range():
    conn = _db(_real(THUNDER))
    assert conn.execute("SELECT DISTINCT domainId FROM NVTX_EVENTS").fetchall() == [(0,)]  # all "default"
    innermost, stacks = _sql_enclosure(conn, 0)
    assert len(innermost) == 18
    # docs/formats.md#nsys-queries: 8 of 18 kernels have an enclosing stack, the 10 ATen/cuBLAS kernels none.
    assert Counter(name for name, _ in innermost.values()) == {
        None: 10, "ExecutorRunFusion::cuLaunchKernel": 6, "KernelExecutor::runFusion::intermediates": 2}
    assert Counter(depth for _, depth in innermost.values()) == {0: 10, 8: 6, 7: 2}
    assert all(len(stacks[key]) == depth and (stacks[key][-1:] or [None])[0] == name
               for key, (name, depth) in innermost.items())

    attribution = _attribution(THUNDER)
    assert set(attribution) == set(innermost)
    for key, (expected, _) in innermost.items():
        row = attribution[key]
        if expected is None:
            assert (row["path"], row["operator"], row["reason"]) == ("unattributed", None, "no_enclosing_range"), key
        else:
            assert (row["path"], row["operator"], row["reason"]) == ("nvtx", expected, None), key
        assert row["nvtx"]["stack"] == stacks[key], key
    assert Counter(row["path"] for row in attribution.values()) == {"nvtx": 8, "unattributed": 10}


def test_thunder_gpu_projection_of_run_fusion_with_inputs():
    name = "FusionExecutorCache::runFusionWithInputs"
    conn = _db(_real(THUNDER))
    # formats.md#nsys-queries Q3 for the ranges of that name, also grouped by stream as gpu_projection is.
    expected = conn.execute(f"""
        WITH launches AS ({Q1_LAUNCHES})
        SELECT n.start, n."end", l.streamId, min(l.k_start), max(l.k_end), count(*)
        FROM NVTX_EVENTS n JOIN launches l
          ON l.globalTid = n.globalTid AND n.start <= l.api_start
         AND coalesce(n."end", 9223372036854775807) >= l.api_end
        LEFT JOIN StringIds s ON s.id = n.textId
        WHERE n.eventType IN (59, 60, 70, 71) AND n.endGlobalTid IS NULL AND coalesce(n.text, s.value) = ?
        GROUP BY n.rowid, l.streamId
        ORDER BY n.start""", (name,)).fetchall()
    # docs/formats.md#nsys-queries: CPU 573.8 ms vs GPU 7.6 ms, 6 kernels (the first call; a second call projects 2 kernels).
    assert [(end - start, gpu_end - gpu_start, n) for start, end, _, gpu_start, gpu_end, n in expected] == [
        (573_760_070, 7_620_556, 6), (271_057_015, 1_286_194, 2)]

    t = _timeline(THUNDER)
    projection = gpu_projection(t.kernels, t.ranges)
    mine = projection[projection["name"] == name].sort_values("cpu_start_ns")
    assert [(int(r.cpu_start_ns), int(r.cpu_end_ns), int(r.stream), int(r.gpu_start_ns), int(r.gpu_end_ns),
             int(r.kernel_count)) for r in mine.itertuples()] == expected
    assert (mine["projected_duration_ns"] == mine["gpu_end_ns"] - mine["gpu_start_ns"]).all()


# --------------------------------------------------------------------------------------------------
# 3. The Windows export with ranges in a named domain


def test_extrap_named_domain_ranges_name_operators_only_when_asked():
    conn = _db(_real(EXTRAP_WIN))
    (domain_id,) = conn.execute("SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = ?",
                                (EXTRAP_DOMAIN,)).fetchone()
    innermost, stacks = _sql_enclosure(conn, domain_id)
    assert len(innermost) == 12 and all(depth == 4 for _, depth in innermost.values())  # formats.md#nsys-queries: depth-4 stacks
    assert ("main->process->phase1->kernel0", 4) in innermost.values()

    default = _attribution(EXTRAP_WIN)
    assert set(default) == set(innermost)
    for key, (expected, _) in innermost.items():
        row = default[key]
        assert (row["path"], row["operator"], row["reason"]) == ("unattributed", None, "no_operator_range"), key
        assert row["nvtx"]["stack"] == stacks[key], key
        assert row["nvtx"]["tags"] == {EXTRAP_DOMAIN: expected}, key

    named = _attribution(EXTRAP_WIN, NvtxOptions(operator_domains=(EXTRAP_DOMAIN,)))
    for key, (expected, _) in innermost.items():
        row = named[key]
        assert (row["path"], row["operator"], row["reason"]) == ("nvtx", expected, None), key
        assert row["nvtx"]["stack"] == stacks[key], key


def test_extrap_windows_global_ids_decode_to_pid_and_tid():
    conn = _db(_real(EXTRAP_WIN))
    # Windows: hwId 1 in the top byte, vmId 0 (docs/formats.md#nsys-identifiers).
    for table, column in ((RUNTIME, "globalTid"), ("NVTX_EVENTS", "globalTid"), (KERNEL, "globalPid")):
        assert conn.execute(f"SELECT DISTINCT ({column} >> 56) & 0xFF, ({column} >> 48) & 0xFF FROM {table}").fetchall() \
               == [(1, 0)], table
    t = _timeline(EXTRAP_WIN)
    sql_launches = Counter(conn.execute(f"""
        SELECT (globalTid >> 24) & 0xFFFFFF, globalTid & 0xFFFFFF, correlationId, start FROM {RUNTIME}
        WHERE eventClass IN (0, 1) AND {_launched(conn)}""").fetchall())
    assert Counter(zip(t.launches["pid"], t.launches["tid"], t.launches["correlation_id"], t.launches["start_ns"])) \
           == sql_launches
    sql_ranges = Counter(conn.execute("""
        SELECT (globalTid >> 24) & 0xFFFFFF, globalTid & 0xFFFFFF, start FROM NVTX_EVENTS
        WHERE eventType IN (59, 60, 70, 71)""").fetchall())
    assert Counter(zip(t.ranges["pid"], t.ranges["tid"], t.ranges["start_ns"])) == sql_ranges
    assert {pid for pid, *_ in sql_launches} == {5360} and set(t.kernels["pid"]) == {5360}
    assert conn.execute(f"SELECT DISTINCT (globalPid >> 24) & 0xFFFFFF FROM {KERNEL}").fetchall() == [(5360,)]


# --------------------------------------------------------------------------------------------------
# 4. A capture that stopped before any GPU work


def test_no_kernels_export_reads_empty_with_a_warning(tmp_path):
    conn = _db(_real(NOKERNELS))
    assert not {KERNEL, "NVTX_EVENTS"} & _tables(conn)
    t = _timeline(NOKERNELS)
    assert len(t.kernels) == 0 and len(t.ranges) == 0
    assert t.diagnostics["warnings"][0].startswith("no kernels captured")

    out = tmp_path / "timeline"
    res = opprof("timeline", "--nsys", _real(NOKERNELS), "--out", out, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "no kernels captured" in res.stderr
    assert len(pd.read_parquet(out / "kernels.parquet")) == 0
    res = opprof("attribute", "--timeline", out, "--out", out / "attribution.parquet", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(pd.read_parquet(out / "attribution.parquet")) == 0


# --------------------------------------------------------------------------------------------------
# 5. opprof timeline --nsys on every real file


@pytest.mark.parametrize("name", FILES)
def test_cli_timeline_writes_every_table(tmp_path, name):
    path = _real(name)
    out = tmp_path / "timeline"
    res = opprof("timeline", "--nsys", path, "--out", out, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    for file in TIMELINE_FILES:
        assert (out / file).is_file(), file
    assert len(pd.read_parquet(out / "kernels.parquet")) == PINNED[name][0]
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    assert (diagnostics["product_version"], diagnostics["schema_version"]) == PINNED[name][6]
    if name == EXTRAP_WIN:  # the operator domain chosen on the command line
        res = opprof("attribute", "--timeline", out, "--out", out / "attribution.parquet",
                     "--nvtx-operator-domain", EXTRAP_DOMAIN, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        attribution = pd.read_parquet(out / "attribution.parquet")
        assert (attribution["path"] == "nvtx").all() and len(attribution) == 12
        assert "main->process->phase1->kernel0" in set(attribution["operator"])


# --------------------------------------------------------------------------------------------------
# 6. Bad input through the CLI


def _truncated(tmp_path: Path) -> Path:
    bad = tmp_path / "truncated.sqlite"
    bad.write_bytes(_real(THUNDER).read_bytes()[:50_000])
    return bad


def _text(tmp_path: Path) -> Path:
    bad = tmp_path / "x.sqlite"
    bad.write_text("this is not a database\n")
    return bad


def _unrelated(tmp_path: Path) -> Path:
    bad = tmp_path / "unrelated.sqlite"
    conn = sqlite3.connect(bad)
    conn.execute("CREATE TABLE measurements (t INTEGER, value REAL)")
    conn.execute("INSERT INTO measurements VALUES (1, 2.5)")
    conn.commit()
    conn.close()
    return bad


def _newer_schema(tmp_path: Path) -> Path:
    return c01_export(tmp_path / "newer.sqlite", drop_columns={KERNEL: ["correlationId"]})


def _report(tmp_path: Path) -> Path:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"\x00nsys report placeholder\x00")
    return report


BAD_INPUTS = {
    # id: (make the input, what the message must say, PATH for the subprocess: None = inherited, "" = empty dir)
    "truncated": (_truncated, ("truncated",), None),
    "not_sqlite": (_text, ("not an SQLite file",), None),
    "unrelated_tables": (_unrelated, ("not an Nsight Systems export", KERNEL, RUNTIME, "StringIds", "measurements"),
                         None),
    "newer_schema_missing_column": (_newer_schema, (KERNEL, "correlationId"), None),
    "nsys_rep_without_nsys": (_report, ("nsys", "PATH"), ""),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_cli_rejects_bad_input_in_one_line(tmp_path, case):
    make, needles, path_env = BAD_INPUTS[case]
    bad = make(tmp_path)
    env = None
    if path_env is not None:
        empty = tmp_path / "empty_bin"
        empty.mkdir()
        env = {**os.environ, "PATH": str(empty)}
    out = tmp_path / "out"
    res = opprof("timeline", "--nsys", bad, "--out", out, cwd=tmp_path, env=env)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    assert not (out / "kernels.parquet").exists()
    errors = [line for line in _lines(res.stderr) if line.startswith("opprof timeline: error:")]
    assert len(errors) == 1, res.stderr
    message = errors[0]
    assert str(bad) in message
    for needle in needles:
        assert needle in message, (needle, message)
    assert _lines(res.stderr) == [message], res.stderr


def test_cli_exports_a_nsys_rep_with_nsys_from_path(tmp_path):
    """``.nsys-rep`` -> ``nsys export --type sqlite`` -> timeline. The ``nsys`` here is a fake (a test double that
    copies a synthetic export): real Nsight Systems is not installed and cannot run on the test machine."""
    fixture = c01_export(tmp_path / "fixture.sqlite")
    report = _report(tmp_path)
    log = tmp_path / "nsys_calls.jsonl"
    bin_dir = tmp_path / "bin"
    fake_nsys(bin_dir, log, fixture)

    out = tmp_path / "timeline"
    res = opprof("timeline", "--nsys", report, "--out", out, cwd=tmp_path, env={**os.environ, "PATH": str(bin_dir)})
    assert res.returncode == 0, res.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1
    (args,) = calls
    assert args[:3] == ["export", "--type", "sqlite"] and args[-1] == str(report)
    exported = Path(args[args.index("--output") + 1])
    assert exported.suffix == ".sqlite" and not exported.exists()  # exported into a temporary folder, removed after
    for file in TIMELINE_FILES:
        assert (out / file).is_file(), file
    kernels = pd.read_parquet(out / "kernels.parquet").sort_values("start_ns")
    assert list(kernels["name"]) == ["gemm_bwd", "reduce_bwd"]
    assert list(kernels["launch_tid"]) == [2, 2] and list(kernels["grid"]) == ["4,2,1", "1,1,1"]
    assert len(pd.read_parquet(out / "ranges.parquet")) == 2


# --------------------------------------------------------------------------------------------------
# 7. Two processes on two GPUs, cut to a time window (nsys-ai fixtures): nothing joins across processes

# PROVENANCE.md: pids, kernels per (pid, device), kernels whose launch row of their own process is in the file,
# NVTX domains; FASTVIDEO's 11 kernels that a join on correlationId alone would give another process's call.
NSYSAI = {
    FASTVIDEO: {"kernels": {(111, 0): 1721, (112, 1): 1721}, "with_launch": 1632, "domains": 1, "cross": 11},
    MFU: {"kernels": {(144, 0): 1993, (145, 1): 2017}, "with_launch": 3986, "domains": 2, "cross": None},
}
DECORATIONS = re.compile(r", (?:stashed seq|seq|op_id|sizes|input_op_ids) = .*$")  # emit_nvtx, docs/formats.md#emit_nvtx-range-names


def _ranges_db(name: str) -> sqlite3.Connection:
    """An in-memory database with the file attached read-only, its push/pop ranges (eventType 59/70, unclosed ones
    ending at the largest integer) in a temporary table ``r`` indexed in the order the innermost search reads
    (thread, domain, latest start first, then shortest) and its kernels' own-process launch calls
    (formats.md#nsys-queries Q1) in ``l``: the innermost enclosing range of a launch is then one index lookup (the file itself has no
    index on NVTX_EVENTS, so a plain join would compare every launch with every range of its thread)."""
    conn = sqlite3.connect(":memory:")
    conn.text_factory = lambda b: b.decode("utf-8", "replace")
    conn.execute("ATTACH DATABASE ? AS x", (f"file:{_real(name)}?mode=ro",))
    conn.execute(f"""CREATE TEMP TABLE r AS
        SELECT n.globalTid, coalesce(n.domainId, 0) AS domain, n.start, coalesce(n."end", 9223372036854775807) AS e,
               coalesce(n.text, s.value) AS text
        FROM x.NVTX_EVENTS AS n LEFT JOIN x.StringIds AS s ON s.id = n.textId
        WHERE n.eventType IN {PUSH_POP}""")
    conn.execute("CREATE INDEX r_thread ON r (globalTid, domain, start DESC, e)")
    conn.execute(f"""CREATE TEMP TABLE l AS
        SELECT (k.globalPid >> 24) & 0xFFFFFF AS pid, k.correlationId AS corr, k.deviceId AS device,
               r.globalTid, r.start AS s, r."end" AS e
        FROM x.{KERNEL} AS k JOIN x.{RUNTIME} AS r
          ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24) AND r.eventClass IN (0, 1)""")
    return conn


def _sql_innermost(conn: sqlite3.Connection, domain: int) -> dict:
    """(pid, correlationId) -> the raw text of the innermost push/pop range of ``domain`` on the launching thread
    enclosing the launch call (formats.md#nsys-queries Q2: start <= call start, end >= call end; latest start, then shortest), or None."""
    return {(pid, corr): text for pid, corr, text in conn.execute("""
        SELECT l.pid, l.corr,
               (SELECT r.text FROM r WHERE r.globalTid = l.globalTid AND r.domain = ? AND r.start <= l.s AND r.e >= l.e
                ORDER BY r.start DESC, r.e ASC LIMIT 1)
        FROM l""", (domain,))}


@pytest.fixture(scope="module")
def nsysai_outputs(tmp_path_factory):
    """``opprof timeline --nsys`` then ``opprof attribute --timeline`` on each nsys-ai export, once per module
    (in-process through ``cli.main``, the command line's code path)."""
    from operator_profiler import cli

    outputs = {}

    def run(name: str) -> Path:
        if name not in outputs:
            out = tmp_path_factory.mktemp(name.split("_")[1]) / "timeline"
            assert cli.main(["timeline", "--nsys", str(_real(name)), "--out", str(out)]) == 0
            assert cli.main(["attribute", "--timeline", str(out), "--out", str(out / "attribution.parquet")]) == 0
            outputs[name] = out
        return outputs[name]

    return run


@pytest.mark.parametrize("name", list(NSYSAI))
def test_two_process_export_kernels_and_launches_stay_in_their_process(nsysai_outputs, name):
    expected = NSYSAI[name]
    conn = _db(_real(name))
    kernels_sql = {(pid, dev): n for pid, dev, n in conn.execute(
        f"SELECT (globalPid >> 24) & 0xFFFFFF, deviceId, count(*) FROM {KERNEL} GROUP BY 1, 2")}
    # a launch row of the kernel's own process: same (pid, correlationId), formats.md#nsys-queries Q1
    own = f"""((globalPid >> 24) & 0xFFFFFF, correlationId) IN
              (SELECT (globalTid >> 24) & 0xFFFFFF, correlationId FROM {RUNTIME} WHERE eventClass IN (0, 1))"""
    with_launch_sql = {(pid, dev): n for pid, dev, n in conn.execute(
        f"SELECT (globalPid >> 24) & 0xFFFFFF, deviceId, count(*) FROM {KERNEL} WHERE {own} GROUP BY 1, 2")}
    # A kernel without one whose correlationId a call of the other process carries: a join on correlationId alone
    # would give it that call.
    crossed_sql = set(conn.execute(f"""
        SELECT (globalPid >> 24) & 0xFFFFFF, correlationId FROM {KERNEL} WHERE NOT {own}
        AND correlationId IN (SELECT correlationId FROM {RUNTIME} WHERE eventClass IN (0, 1))"""))
    launched = _launched(conn)
    calls_sql = Counter(conn.execute(f"""SELECT (globalTid >> 24) & 0xFFFFFF, correlationId FROM {RUNTIME}
                                         WHERE eventClass IN (0, 1) AND {launched}"""))
    calls_any_process = conn.execute(f"""SELECT count(*) FROM {RUNTIME} WHERE eventClass IN (0, 1) AND correlationId IN
        (SELECT correlationId FROM {KERNEL} UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY
         UNION SELECT correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET)""").fetchone()[0]
    # The SQL finds what PROVENANCE.md reports.
    assert kernels_sql == expected["kernels"]
    assert sum(with_launch_sql.values()) == expected["with_launch"]
    assert expected["cross"] in (None, len(crossed_sql)) and crossed_sql
    assert calls_any_process > sum(calls_sql.values())  # calls that share an id with the other process's GPU work

    out = nsysai_outputs(name)
    kernels = pd.read_parquet(out / "kernels.parquet")
    launches = pd.read_parquet(out / "launches.parquet")
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    assert kernels.groupby(["pid", "device"]).size().to_dict() == kernels_sql
    assert kernels[kernels["launch_tid"].notna()].groupby(["pid", "device"]).size().to_dict() == with_launch_sql
    keyed = kernels.set_index(["pid", "correlation_id"])
    assert keyed.loc[sorted(crossed_sql), "launch_tid"].isna().all()
    # launches.parquet holds the calls that launched GPU work of their own process, and nothing else.
    assert Counter(zip(launches["pid"], launches["correlation_id"])) == calls_sql
    assert {int(p): e["launches"] for p, e in diagnostics["per_process"].items()} == Counter(
        pid for pid, _ in calls_sql.elements())
    assert diagnostics["cross_process_correlation_ids"] == len(crossed_sql)

    attribution = pd.read_parquet(out / "attribution.parquet").merge(kernels[["kernel_id", "pid", "correlation_id"]])
    unattributed = attribution[attribution["path"] == "unattributed"]
    assert set(unattributed["reason"]) == {"no_launch_record"}
    assert len(unattributed) == sum(kernels_sql.values()) - expected["with_launch"]
    crossed_rows = attribution.set_index(["pid", "correlation_id"]).loc[sorted(crossed_sql)]
    assert (crossed_rows["path"] == "unattributed").all()


@pytest.mark.parametrize("name", list(NSYSAI))
def test_two_process_export_ranges_and_nvtx_attribution(nsysai_outputs, name):
    expected = NSYSAI[name]
    conn = _db(_real(name))
    ranges_sql = {(pid, domain): n for pid, domain, n in conn.execute(
        f"SELECT (globalTid >> 24) & 0xFFFFFF, coalesce(domainId, 0), count(*) FROM NVTX_EVENTS "
        f"WHERE eventType IN {PUSH_POP + START_END} GROUP BY 1, 2")}
    named_domains = {(pid, d): text for pid, d, text in conn.execute(
        "SELECT (globalTid >> 24) & 0xFFFFFF, domainId, text FROM NVTX_EVENTS WHERE eventType = 75")}
    assert sum(ranges_sql.values()) == PINNED[name][2]
    assert len({d for _, d in ranges_sql}) == expected["domains"]

    out = nsysai_outputs(name)
    ranges = pd.read_parquet(out / "ranges.parquet")
    assert ranges.groupby(["pid", "domain_id"]).size().to_dict() == ranges_sql
    # Domain 0 is "default"; the window dropped the domain-create rows (eventType 75) of the other domain, so it
    # is named by its id.
    names = {(int(p), int(d)): str(n) for p, d, n in ranges[["pid", "domain_id", "domain"]].drop_duplicates().itertuples(
        index=False)}
    assert names == {key: "default" if key[1] == 0 else named_domains.get(key, f"domain {key[1]}") for key in ranges_sql}

    db = _ranges_db(name)
    operators = _sql_innermost(db, 0)
    assert len(operators) == expected["with_launch"]
    assert all(text for text in operators.values())  # every launch call in the window lies inside an aten:: range
    kernels = pd.read_parquet(out / "kernels.parquet")
    attribution = pd.read_parquet(out / "attribution.parquet").merge(
        kernels[["kernel_id", "pid", "correlation_id", "device"]])
    attributed = attribution[attribution["path"] == "nvtx"]
    assert len(attributed) == expected["with_launch"]
    got = dict(zip(zip(attributed["pid"], attributed["correlation_id"]), attributed["operator"]))
    assert got == {key: DECORATIONS.sub("", text) for key, text in operators.items()}
    per_device = {(pid, dev): n for pid, dev, n in db.execute("SELECT pid, device, count(*) FROM l GROUP BY 1, 2")}
    assert attributed.groupby(["pid", "device"]).size().to_dict() == per_device
    # The other domain's innermost range is a tag, never the operator.
    tags = {}
    for domain in sorted({d for _, d in ranges_sql} - {0}):
        for key, text in _sql_innermost(db, domain).items():
            if text is not None:
                tags.setdefault(key, {})[names[(key[0], domain)]] = text
    got_tags = {(int(r.pid), int(r.correlation_id)): json.loads(r.evidence)["nvtx"].get("tags") or {}
                for r in attributed.itertuples()}
    assert {key: t for key, t in got_tags.items() if t} == tags
    assert (name == MFU) == bool(tags)
