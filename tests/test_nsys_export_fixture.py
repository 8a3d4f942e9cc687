"""Tests of the synthetic nsys SQLite export builder (tests/nsys_export.py), checked with plain sqlite3 SQL.

The builder's DDL and ENUM rows are compared with the real export they were copied from
(../shared/data/real/nsys/fuser_thunder_xentropy_phi3_h200_nsys2025.1.sqlite); queries follow
docs/formats.md#nsys-identifiers, #nsys-queries, fixtures docs/field-cases.md (C01, C03, C08-C11, C22).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import real_file
from nsys_export import (
    DEFAULT_META,
    ENUM_NSYS_EVENT_CLASS_ROWS,
    ENUM_NSYS_EVENT_TYPE_ROWS,
    REAL_DDL,
    RECONSTRUCTED_DDL,
    GraphNode,
    GraphTrace,
    Kernel,
    Memcpy,
    Memset,
    Nvtx,
    Runtime,
    Sync,
    c01_export,
    ddl_columns,
    gpid,
    gtid,
    write_nsys_export,
)

REAL_NSYS = ("nsys", "fuser_thunder_xentropy_phi3_h200_nsys2025.1.sqlite")

ALWAYS = {"StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "META_DATA_EXPORT",
          "ENUM_NSYS_EVENT_TYPE", "ENUM_NSYS_EVENT_CLASS"}


def _real() -> sqlite3.Connection:
    return sqlite3.connect(f"file:{real_file(*REAL_NSYS)}?mode=ro", uri=True)


def _open(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]


def _sql(conn: sqlite3.Connection, table: str) -> str:
    return conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]


# Q1 of docs/formats.md#nsys-queries: kernel -> launching API call of the same process, backtrace duplicates dropped.
Q1 = """
SELECT kn.value, k.start, k."end", k.streamId, k.correlationId, (k.globalPid >> 24) & 0xFFFFFF,
       rn.value, r.start, r."end", (r.globalTid >> 24) & 0xFFFFFF, r.globalTid & 0xFFFFFF
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r
  ON r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid AND r.eventClass IN (0, 1)
JOIN StringIds AS kn ON kn.id = k.shortName
JOIN StringIds AS rn ON rn.id = r.nameId
ORDER BY k.start
"""


def test_global_ids_follow_the_linux_layout():
    assert gtid("10:2") == (1 << 48) | (10 << 24) | 2
    assert gpid(10) == gtid("10:0") == gtid("10:2") & 0xFFFFFFFFFF000000
    assert gtid("1230493:1230493") == 302119224788637  # docs/formats.md#nsys-identifiers example
    for bad in ("10", "a:b", "1:2:3", f"{1 << 24}:1", "-1:1"):
        with pytest.raises(ValueError, match="pid|tid"):
            gtid(bad)


def test_c01_rows_round_trip(tmp_path):
    conn = _open(c01_export(tmp_path / "c01.sqlite"))
    assert _tables(conn) == ALWAYS
    assert conn.execute(Q1).fetchall() == [
        ("gemm_bwd", 2700, 3700, 7, 7, 10, "cudaLaunchKernel_v7000", 2500, 2600, 10, 2),
        ("reduce_bwd", 5200, 5400, 7, 8, 10, "cudaLaunchKernel_v7000", 5000, 5100, 10, 2),
    ]
    nvtx = conn.execute("""
        SELECT coalesce(n.text, s.value), n.eventType, (n.globalTid >> 24) & 0xFFFFFF, n.globalTid & 0xFFFFFF,
               n.globalTid / 0x1000000 % 0x1000000, n.globalTid % 0x1000000, n.start, n."end", n.domainId,
               n.textId, n.endGlobalTid
        FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId ORDER BY n.start""").fetchall()
    assert nvtx == [("user:backward", 59, 10, 1, 10, 1, 1000, 9000, 0, None, None),
                    ("MmBackward0", 59, 10, 2, 10, 2, 2000, 4000, 0, None, None)]
    kernel = conn.execute("""
        SELECT d.value, s.value, k.mangledName, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, k.deviceId,
               k.contextId, k.registersPerThread, k.launchType, k.graphNodeId
        FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName
        WHERE k.correlationId = 7""").fetchone()
    assert kernel == ("gemm_bwd", "gemm_bwd", None, 4, 2, 1, 256, 1, 1, 0, 1, 32, 1, None)
    # one StringIds row per distinct string, ids from 0
    assert conn.execute("SELECT id, value FROM StringIds ORDER BY id").fetchall() == [
        (0, "cudaLaunchKernel_v7000"), (1, "gemm_bwd"), (2, "reduce_bwd")]
    assert dict(conn.execute("SELECT name, value FROM META_DATA_EXPORT")) == DEFAULT_META
    assert DEFAULT_META["EXPORT_PRODUCT_VERSION"] == "2025.1.1.110"
    assert DEFAULT_META["EXPORT_SCHEMA_VERSION"] == "3.17.1"
    assert DEFAULT_META["EXPORT_PLATFORM"] == "linux-desktop"


def test_c01_ddl_matches_the_real_export(tmp_path):
    real = _real()
    fixture = _open(c01_export(tmp_path / "c01.sqlite"))
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
        assert _sql(fixture, table) == _sql(real, table), table
        assert [row[1:] for row in fixture.execute(f"PRAGMA table_info({table})")] == \
               [row[1:] for row in real.execute(f"PRAGMA table_info({table})")], table


def test_every_copied_table_and_enum_row_matches_the_real_export(tmp_path):
    real = _real()
    path = write_nsys_export(
        tmp_path / "all.sqlite",
        kernels=[Kernel("k", 10, 7, 10, 20, 1, mangled="_Z1kv", short="k")],
        runtime=[Runtime("cudaLaunchKernel_v7000", "10:1", 0, 5, 1)],
        memcpy=[Memcpy(10, 7, 30, 40, 2)], memset=[Memset(10, 7, 50, 60, 3)], sync=[Sync(10, 7, 70, 80, 4)],
        devices=[{"id": 0, "name": "NVIDIA H200", "cuda_device_map": [(0, 0, 10)]}],
        processes={10: "python3"}, thread_names={"10:1": "python3"},
    )
    fixture = _open(path)
    assert set(REAL_DDL) <= _tables(fixture)
    for table, ddl in REAL_DDL.items():
        assert ddl == _sql(real, table), table
        assert _sql(fixture, table) == _sql(real, table), table
    for table, rows in (("ENUM_NSYS_EVENT_TYPE", ENUM_NSYS_EVENT_TYPE_ROWS),
                        ("ENUM_NSYS_EVENT_CLASS", ENUM_NSYS_EVENT_CLASS_ROWS)):
        expected = real.execute(f"SELECT id, name, label FROM {table} ORDER BY id").fetchall()
        assert list(rows) == expected
        assert fixture.execute(f"SELECT id, name, label FROM {table} ORDER BY id").fetchall() == expected


def test_side_tables_round_trip(tmp_path):
    conn = _open(write_nsys_export(
        tmp_path / "side.sqlite",
        runtime=[Runtime("cudaMemcpyAsync_v3020", "10:1", 0, 5, 2), Runtime("cudaMemsetAsync_v3020", "10:1", 6, 9, 3)],
        memcpy=[Memcpy(10, 7, 30, 40, 2, bytes=4096, copy_kind=2, device=1)],
        memset=[Memset(10, 7, 50, 60, 3, bytes=64)], sync=[Sync(10, 7, 70, 80, 4, sync_type=1, event_id=5)],
        devices=[{"id": 3, "cuDevice": 0, "name": "NVIDIA A100-SXM4-40GB"}, {"cuda_device_map": [(3, 0, 10)]}],
        processes={10: "python3"}, thread_names={"10:1": "pt_main_thread"},
    ))
    assert conn.execute("""SELECT bytes, copyKind, srcKind, dstKind, deviceId, streamId, correlationId, globalPid
                           FROM CUPTI_ACTIVITY_KIND_MEMCPY""").fetchall() == [(4096, 2, 2, 0, 1, 7, 2, gpid(10))]
    assert conn.execute("SELECT bytes, value, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall() == [(64, 0, 3)]
    assert conn.execute("SELECT syncType, eventId FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION").fetchall() == [(1, 5)]
    assert conn.execute("SELECT vmId, id, cuDevice, name FROM TARGET_INFO_GPU").fetchall() == [
        (1 << 48, 3, 0, "NVIDIA A100-SXM4-40GB")]
    assert conn.execute("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE").fetchall() == [(3, 0, 10)]
    assert conn.execute("SELECT globalPid, pid, name FROM PROCESSES").fetchall() == [(gpid(10), 10, "python3")]
    assert conn.execute("""SELECT (t.globalTid >> 24) & 0xFFFFFF, t.globalTid & 0xFFFFFF, s.value
                           FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId""").fetchall() == [
        (10, 1, "pt_main_thread")]


def test_tables_are_created_lazily(tmp_path):
    assert _tables(_open(write_nsys_export(tmp_path / "empty.sqlite"))) == ALWAYS
    no_kernels = _open(write_nsys_export(tmp_path / "nokernels.sqlite", kernel_table=False, nvtx_table=None))
    assert _tables(no_kernels) == ALWAYS - {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"}
    assert no_kernels.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone() == (0,)


def test_c03_graph_tables(tmp_path):
    conn = _open(write_nsys_export(
        tmp_path / "c03.sqlite",
        runtime=[Runtime("cudaGraphLaunch_v10000", "10:1", 1010, 1020, 50)],
        graph_nodes=[GraphNode("10:1", 100, 110, 1), GraphNode("10:1", 500, 501, 11, original_graph_node_id=1)],
        kernels=[Kernel("k_a", 10, 7, 1030, 1040, 50, graph_node_id=11)],
        graph_trace=[GraphTrace(10, 7, 1030, 1070, 50, graph_id=3)],
    ))
    for table, ddl in RECONSTRUCTED_DDL.items():
        assert _sql(conn, table) == ddl
    assert ddl_columns(RECONSTRUCTED_DDL["CUDA_GRAPH_NODE_EVENTS"]) == [
        "start", "end", "globalTid", "nameId", "graphNodeId", "originalGraphNodeId"]
    assert ddl_columns(RECONSTRUCTED_DDL["CUPTI_ACTIVITY_KIND_GRAPH_TRACE"]) == [
        "start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid", "graphId",
        "graphExecId"]
    # Q4 of docs/formats.md#nsys-queries: replayed kernel -> capture-time node creation
    assert conn.execute("""
        SELECT s.value, r.start, cge2.start, cge2."end", n.value
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
        JOIN StringIds s ON s.id = k.shortName
        LEFT JOIN CUDA_GRAPH_NODE_EVENTS cge1 ON cge1.graphNodeId = k.graphNodeId AND cge1.originalGraphNodeId IS NOT NULL
        LEFT JOIN CUDA_GRAPH_NODE_EVENTS cge2 ON cge2.graphNodeId = cge1.originalGraphNodeId
        LEFT JOIN StringIds n ON n.id = cge2.nameId""").fetchall() == [("k_a", 1010, 100, 110, "cudaGraphAddKernelNode")]
    assert conn.execute("""SELECT start, "end", correlationId, graphId, streamId, globalPid
                           FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE""").fetchall() == [(1030, 1070, 50, 3, 7, gpid(10))]


def test_c08_nvtx_schema_drift(tmp_path):
    launch = {"runtime": [Runtime("cudaLaunchKernel", "10:1", 150, 155, 1)],
              "kernels": [Kernel("gemm", 10, 7, 160, 170, 1)]}
    a = _open(write_nsys_export(tmp_path / "a.sqlite", nvtx_table="NVTX_EVENTS_V2",
                                nvtx=[Nvtx("aten::mm", 59, "10:1", 100, 200, registered=True)], **launch))
    assert "NVTX_EVENTS" not in _tables(a)
    assert _columns(a, "NVTX_EVENTS_V2") == ddl_columns(REAL_DDL["NVTX_EVENTS"])
    assert a.execute("""SELECT n.text, coalesce(n.text, s.value) FROM NVTX_EVENTS_V2 n
                        LEFT JOIN StringIds s ON s.id = n.textId""").fetchall() == [(None, "aten::mm")]

    b = _open(write_nsys_export(tmp_path / "b.sqlite", nvtx_table=None, **launch))
    assert not [t for t in _tables(b) if t.startswith("NVTX")]

    c = _open(write_nsys_export(tmp_path / "c.sqlite", nvtx_text_columns=("text",),
                                nvtx=[Nvtx("aten::mm", 59, "10:1", 100, 200)], **launch))
    assert "textId" not in _columns(c, "NVTX_EVENTS")
    assert _columns(c, "NVTX_EVENTS") == [col for col in ddl_columns(REAL_DDL["NVTX_EVENTS"]) if col != "textId"]
    assert c.execute("SELECT text FROM NVTX_EVENTS").fetchall() == [("aten::mm",)]


def test_c09_start_end_ranges_keep_end_thread_and_range_id(tmp_path):
    conn = _open(write_nsys_export(tmp_path / "c09.sqlite", nvtx=[
        Nvtx("fwd", 59, "10:1", 100, 500),
        Nvtx("step", 60, "10:1", 50, 900, end_thread="10:2", range_id=1),
        Nvtx("phaseB", 60, "10:1", 400, 800, range_id=2),
    ]))
    assert conn.execute("""SELECT text, eventType, rangeId, endGlobalTid & 0xFFFFFF, (endGlobalTid >> 24) & 0xFFFFFF
                           FROM NVTX_EVENTS ORDER BY start""").fetchall() == [
        ("step", 60, 1, 2, 10), ("fwd", 59, None, None, None), ("phaseB", 60, 2, None, None)]


def test_c10_unclosed_and_inverted_ranges_are_stored_as_given(tmp_path):
    conn = _open(write_nsys_export(tmp_path / "c10.sqlite", nvtx=[
        Nvtx("outer", 59, "10:1", 100, None), Nvtx("bad", 59, "10:1", 7000, 6900)]))
    assert conn.execute('SELECT text, start, "end" FROM NVTX_EVENTS').fetchall() == [
        ("outer", 100, None), ("bad", 7000, 6900)]


def test_c11_domains_are_domain_create_rows(tmp_path):
    conn = _open(write_nsys_export(
        tmp_path / "c11.sqlite", domains={(10, 7): "deepspeed"},
        nvtx=[Nvtx("aten::linear", 59, "10:1", 100, 400), Nvtx("allreduce_hook", 59, "10:1", 150, 350, domain=7)]))
    # Q5 of docs/formats.md#nsys-queries
    assert conn.execute("""SELECT (globalTid >> 24) & 0xFFFFFF, globalTid & 0xFFFFFF, domainId,
                                  coalesce(text, (SELECT value FROM StringIds WHERE id = textId)), "end"
                           FROM NVTX_EVENTS WHERE eventType = 75""").fetchall() == [(10, 10, 7, "deepspeed", None)]
    assert conn.execute("SELECT text, domainId FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY start").fetchall() == [
        ("aten::linear", 0), ("allreduce_hook", 7)]
    # without a text column the domain name is a registered string
    registered = _open(write_nsys_export(tmp_path / "c11b.sqlite", domains={(10, 7): "deepspeed"},
                                         nvtx_text_columns=("textId",)))
    assert registered.execute("""SELECT s.value FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId
                                 WHERE n.eventType = 75""").fetchall() == [("deepspeed",)]


def test_c22_processes_share_correlation_ids(tmp_path):
    rows = {"nvtx": [], "runtime": [], "kernels": []}
    for device, pid in enumerate((111, 222)):
        rows["nvtx"].append(Nvtx("aten::mm", 59, f"{pid}:1", 100, 300))
        rows["runtime"].append(Runtime("cudaLaunchKernel", f"{pid}:1", 200, 205, 5))
        rows["kernels"].append(Kernel("gemm", pid, 7, 250, 350, 5, device=device))
    rows["nvtx"].append(Nvtx("worker_fetch", 59, "333:1", 0, 1000))
    conn = _open(write_nsys_export(
        tmp_path / "c22.sqlite", **rows,
        devices=[{"id": 0, "cuda_device_map": [(0, 0, 111)]}, {"id": 1, "cuda_device_map": [(1, 1, 222)]}]))
    joined = conn.execute("""
        SELECT (k.globalPid >> 24) & 0xFFFFFF, (r.globalTid >> 24) & 0xFFFFFF, k.deviceId, g.id
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
          ON r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid
        LEFT JOIN TARGET_INFO_CUDA_DEVICE d ON d.cudaId = k.deviceId AND d.pid = (k.globalPid >> 24) & 0xFFFFFF
        JOIN TARGET_INFO_GPU g ON g.id = d.gpuId
        ORDER BY 1""").fetchall()
    assert joined == [(111, 111, 0, 0), (222, 222, 1, 1)]
    assert conn.execute("SELECT DISTINCT (globalTid >> 24) & 0xFFFFFF FROM NVTX_EVENTS ORDER BY 1").fetchall() == [
        (111,), (222,), (333,)]


def test_schema_options_drop_columns(tmp_path):
    conn = _open(write_nsys_export(
        tmp_path / "old.sqlite", runtime_event_class=False,
        runtime=[Runtime("cudaLaunchKernel", "10:1", 0, 5, 1)], kernels=[Kernel("k", 10, 7, 10, 20, 1)],
        drop_columns={"CUPTI_ACTIVITY_KIND_KERNEL": ["gridX", "sharedMemoryLimitConfig"], "NVTX_EVENTS": ["binaryData"]},
        meta={"EXPORT_SCHEMA_VERSION": "2.9.1"},
    ))
    assert "eventClass" not in _columns(conn, "CUPTI_ACTIVITY_KIND_RUNTIME")
    kernel_columns = _columns(conn, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert kernel_columns == [c for c in ddl_columns(REAL_DDL["CUPTI_ACTIVITY_KIND_KERNEL"])
                              if c not in ("gridX", "sharedMemoryLimitConfig")]
    assert _columns(conn, "NVTX_EVENTS")[-1] == "jsonText"
    assert _sql(conn, "NVTX_EVENTS").endswith("One of possible payload value union members.\n)")
    assert conn.execute("SELECT gridY, graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall() == [(1, None)]
    assert conn.execute("SELECT nameId, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchall() == [(0, 1)]
    assert conn.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall() == [("EXPORT_SCHEMA_VERSION", "2.9.1")]


@pytest.mark.parametrize(("options", "message"), [
    ({"nvtx": [Nvtx("x", 59, "1:1", 0, 1, registered=True)], "nvtx_text_columns": ("text",)}, "no textId"),
    ({"nvtx": [Nvtx("x", 59, "1:1", 0, 1)], "nvtx_text_columns": ("textId",)}, "no text column"),
    ({"nvtx": [Nvtx("x", 59, "1:1", 0, 1)], "nvtx_table": None}, "nvtx_table=None"),
    ({"kernels": [Kernel("k", 1, 7, 0, 1, 1)], "kernel_table": False}, "kernel_table=False"),
    ({"drop_columns": {"CUPTI_ACTIVITY_KIND_KERNEL": ["gridW"]}}, "gridW"),
    ({"drop_columns": {"NO_SUCH_TABLE": ["x"]}}, "NO_SUCH_TABLE"),
    ({"kernels": [Kernel("k", 1, 7, 0, 1, 1, grid=(1, 1))]}, "grid"),
    ({"devices": [{"id": 0, "noSuchColumn": 1}]}, "noSuchColumn"),
])
def test_inconsistent_requests_raise_and_leave_no_file(tmp_path, options, message):
    target = tmp_path / "bad.sqlite"
    with pytest.raises(ValueError, match=message):
        write_nsys_export(target, **options)
    assert list(tmp_path.iterdir()) == []


def test_rewrite_replaces_the_file(tmp_path):
    target = tmp_path / "x.sqlite"
    write_nsys_export(target, kernels=[Kernel("a", 1, 7, 0, 1, 1)])
    assert write_nsys_export(target) == target
    assert _open(target).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone() == (0,)
