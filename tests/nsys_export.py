"""Small synthetic Nsight Systems SQLite exports with the real table/column layout (test support, not a test).

``write_nsys_export(path, kernels=..., runtime=..., nvtx=..., ...)`` writes a file shaped like
``nsys export --type sqlite`` of nsys 2025.1.1 (export schema 3.17.1), so tests of the nsys reader can spell out the
fixtures of docs/field-cases.md (C01, C03, C08-C11, C22, ...) row by row. Layout: docs/formats.md
(nsys identifiers, tables, NVTX event types, queries).

* ``REAL_DDL`` holds the ``CREATE TABLE`` text copied verbatim (``SELECT sql FROM sqlite_master WHERE name=?``) from the
  real export ../shared/data/real/nsys/fuser_thunder_xentropy_phi3_h200_nsys2025.1.sqlite; the two ENUM tables' rows are
  copied from the same file. Nothing else of that file is copied.
* ``RECONSTRUCTED_DDL`` holds the two CUDA-graph tables, which no real sample contains: they are written from the
  documented columns (docs/formats.md#nsys-cuda-graphs), not copied.
* Identifiers as on Linux: ``globalTid = 1 << 48 (vmId 1) | pid << 24 | tid``; ``globalPid`` = the same with tid 0.
* Strings (kernel names, API names, registered NVTX strings, graph-node and thread names) go to ``StringIds`` with ids
  assigned from 0 upwards in first-use order (real exports also use id 0, so ``if textId:`` is a bug a reader can show).
* Tables are created lazily like ``EXPORT_PARAM_LAZY=true`` exports: only when they have rows, except StringIds,
  META_DATA_EXPORT, the ENUM tables, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_KERNEL (unless
  ``kernel_table=False``) and the NVTX table (unless ``nvtx_table=None``), which always exist.
* NOT NULL columns the caller gives no value for get realistic defaults (contextId 1, registersPerThread 32, launchType 1,
  returnValue 0, ...); nullable ones without a value are NULL.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

VM_ID = 1  # Linux exports: hwId 0, vmId 1 (docs/formats.md#nsys-identifiers)
GLOBAL_VID = VM_ID << 48  # 281474976710656, TARGET_INFO_GPU.vmId in real Linux exports
_ID_MASK = 0xFFFFFF


def _pid_tid(thread: str) -> tuple[int, int]:
    try:
        pid_text, tid_text = thread.split(":")
        pid, tid = int(pid_text), int(tid_text)
    except (AttributeError, ValueError):
        raise ValueError(f"thread must be 'pid:tid', got {thread!r}") from None
    for what, value in (("pid", pid), ("tid", tid)):
        if not 0 <= value <= _ID_MASK:
            raise ValueError(f"{what} {value} of {thread!r} does not fit in 24 bits")
    return pid, tid


def gtid(thread: str) -> int:
    """``"pid:tid"`` -> globalTid as a Linux export stores it (vmId 1)."""
    pid, tid = _pid_tid(thread)
    return GLOBAL_VID | pid << 24 | tid


def gpid(pid: int) -> int:
    """pid -> globalPid (globalTid with the tid bits cleared)."""
    if not 0 <= pid <= _ID_MASK:
        raise ValueError(f"pid {pid} does not fit in 24 bits")
    return GLOBAL_VID | pid << 24


# --- rows the caller describes -----------------------------------------------------------------------------------


@dataclass
class Nvtx:
    """One NVTX_EVENTS row (59 push/pop, 60 start/end, 34 mark, 75 domain create, ...: docs/formats.md#nsys-nvtx-event-types)."""

    text: str | None
    event_type: int
    thread: str  # "pid:tid" -> globalTid
    start: int
    end: int | None
    domain: int = 0
    registered: bool = False  # True: the string goes to StringIds via textId and text is NULL
    end_thread: str | None = None  # -> endGlobalTid, for start/end ranges ended on another thread
    range_id: int | None = None


@dataclass
class Runtime:
    """One CUPTI_ACTIVITY_KIND_RUNTIME row (CUDA runtime or driver API call)."""

    name: str
    thread: str
    start: int
    end: int
    correlation: int | None
    event_class: int = 0  # 0 runtime, 1 driver, 67 backtrace duplicate


@dataclass
class Kernel:
    """One CUPTI_ACTIVITY_KIND_KERNEL row."""

    name: str  # demangledName
    pid: int
    stream: int
    start: int
    end: int
    correlation: int | None
    grid: tuple = (1, 1, 1)
    block: tuple = (128, 1, 1)
    device: int = 0  # deviceId: the CUDA ordinal
    graph_node_id: int | None = None
    mangled: str | None = None
    short: str | None = None  # shortName; defaults to name


@dataclass
class Memcpy:
    """One CUPTI_ACTIVITY_KIND_MEMCPY row; copy_kind: 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP (ENUM_CUDA_MEMCPY_OPER)."""

    pid: int
    stream: int
    start: int
    end: int
    correlation: int | None
    bytes: int = 1024
    copy_kind: int = 1
    device: int = 0


@dataclass
class Memset:
    """One CUPTI_ACTIVITY_KIND_MEMSET row."""

    pid: int
    stream: int
    start: int
    end: int
    correlation: int | None
    bytes: int = 1024
    device: int = 0


@dataclass
class Sync:
    """One CUPTI_ACTIVITY_KIND_SYNCHRONIZATION row; sync_type: 1 event, 2 stream wait, 3 stream, 4 context sync."""

    pid: int
    stream: int
    start: int
    end: int
    correlation: int | None
    sync_type: int = 3
    event_id: int = 0xFFFFFFFF  # what real exports store when no CUDA event is involved
    device: int = 0


@dataclass
class GraphNode:
    """One CUDA_GRAPH_NODE_EVENTS row (node creation during capture, or a clone when original_graph_node_id is set)."""

    thread: str
    start: int
    end: int
    graph_node_id: int
    original_graph_node_id: int | None = None
    name: str = "cudaGraphAddKernelNode"


@dataclass
class GraphTrace:
    """One CUPTI_ACTIVITY_KIND_GRAPH_TRACE row (one graph execution, graph-level tracing)."""

    pid: int
    stream: int
    start: int
    end: int
    correlation: int | None
    graph_id: int
    device: int = 0


# --- format data -------------------------------------------------------------------------------------------------

DEFAULT_META: dict[str, str] = {
    "EXPORT_PRODUCT_NAME": "NVIDIA Nsight Systems",
    "EXPORT_PRODUCT_VERSION": "2025.1.1.110",
    "EXPORT_PRODUCT_DATE": "2025.1",
    "EXPORT_SCHEMA_VERSION": "3.17.1",
    "EXPORT_SCHEMA_VERSION_MAJOR": "3",
    "EXPORT_SCHEMA_VERSION_MINOR": "17",
    "EXPORT_SCHEMA_VERSION_MICRO": "1",
    "EXPORT_PLATFORM": "linux-desktop",
    "EXPORT_ARCH": "x64",
    "EXPORT_PARAM_INPUT_FILE": "report1.nsys-rep",
    "EXPORT_PARAM_OUTPUT_FILE": "report1.sqlite",
    "EXPORT_PARAM_LAZY": "true",
    "EXPORT_PARAM_TIME_NORMALIZE": "false",
    "EXPORT_PARAM_TIME_SHIFT": "0",
}

# CREATE TABLE text copied verbatim from fuser_thunder_xentropy_phi3_h200_nsys2025.1.sqlite (nsys 2025.1.1, schema 3.17.1).
REAL_DDL: dict[str, str] = {
    "StringIds": """\
CREATE TABLE StringIds (
    -- Consolidation of repetitive string values.

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- ID reference value.
    value                       TEXT      NOT NULL                     -- String value.
)""",
    "CUPTI_ACTIVITY_KIND_KERNEL": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    demangledName               INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Kernel function name w/ templates
    shortName                   INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Base kernel function name
    mangledName                 INTEGER,                               -- REFERENCES StringIds(id) -- Raw C++ mangled kernel function name
    launchType                  INTEGER,                               -- REFERENCES ENUM_CUDA_KERNEL_LAUNCH_TYPE(id)
    cacheConfig                 INTEGER,                               -- REFERENCES ENUM_CUDA_FUNC_CACHE_CONFIG(id)
    registersPerThread          INTEGER   NOT NULL,                    -- Number of registers required for each thread executing the kernel.
    gridX                       INTEGER   NOT NULL,                    -- X-dimension grid size.
    gridY                       INTEGER   NOT NULL,                    -- Y-dimension grid size.
    gridZ                       INTEGER   NOT NULL,                    -- Z-dimension grid size.
    blockX                      INTEGER   NOT NULL,                    -- X-dimension block size.
    blockY                      INTEGER   NOT NULL,                    -- Y-dimension block size.
    blockZ                      INTEGER   NOT NULL,                    -- Z-dimension block size.
    staticSharedMemory          INTEGER   NOT NULL,                    -- Static shared memory allocated for the kernel (B).
    dynamicSharedMemory         INTEGER   NOT NULL,                    -- Dynamic shared memory reserved for the kernel (B).
    localMemoryPerThread        INTEGER   NOT NULL,                    -- Amount of local memory reserved for each thread (B).
    localMemoryTotal            INTEGER   NOT NULL,                    -- Total amount of local memory reserved for the kernel (B).
    gridId                      INTEGER   NOT NULL,                    -- Unique grid ID of the kernel assigned at runtime.
    sharedMemoryExecuted        INTEGER,                               -- Shared memory size set by the driver.
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_NODE_EVENTS(graphNodeId)
    sharedMemoryLimitConfig     INTEGER                                -- REFERENCES ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG(id)
)""",
    "CUPTI_ACTIVITY_KIND_RUNTIME": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    eventClass                  INTEGER   NOT NULL,                    -- REFERENCES ENUM_NSYS_EVENT_CLASS(id)
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    correlationId               INTEGER,                               -- ID used to identify events that this function call has triggered.
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Function name
    returnValue                 INTEGER   NOT NULL,                    -- Return value of the function call.
    callchainId                 INTEGER                                -- REFERENCES CUDA_CALLCHAINS(id)
)""",
    "NVTX_EVENTS": """\
CREATE TABLE NVTX_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER,                               -- Event end timestamp (ns).
    eventType                   INTEGER   NOT NULL,                    -- REFERENCES ENUM_NSYS_EVENT_TYPE(id)
    rangeId                     INTEGER,                               -- Correlation ID returned from a nvtxRangeStart call.
    category                    INTEGER,                               -- User-controlled ID that can be used to group events.
    color                       INTEGER,                               -- Encoded ARGB color value.
    text                        TEXT,                                  -- Explicit name/text (non-registered string)
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    endGlobalTid                INTEGER,                               -- Serialized GlobalId.
    textId                      INTEGER,                               -- REFERENCES StringIds(id) -- Registered NVTX domain/string
    domainId                    INTEGER,                               -- User-controlled ID that can be used to group events.
    uint64Value                 INTEGER,                               -- One of possible payload value union members.
    int64Value                  INTEGER,                               -- One of possible payload value union members.
    doubleValue                 REAL,                                  -- One of possible payload value union members.
    uint32Value                 INTEGER,                               -- One of possible payload value union members.
    int32Value                  INTEGER,                               -- One of possible payload value union members.
    floatValue                  REAL,                                  -- One of possible payload value union members.
    jsonTextId                  INTEGER,                               -- One of possible payload value union members.
    jsonText                    TEXT,                                  -- One of possible payload value union members.
    binaryData                  TEXT                                   -- Binary payload. See docs for format.
)""",
    "CUPTI_ACTIVITY_KIND_MEMCPY": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    bytes                       INTEGER   NOT NULL,                    -- Number of bytes transferred (B).
    copyKind                    INTEGER   NOT NULL,                    -- REFERENCES ENUM_CUDA_MEMCPY_OPER(id)
    deprecatedSrcId             INTEGER,                               -- Deprecated, use srcDeviceId instead.
    srcKind                     INTEGER,                               -- REFERENCES ENUM_CUDA_MEM_KIND(id)
    dstKind                     INTEGER,                               -- REFERENCES ENUM_CUDA_MEM_KIND(id)
    srcDeviceId                 INTEGER,                               -- Source device ID.
    srcContextId                INTEGER,                               -- Source context ID.
    dstDeviceId                 INTEGER,                               -- Destination device ID.
    dstContextId                INTEGER,                               -- Destination context ID.
    migrationCause              INTEGER,                               -- REFERENCES ENUM_CUDA_UNIF_MEM_MIGRATION(id)
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_NODE_EVENTS(graphNodeId)
    virtualAddress              INTEGER                                -- Virtual base address of the page/s being transferred.
)""",
    "CUPTI_ACTIVITY_KIND_MEMSET": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    value                       INTEGER   NOT NULL,                    -- Value assigned to memory.
    bytes                       INTEGER   NOT NULL,                    -- Number of bytes set (B).
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_NODE_EVENTS(graphNodeId)
    memKind                     INTEGER                                -- REFERENCES ENUM_CUDA_MEM_KIND(id)
)""",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- Correlation ID of the synchronization API to which this result is associated.
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    deprecatedSyncType          INTEGER,                               -- Deprecated, use syncType instead. For older report, REFERENCES ENUM_CUPTI_SYNC_TYPE(id)
    syncType                    INTEGER   NOT NULL,                    -- REFERENCES ENUM_CUPTI_SYNC_TYPE(id)
    eventId                     INTEGER   NOT NULL,                    -- Event ID for which the synchronization API is called.
    eventSyncId                 INTEGER                                -- CUDA Event Sync ID to link the synchronization API to associated event record API.
)""",
    "META_DATA_EXPORT": """\
CREATE TABLE META_DATA_EXPORT (
    -- information about nsys export process

    name                        TEXT      NOT NULL,                    -- Name of meta-data record
    value                       TEXT                                   -- Value of meta-data record
)""",
    "TARGET_INFO_GPU": """\
CREATE TABLE TARGET_INFO_GPU (
    vmId                        INTEGER   NOT NULL,                    -- Serialized GlobalId.
    id                          INTEGER   NOT NULL,                    -- Device ID.
    name                        TEXT,                                  -- Device name.
    busLocation                 TEXT,                                  -- PCI bus location.
    isDiscrete                  INTEGER,                               -- True if discrete, false if integrated.
    l2CacheSize                 INTEGER,                               -- Size of L2 cache (B).
    totalMemory                 INTEGER,                               -- Total amount of memory on the device (B).
    memoryBandwidth             INTEGER,                               -- Amount of memory transferred (B).
    clockRate                   INTEGER,                               -- Clock frequency (Hz).
    smCount                     INTEGER,                               -- Number of multiprocessors on the device.
    pwGpuId                     INTEGER,                               -- PerfWorks GPU ID.
    uuid                        TEXT,                                  -- Device UUID.
    luid                        INTEGER,                               -- Device LUID.
    chipName                    TEXT,                                  -- Chip name.
    cuDevice                    INTEGER,                               -- CUDA device ID.
    ctxswDevPath                TEXT,                                  -- GPU context switch device node path.
    ctrlDevPath                 TEXT,                                  -- GPU control device node path.
    revision                    INTEGER,                               -- Revision number.
    nodeMask                    INTEGER,                               -- Device node mask.
    constantMemory              INTEGER,                               -- Memory available on device for __constant__ variables (B).
    maxIPC                      INTEGER,                               -- Maximum instructions per count.
    maxRegistersPerBlock        INTEGER,                               -- Maximum number of 32-bit registers available per block.
    maxShmemPerBlock            INTEGER,                               -- Maximum optin shared memory per block.
    maxShmemPerBlockOptin       INTEGER,                               -- Maximum optin shared memory per block.
    maxShmemPerSm               INTEGER,                               -- Maximum shared memory available per multiprocessor (B).
    maxRegistersPerSm           INTEGER,                               -- Maximum number of 32-bit registers available per multiprocessor.
    threadsPerWarp              INTEGER,                               -- Warp size in threads.
    asyncEngines                INTEGER,                               -- Number of asynchronous engines.
    maxWarpsPerSm               INTEGER,                               -- Maximum number of warps per multiprocessor.
    maxBlocksPerSm              INTEGER,                               -- Maximum number of blocks per multiprocessor.
    maxThreadsPerBlock          INTEGER,                               -- Maximum number of threads per block.
    maxBlockDimX                INTEGER,                               -- Maximum X-dimension of a block.
    maxBlockDimY                INTEGER,                               -- Maximum Y-dimension of a block.
    maxBlockDimZ                INTEGER,                               -- Maximum Z-dimension of a block.
    maxGridDimX                 INTEGER,                               -- Maximum X-dimension of a grid.
    maxGridDimY                 INTEGER,                               -- Maximum Y-dimension of a grid.
    maxGridDimZ                 INTEGER,                               -- Maximum Z-dimension of a grid.
    computeMajor                INTEGER,                               -- Major compute capability version number.
    computeMinor                INTEGER,                               -- Minor compute capability version number.
    smMajor                     INTEGER,                               -- Major multiprocessor version number.
    smMinor                     INTEGER                                -- Minor multiprocessor version number.
)""",
    "TARGET_INFO_CUDA_DEVICE": """\
CREATE TABLE TARGET_INFO_CUDA_DEVICE (
    gpuId                       INTEGER,                               -- GPU ID.
    cudaId                      INTEGER   NOT NULL,                    -- CUDA device ID.
    pid                         INTEGER   NOT NULL                     -- Process ID.
)""",
    "ThreadNames": """\
CREATE TABLE ThreadNames (
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Thread name
    priority                    INTEGER,                               -- Priority of the thread.
    globalTid                   INTEGER                                -- Serialized GlobalId.
)""",
    "PROCESSES": """\
CREATE TABLE PROCESSES (
    -- Names and identifiers of processes captured in the report.

    globalPid                   INTEGER,                               -- Serialized GlobalId.
    pid                         INTEGER,                               -- The process ID.
    name                        TEXT                                   -- The process name.
)""",
    "ENUM_NSYS_EVENT_TYPE": """\
CREATE TABLE ENUM_NSYS_EVENT_TYPE (
    -- Nsys event type labels

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- Enum numerical value.
    name                        TEXT,                                  -- Enum symbol name.
    label                       TEXT                                   -- Enum human name.
)""",
    "ENUM_NSYS_EVENT_CLASS": """\
CREATE TABLE ENUM_NSYS_EVENT_CLASS (
    -- Nsys event class labels

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- Enum numerical value.
    name                        TEXT,                                  -- Enum symbol name.
    label                       TEXT                                   -- Enum human name.
)""",
}

# NOT copied: no real sample has these tables. Reconstructed from the documented columns (docs/formats.md#nsys-cuda-graphs
# tables: nsys recipe / CUPTI record fields), written in the layout of the copied DDL.
RECONSTRUCTED_DDL: dict[str, str] = {
    "CUDA_GRAPH_NODE_EVENTS": """\
CREATE TABLE CUDA_GRAPH_NODE_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id)
    graphNodeId                 INTEGER   NOT NULL,                    -- Graph node ID.
    originalGraphNodeId         INTEGER                                -- Graph node ID this node was cloned from.
)""",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    graphId                     INTEGER   NOT NULL,                    -- Graph ID.
    graphExecId                 INTEGER                                -- Graph exec ID.
)""",
}

# ENUM rows copied from the same real export.
ENUM_NSYS_EVENT_TYPE_ROWS: tuple[tuple[int, str, str], ...] = (
    (0, "Unknown", "Unknown"), (1, "CpuCycles", "CpuCycles"), (2, "Instructions", "Instructions"),
    (3, "CacheReferences", "CacheReferences"), (4, "L1CacheDataWriteMisses", "L1CacheDataWriteMisses"),
    (5, "L1CacheDataReadMisses", "L1CacheDataReadMisses"),
    (6, "L1CacheInstructionMisses", "L1CacheInstructionMisses"),
    (7, "L2CacheDataWriteMisses", "L2CacheDataWriteMisses"), (8, "L2CacheDataReadMisses", "L2CacheDataReadMisses"),
    (9, "L2CacheInstructionMisses", "L2CacheInstructionMisses"), (10, "BranchInstructions", "BranchInstructions"),
    (11, "BranchMisses", "BranchMisses"), (12, "BusCycles", "BusCycles"), (13, "CpuClock", "CpuClock"),
    (14, "TaskClock", "TaskClock"), (15, "PageFault", "PageFault"), (16, "ContextSwitches", "ContextSwitches"),
    (17, "CpuMigrations", "CpuMigrations"), (18, "PageFaultsMin", "PageFaultsMin"),
    (19, "PageFaultsMax", "PageFaultsMax"), (20, "AlignmentFaults", "AlignmentFaults"),
    (21, "EmulationFaults", "EmulationFaults"), (22, "ThreadState", "ThreadState"), (23, "Frames", "Frames"),
    (24, "Annotations", "Annotations"), (25, "SchedSwitch", "SchedSwitch"), (26, "SchedWakeup", "SchedWakeup"),
    (27, "Command", "Command"), (28, "Mmap", "Mmap"), (29, "MemUsage", "MemUsage"), (30, "Emc", "Emc"),
    (31, "Composite", "Composite"), (32, "NvtxEvents", "NvtxEvents"), (33, "NvtxCategory", "NvtxCategory"),
    (34, "NvtxMark", "NvtxMark"), (35, "NvtxPushRange", "NvtxPushRange"), (36, "NvtxPopRange", "NvtxPopRange"),
    (37, "NvtxStartRange", "NvtxStartRange"), (38, "NvtxEndRange", "NvtxEndRange"), (39, "NvtxThread", "NvtxThread"),
    (40, "PowerRate", "PowerRate"), (41, "Sched", "Sched"), (42, "CpuCyclesSelf", "CpuCyclesSelf"),
    (43, "CpuCyclesTotal", "CpuCyclesTotal"), (44, "CpuCyclesSelfPlus", "CpuCyclesSelfPlus"), (45, "Cuda", "Cuda"),
    (46, "CudaDevice", "CudaDevice"), (47, "TraceProcess", "TraceProcess"), (48, "TraceFunctions", "TraceFunctions"),
    (49, "Diagnostic", "Diagnostic"), (50, "GlWorkload", "GlWorkload"), (51, "BandwidthUsage", "BandwidthUsage"),
    (52, "KhrDebugMark", "KhrDebugMark"), (53, "KhrDebugPushRange", "KhrDebugPushRange"),
    (54, "KhrDebugPopRange", "KhrDebugPopRange"), (55, "KhrDebugGpuMark", "KhrDebugGpuMark"),
    (56, "KhrDebugGpuPushRange", "KhrDebugGpuPushRange"), (57, "KhrDebugGpuPopRange", "KhrDebugGpuPopRange"),
    (58, "GpuCtxsw", "GpuCtxsw"), (59, "NvtxPushPopRange", "NvtxPushPopRange"),
    (60, "NvtxStartEndRange", "NvtxStartEndRange"), (61, "ProfTime", "ProfTime"),
    (62, "KhrDebugPushPopRange", "KhrDebugPushPopRange"), (63, "KhrDebugGpuPushPopRange", "KhrDebugGpuPushPopRange"),
    (64, "NvtxtCategory", "NvtxtCategory"), (65, "NvtxtMark", "NvtxtMark"), (66, "NvtxtPushRange", "NvtxtPushRange"),
    (67, "NvtxtPopRange", "NvtxtPopRange"), (68, "NvtxtStartRange", "NvtxtStartRange"),
    (69, "NvtxtEndRange", "NvtxtEndRange"), (70, "NvtxtPushPopRange", "NvtxtPushPopRange"),
    (71, "NvtxtStartEndRange", "NvtxtStartEndRange"), (72, "NvtxtMetaThread", "NvtxtMetaThread"),
    (73, "NvtxtMetaProcess", "NvtxtMetaProcess"), (74, "NvtxtMetaFileDisplay", "NvtxtMetaFileDisplay"),
    (75, "NvtxDomainCreate", "NvtxDomainCreate"), (76, "NvtxDomainDestroy", "NvtxDomainDestroy"),
    (77, "NvnGpuCmdBuf", "NvnGpuCmdBuf"), (78, "TraceVSync", "TraceVSync"),
    (79, "CudaDeviceKernel", "CudaDeviceKernel"), (80, "CudaDeviceMemory", "CudaDeviceMemory"), (81, "Pmu", "Pmu"),
    (82, "NvnGpuDraw", "NvnGpuDraw"), (83, "NvnGpuCompute", "NvnGpuCompute"), (84, "NvnGpuDebug", "NvnGpuDebug"),
    (85, "OS runtime libraries", "OS runtime libraries"), (86, "CuDNN", "CuDNN"), (87, "CuBLAS", "CuBLAS"),
    (88, "NvMedia", "NvMedia"), (89, "OpenACC", "OpenACC"), (90, "Correlation", "Correlation"), (91, "DX12", "DX12"),
    (92, "DX12Workload", "DX12Workload"), (93, "PmuRawEvent", "PmuRawEvent"), (94, "GraphicsFrame", "GraphicsFrame"),
    (95, "Vulkan", "Vulkan"), (96, "VulkanWorkload", "VulkanWorkload"),
    (97, "NvtxNameCudaDevice", "NvtxNameCudaDevice"), (98, "NvtxNameCudaContext", "NvtxNameCudaContext"),
    (99, "NvtxNameCudaStream", "NvtxNameCudaStream"), (100, "SystemEvent", "SystemEvent"),
    (101, "GpuMemoryEvent", "GpuMemoryEvent"), (102, "DX12CreateObject", "DX12CreateObject"),
    (103, "VulkanCreateObject", "VulkanCreateObject"), (104, "UnitTraceEvent", "UnitTraceEvent"),
    (105, "CustomETWEvent", "CustomETWEvent"), (106, "CudaSyncEvent", "CudaSyncEvent"),
    (107, "SLIEvent", "SLIEvent"), (108, "CudaBacktrace", "CudaBacktrace"), (109, "WddmEvent", "WddmEvent"),
    (110, "DX11", "DX11"), (111, "DX11CreateObject", "DX11CreateObject"), (112, "DXGI", "DXGI"),
    (113, "CudaGraphNodeCreation", "CudaGraphNodeCreation"), (114, "OpenMP", "OpenMP"),
    (115, "UncorePmuEvent", "UncorePmuEvent"), (116, "UncorePmuCarmel", "UncorePmuCarmel"),
    (117, "CudaDeviceMemoryUsage", "CudaDeviceMemoryUsage"), (118, "ETWDxgKrnlEvent", "ETWDxgKrnlEvent"),
    (119, "CudaUvmCpuPageFaultEvent", "CudaUvmCpuPageFaultEvent"),
    (120, "CudaUvmGpuPageFaultEvent", "CudaUvmGpuPageFaultEvent"),
    (121, "NICMetricsValuesEvent", "NICMetricsValuesEvent"), (122, "NICMetricsListEvent", "NICMetricsListEvent"),
    (123, "InterruptHandler", "InterruptHandler"), (124, "NVENC", "NVENC"), (125, "NVDEC", "NVDEC"),
    (126, "nvJPEG", "nvJPEG"), (127, "CudaEventRecord", "CudaEventRecord"),
    (128, "PerfEventCountEvent", "PerfEventCountEvent"), (129, "CudaDeviceMemoryPool", "CudaDeviceMemoryPool"),
    (130, "CudaDeviceGraph", "CudaDeviceGraph"), (131, "CudaGraphExecCreation", "CudaGraphExecCreation"),
    (132, "CudaGraphCreation", "CudaGraphCreation"), (133, "CudaGraphClone", "CudaGraphClone"),
    (134, "GpuMemoryTransferEvent", "GpuMemoryTransferEvent"), (135, "GlTrace", "GlTrace"),
    (136, "GpuVideoEngineWorkload", "GpuVideoEngineWorkload"),
    (137, "IBSwitchMetricsValuesEvent", "IBSwitchMetricsValuesEvent"), (138, "GenericEvent", "GenericEvent"),
    (139, "UncorePmuT23xScf", "UncorePmuT23xScf"), (140, "UncorePmuT23xDsu", "UncorePmuT23xDsu"),
    (141, "IBSwitchCongestionEvent", "IBSwitchCongestionEvent"), (142, "CudaDeviceMemcpy", "CudaDeviceMemcpy"),
    (143, "PerfMetricValueEvent", "PerfMetricValueEvent"), (144, "OpenXREvent", "OpenXREvent"),
    (145, "TegraInternalEvent", "TegraInternalEvent"), (146, "OSRuntimeStartStop", "OSRuntimeStartStop"),
)

ENUM_NSYS_EVENT_CLASS_ROWS: tuple[tuple[int, str, str], ...] = (
    (0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime"), (1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver"),
    (2, "TRACE_PROCESS_EVENT_GL", "GL"), (3, "TRACE_PROCESS_EVENT_TSP_OVERHEAD", "TSP overhead"),
    (4, "TRACE_PROCESS_EVENT_GL_DEBUG", "GL debug"), (5, "TRACE_PROCESS_EVENT_GL_WORKLOAD", "GL workload"),
    (6, "TRACE_PROCESS_EVENT_NVTX_START", "NVTX start"), (7, "TRACE_PROCESS_EVENT_NVTX_FINISH", "NVTX finish"),
    (8, "TRACE_PROCESS_EVENT_GL_START", "GL start"), (9, "TRACE_PROCESS_EVENT_GL_FINISH", "GL finish"),
    (10, "TRACE_PROCESS_EVENT_CUDA_START", "CUDA start"), (11, "TRACE_PROCESS_EVENT_CUDA_FINISH", "CUDA finish"),
    (12, "TRACE_PROCESS_EVENT_CUDA_INIT_ERROR", "CUDA init error"),
    (13, "TRACE_PROCESS_EVENT_CUDA_EGL_DRIVER", "CUDA EGL driver"), (18, "TRACE_PROCESS_EVENT_VSYNC", "Vsync"),
    (26, "TRACE_PROCESS_EVENT_CUDA_API", "CUDA API"), (27, "TRACE_PROCESS_EVENT_OS_RUNTIME", "OSRT runtime"),
    (28, "TRACE_PROCESS_EVENT_CUDNN", "cuDNN"), (29, "TRACE_PROCESS_EVENT_CUBLAS", "cuBLAS"),
    (31, "TRACE_PROCESS_EVENT_OS_RUNTIME_START", "OSRT start"),
    (32, "TRACE_PROCESS_EVENT_OS_RUNTIME_FINISH", "OSRT finish"),
    (33, "TRACE_PROCESS_EVENT_CUDNN_START", "cuDNN start"), (34, "TRACE_PROCESS_EVENT_CUDNN_FINISH", "cuDNN finish"),
    (35, "TRACE_PROCESS_EVENT_CUBLAS_START", "cuBLAS start"),
    (36, "TRACE_PROCESS_EVENT_CUBLAS_FINISH", "cuBLAS finish"),
    (37, "TRACE_PROCESS_EVENT_THREAD_BLOCK", "Thread block"), (38, "TRACE_PROCESS_EVENT_NVMEDIA", "NVmedia"),
    (39, "TRACE_PROCESS_EVENT_NVMEDIA_START", "NVmedia start"),
    (40, "TRACE_PROCESS_EVENT_NVMEDIA_FINISH", "NVmedia finish"), (41, "TRACE_PROCESS_EVENT_DX12_API", "DX12 API"),
    (42, "TRACE_PROCESS_EVENT_DX12_WORKLOAD", "DX12 workload"), (43, "TRACE_PROCESS_EVENT_DX12_START", "DX12 start"),
    (44, "TRACE_PROCESS_EVENT_DX12_FINISH", "DX12 finish"),
    (45, "TRACE_PROCESS_EVENT_OPENACC_START", "OpenACC start"),
    (46, "TRACE_PROCESS_EVENT_OPENACC_FINISH", "OpenACC finish"),
    (47, "TRACE_PROCESS_EVENT_OPENACC_INIT_ERROR", "OpenACC init error"),
    (48, "TRACE_PROCESS_EVENT_OPENACC", "OpenACC"), (49, "TRACE_PROCESS_EVENT_CPU_FPS", "CPU FPS"),
    (50, "TRACE_PROCESS_EVENT_GPU_FPS", "GPU FPS"), (51, "TRACE_PROCESS_EVENT_GL_MULTI_ERROR", "GL multi-error"),
    (52, "TRACE_PROCESS_EVENT_DX12_DISPLAY", "DX12 display"), (53, "TRACE_PROCESS_EVENT_VULKAN_API", "Vulkan API"),
    (54, "TRACE_PROCESS_EVENT_VULKAN_WORKLOAD", "Vulkan workload"),
    (55, "TRACE_PROCESS_EVENT_VULKAN_START", "Vulkan start"),
    (56, "TRACE_PROCESS_EVENT_VULKAN_FINISH", "Vulkan finish"),
    (57, "TRACE_PROCESS_EVENT_SYSTEM_EVENT", "System event"), (58, "TRACE_PROCESS_EVENT_GPU_MEMORY", "GPU memory"),
    (59, "TRACE_PROCESS_EVENT_DX12_CREATE_OBJECT", "DX12 create object"),
    (60, "TRACE_PROCESS_EVENT_VULKAN_CREATE_OBJECT", "Vulkan create object"),
    (61, "TRACE_PROCESS_EVENT_CUSTOM_ETW_TRACE", "Custom ETW trace"), (62, "TRACE_PROCESS_EVENT_SLI", "SLI"),
    (63, "TRACE_PROCESS_EVENT_SLI_START", "SLI start"), (64, "TRACE_PROCESS_EVENT_SLI_FINISH", "SLI finish"),
    (65, "TRACE_PROCESS_EVENT_DX12_DEBUG_API", "DX12 debug API"),
    (66, "TRACE_PROCESS_EVENT_VULKAN_DEBUG_API", "Vulkan debug API"),
    (67, "TRACE_PROCESS_EVENT_CUDABACKTRACE", "CUDA backtrace"),
    (68, "TRACE_PROCESS_EVENT_CUDABACKTRACE_START", "CUDA backtrace start"),
    (69, "TRACE_PROCESS_EVENT_CUDABACKTRACE_FINISH", "CUDA backtrace finish"),
    (70, "TRACE_PROCESS_EVENT_WDDM", "WDDM"), (71, "TRACE_PROCESS_EVENT_DX11_API", "DX11 API"),
    (72, "TRACE_PROCESS_EVENT_DX11_START", "DX11 start"), (73, "TRACE_PROCESS_EVENT_DX11_FINISH", "DX11 finish"),
    (74, "TRACE_PROCESS_EVENT_DX11_CREATE_OBJECT", "DX11 create object"),
    (75, "TRACE_PROCESS_EVENT_DX11_DEBUG_API", "DX11 debug API"),
    (76, "TRACE_PROCESS_EVENT_DXCOMMON_API", "DX common API"),
    (77, "TRACE_PROCESS_EVENT_CUDA_GRAPH_NODE_CREATION", "CUDA graph node creation"),
    (78, "TRACE_PROCESS_EVENT_OPENMP", "OpenMP"), (79, "TRACE_PROCESS_EVENT_OPENMP_START", "OpenMP start"),
    (80, "TRACE_PROCESS_EVENT_OPENMP_FINISH", "OpenMP finish"), (81, "TRACE_PROCESS_EVENT_NVAPI", "NV API"),
    (82, "TRACE_PROCESS_EVENT_ETWDXGKRNL", "ETW DXG KRNL"), (83, "TRACE_PROCESS_EVENT_NVENC", "NVENC"),
    (84, "TRACE_PROCESS_EVENT_NVENC_START", "NVENC start"), (85, "TRACE_PROCESS_EVENT_NVENC_FINISH", "NVENC finish"),
    (86, "TRACE_PROCESS_EVENT_NVDEC", "NVDEC"), (87, "TRACE_PROCESS_EVENT_NVDEC_START", "NVDEC start"),
    (88, "TRACE_PROCESS_EVENT_NVDEC_FINISH", "NVDEC finish"), (89, "TRACE_PROCESS_EVENT_NVJPEG", "nvJPEG"),
    (90, "TRACE_PROCESS_EVENT_NVJPEG_START", "nvJPEG start"),
    (91, "TRACE_PROCESS_EVENT_NVJPEG_FINISH", "nvJPEG finish"),
    (92, "TRACE_PROCESS_EVENT_DX12_BATCH_WORKLOAD", "DX12 batch workload"),
    (93, "TRACE_PROCESS_EVENT_VULKAN_BATCH_WORKLOAD", "Vulkan batch workload"),
    (94, "TRACE_PROCESS_EVENT_CUDA_GRAPHEXEC_CREATION", "CUDA graph exec creation"),
    (95, "TRACE_PROCESS_EVENT_CUDA_GRAPH_CREATION", "CUDA graph creation"),
    (96, "TRACE_PROCESS_EVENT_CUDA_GRAPH_CLONE", "CUDA graph clone"),
    (107, "TRACE_PROCESS_EVENT_SYSCALL", "Syscall"),
    (108, "TRACE_PROCESS_EVENT_TEGRA_INTERNAL", "Tegra Internal API"),
    (109, "TRACE_PROCESS_EVENT_TEGRA_INTERNAL_START", "Tegra Internal API start"),
    (110, "TRACE_PROCESS_EVENT_TEGRA_INTERNAL_FINISH", "Tegra Internal API finish"),
)

# --- the writer --------------------------------------------------------------------------------------------------

_COLUMN_LINE = re.compile(r"^\s+(\w+)\s+(?:INTEGER|TEXT|REAL)\b")
_CREATE = re.compile(r"^CREATE TABLE (\w+) \(")
_MEMCPY_MEM_KINDS = {1: (0, 2), 2: (2, 0), 8: (2, 2), 10: (2, 2)}  # copyKind -> (srcKind, dstKind); 0 pageable, 2 device
_GPU_DEFAULTS = {"vmId": GLOBAL_VID, "name": "NVIDIA H100 80GB HBM3", "isDiscrete": 1, "smCount": 132,
                 "threadsPerWarp": 32, "computeMajor": 9, "computeMinor": 0, "smMajor": 9, "smMinor": 0}


def ddl_columns(ddl: str) -> list[str]:
    """Column names of a CREATE TABLE text in the layout of REAL_DDL, in order."""
    return [m.group(1) for m in map(_COLUMN_LINE.match, ddl.split("\n")) if m]


def _with_comma(line: str, comma: bool) -> str:
    definition, sep, comment = line.partition("--")
    stripped = definition.rstrip()
    pad = len(definition) - len(stripped)
    if stripped.endswith(",") and not comma:
        stripped, pad = stripped[:-1], pad + 1
    elif comma and not stripped.endswith(","):
        stripped, pad = stripped + ",", max(pad - 1, 1)
    return stripped + (" " * pad + sep + comment if sep else "")


def table_ddl(base: str, table: str | None = None, drop: Iterable[str] = ()) -> str:
    """``base`` (a REAL_DDL/RECONSTRUCTED_DDL text) renamed to ``table`` and without the columns in ``drop``."""
    drop = set(drop)
    lines = base.split("\n")
    if table is not None:
        lines[0] = _CREATE.sub(f"CREATE TABLE {table} (", lines[0], count=1)
    unknown = drop - set(ddl_columns(base))
    if unknown:
        raise ValueError(f"cannot drop unknown column(s) {sorted(unknown)} of {_CREATE.match(base).group(1)}")
    kept = [line for line in lines if not ((m := _COLUMN_LINE.match(line)) and m.group(1) in drop)]
    column_lines = [i for i, line in enumerate(kept) if _COLUMN_LINE.match(line)]
    if not column_lines:
        raise ValueError("cannot drop every column of a table")
    for i in column_lines:
        kept[i] = _with_comma(kept[i], i != column_lines[-1])
    return "\n".join(kept)


class _Export:
    def __init__(self, conn: sqlite3.Connection, drop_columns: Mapping[str, Sequence[str]]):
        self.conn = conn
        self.drop = drop_columns
        self.strings: dict[str, int] = {}
        self.columns: dict[str, list[str]] = {}
        self.known: dict[str, set[str]] = {}

    def sid(self, value: str) -> int:
        if not isinstance(value, str):
            raise TypeError(f"StringIds values are text, got {value!r}")
        return self.strings.setdefault(value, len(self.strings))

    def create(self, base_name: str, table: str | None = None, drop: Iterable[str] = ()) -> str:
        table = table or base_name
        base = REAL_DDL.get(base_name) or RECONSTRUCTED_DDL[base_name]
        drop = {*drop, *self.drop.get(table, ()), *self.drop.get(base_name, ())}
        self.conn.execute(table_ddl(base, table, drop))
        self.columns[table] = [row[1] for row in self.conn.execute(f'PRAGMA table_info("{table}")')]
        self.known[table] = set(ddl_columns(base))
        return table

    def insert(self, table: str, rows: Iterable[Mapping[str, object]]) -> None:
        columns = self.columns[table]
        values = []
        for row in rows:
            unknown = set(row) - self.known[table]
            if unknown:
                raise ValueError(f"{table} has no column(s) {sorted(unknown)}")
            values.append(tuple(row.get(column) for column in columns))
        names = ", ".join(f'"{column}"' for column in columns)
        marks = ", ".join("?" * len(columns))
        self.conn.executemany(f'INSERT INTO "{table}" ({names}) VALUES ({marks})', values)


def _dims(value: tuple, what: str) -> tuple[int, int, int]:
    if len(value) != 3 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{what} must be three integers, got {value!r}")
    return value


def write_nsys_export(
    path: str | os.PathLike[str],
    *,
    kernels: Iterable[Kernel] = (),
    runtime: Iterable[Runtime] = (),
    nvtx: Iterable[Nvtx] = (),
    memcpy: Iterable[Memcpy] = (),
    memset: Iterable[Memset] = (),
    graph_nodes: Iterable[GraphNode] = (),
    graph_trace: Iterable[GraphTrace] = (),
    domains: Mapping[tuple[int, int], str] | None = None,
    nvtx_table: str | None = "NVTX_EVENTS",
    nvtx_text_columns: tuple[str, ...] = ("text", "textId"),
    runtime_event_class: bool = True,
    kernel_table: bool = True,
    devices: Sequence[Mapping[str, object]] | None = None,
    meta: Mapping[str, str | None] | None = None,
    drop_columns: Mapping[str, Sequence[str]] | None = None,
    sync: Iterable[Sync] = (),
    processes: Mapping[int, str] | None = None,
    thread_names: Mapping[str, str] | None = None,
) -> Path:
    """Write a synthetic nsys SQLite export to ``path`` (replacing it) and return it as a Path.

    domains: (pid, domainId) -> name, written as eventType 75 (NvtxDomainCreate) rows at t=0 on thread pid:pid.
    nvtx_table: name of the NVTX table (e.g. "NVTX_EVENTS_V2", same columns); None: no NVTX table at all.
    nvtx_text_columns: which of text/textId the NVTX table has (a dropped one is removed from the DDL).
    runtime_event_class: False writes RUNTIME without eventClass (2019-2020 schema).
    kernel_table: False writes no KERNEL table (lazy export of a capture without kernels).
    devices: TARGET_INFO_GPU rows as column dicts (id required; cuDevice defaults to id); a dict's key
        "cuda_device_map": [(gpuId, cudaId, pid), ...] adds TARGET_INFO_CUDA_DEVICE rows (a dict with only that key
        adds no GPU row).
    meta: META_DATA_EXPORT rows, replacing DEFAULT_META (nsys 2025.1.1.110, schema 3.17.1, linux-desktop).
    drop_columns: {table: [column, ...]} removed from the DDL, to mimic another schema; the NVTX table may be named
        by its real name or "NVTX_EVENTS".
    sync / processes / thread_names: CUPTI_ACTIVITY_KIND_SYNCHRONIZATION rows; PROCESSES rows (pid -> name);
        ThreadNames rows ("pid:tid" -> name).
    """
    kernels, runtime, nvtx = list(kernels), list(runtime), list(nvtx)
    memcpy, memset, sync = list(memcpy), list(memset), list(sync)
    graph_nodes, graph_trace = list(graph_nodes), list(graph_trace)
    domains = dict(domains or {})
    drop_columns = {table: list(columns) for table, columns in (drop_columns or {}).items()}

    known_tables = {*REAL_DDL, *RECONSTRUCTED_DDL, *([nvtx_table] if nvtx_table else [])}
    if set(drop_columns) - known_tables:
        raise ValueError(f"drop_columns names unknown table(s) {sorted(set(drop_columns) - known_tables)}")
    if nvtx_table is not None and not re.fullmatch(r"[A-Za-z_]\w*", nvtx_table):
        raise ValueError(f"bad NVTX table name {nvtx_table!r}")
    if nvtx_table is None and (nvtx or domains):
        raise ValueError("NVTX rows or domains given but nvtx_table=None")
    if not set(nvtx_text_columns) <= {"text", "textId"}:
        raise ValueError(f"nvtx_text_columns must be drawn from ('text', 'textId'), got {nvtx_text_columns!r}")
    if not kernel_table and kernels:
        raise ValueError("kernel rows given but kernel_table=False")

    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    conn = sqlite3.connect(partial)
    try:
        _write(_Export(conn, drop_columns), kernels=kernels, runtime=runtime, nvtx=nvtx, memcpy=memcpy,
               memset=memset, sync=sync, graph_nodes=graph_nodes, graph_trace=graph_trace, domains=domains,
               nvtx_table=nvtx_table, nvtx_text_columns=tuple(nvtx_text_columns),
               runtime_event_class=runtime_event_class, kernel_table=kernel_table, devices=devices,
               meta=DEFAULT_META if meta is None else meta, processes=processes or {},
               thread_names=thread_names or {})
        conn.commit()
    except BaseException:
        conn.close()
        partial.unlink(missing_ok=True)
        raise
    conn.close()
    os.replace(partial, path)
    return path


def _write(ex: _Export, *, kernels, runtime, nvtx, memcpy, memset, sync, graph_nodes, graph_trace, domains,
           nvtx_table, nvtx_text_columns, runtime_event_class, kernel_table, devices, meta, processes,
           thread_names) -> None:
    ex.create("StringIds")

    ex.create("CUPTI_ACTIVITY_KIND_RUNTIME", drop=() if runtime_event_class else ("eventClass",))
    ex.insert("CUPTI_ACTIVITY_KIND_RUNTIME", [
        {"start": r.start, "end": r.end, "eventClass": r.event_class, "globalTid": gtid(r.thread),
         "correlationId": r.correlation, "nameId": ex.sid(r.name), "returnValue": 0, "callchainId": None}
        for r in runtime])

    if nvtx_table is not None:
        table = ex.create("NVTX_EVENTS", nvtx_table, drop={"text", "textId"} - set(nvtx_text_columns))
        inline = "text" in ex.columns[table]
        domain_rows = [Nvtx(name, 75, f"{pid}:{pid}", 0, None, domain=domain_id, registered=not inline)
                       for (pid, domain_id), name in domains.items()]
        present = tuple(c for c in ("text", "textId") if c in ex.columns[table])  # after drop_columns too
        ex.insert(table, [_nvtx_row(ex, n, present) for n in domain_rows + nvtx])

    if kernel_table:
        ex.create("CUPTI_ACTIVITY_KIND_KERNEL")
        ex.insert("CUPTI_ACTIVITY_KIND_KERNEL", [_kernel_row(ex, k, grid_id) for grid_id, k in enumerate(kernels, 1)])

    if memset:
        ex.create("CUPTI_ACTIVITY_KIND_MEMSET")
        ex.insert("CUPTI_ACTIVITY_KIND_MEMSET", [
            {**_gpu_op(m), "value": 0, "bytes": m.bytes, "graphNodeId": None, "memKind": 2} for m in memset])

    if memcpy:
        ex.create("CUPTI_ACTIVITY_KIND_MEMCPY")
        ex.insert("CUPTI_ACTIVITY_KIND_MEMCPY", [
            {**_gpu_op(m), "bytes": m.bytes, "copyKind": m.copy_kind,
             "srcKind": _MEMCPY_MEM_KINDS.get(m.copy_kind, (None, None))[0],
             "dstKind": _MEMCPY_MEM_KINDS.get(m.copy_kind, (None, None))[1]}
            for m in memcpy])

    if sync:
        ex.create("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
        ex.insert("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", [
            {**_gpu_op(s), "greenContextId": None, "syncType": s.sync_type, "eventId": s.event_id,
             "eventSyncId": 0xFFFFFFFF} for s in sync])

    if graph_trace:
        ex.create("CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
        ex.insert("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", [
            {**_gpu_op(g), "graphId": g.graph_id, "graphExecId": None} for g in graph_trace])

    if graph_nodes:
        ex.create("CUDA_GRAPH_NODE_EVENTS")
        ex.insert("CUDA_GRAPH_NODE_EVENTS", [
            {"start": g.start, "end": g.end, "globalTid": gtid(g.thread), "nameId": ex.sid(g.name),
             "graphNodeId": g.graph_node_id, "originalGraphNodeId": g.original_graph_node_id} for g in graph_nodes])

    if processes:
        ex.create("PROCESSES")
        ex.insert("PROCESSES", [{"globalPid": gpid(pid), "pid": pid, "name": name} for pid, name in processes.items()])

    if thread_names:
        ex.create("ThreadNames")
        ex.insert("ThreadNames", [{"nameId": ex.sid(name), "priority": 20, "globalTid": gtid(thread)}
                                  for thread, name in thread_names.items()])

    gpu_rows, device_map = [], []
    for device in devices or ():
        device = dict(device)
        device_map.extend(tuple(entry) for entry in device.pop("cuda_device_map", ()))
        if not device:
            continue
        if "id" not in device:
            raise ValueError(f"TARGET_INFO_GPU row needs an 'id': {device!r}")
        gpu_rows.append({**_GPU_DEFAULTS, "busLocation": f"0000:{device['id'] + 0x18:02x}:00.0",
                         "cuDevice": device["id"], **device})
    if gpu_rows:
        ex.create("TARGET_INFO_GPU")
        ex.insert("TARGET_INFO_GPU", gpu_rows)
    if device_map:
        ex.create("TARGET_INFO_CUDA_DEVICE")
        ex.insert("TARGET_INFO_CUDA_DEVICE", [{"gpuId": g, "cudaId": c, "pid": p} for g, c, p in device_map])

    ex.create("META_DATA_EXPORT")
    ex.insert("META_DATA_EXPORT", [{"name": name, "value": value} for name, value in meta.items()])

    ex.create("ENUM_NSYS_EVENT_TYPE")
    ex.insert("ENUM_NSYS_EVENT_TYPE", [dict(zip(("id", "name", "label"), row)) for row in ENUM_NSYS_EVENT_TYPE_ROWS])
    ex.create("ENUM_NSYS_EVENT_CLASS")
    ex.insert("ENUM_NSYS_EVENT_CLASS", [dict(zip(("id", "name", "label"), row)) for row in ENUM_NSYS_EVENT_CLASS_ROWS])

    ex.insert("StringIds", [{"id": i, "value": value} for value, i in ex.strings.items()])


def _nvtx_row(ex: _Export, n: Nvtx, text_columns: tuple[str, ...]) -> dict[str, object]:
    row = {"start": n.start, "end": n.end, "eventType": n.event_type, "rangeId": n.range_id,
           "globalTid": gtid(n.thread), "endGlobalTid": None if n.end_thread is None else gtid(n.end_thread),
           "domainId": n.domain}
    if n.text is None:
        if n.registered:
            raise ValueError(f"registered NVTX row without text: {n!r}")
    elif n.registered:
        if "textId" not in text_columns:
            raise ValueError(f"registered NVTX string but the NVTX table has no textId column: {n!r}")
        row["textId"] = ex.sid(n.text)
    else:
        if "text" not in text_columns:
            raise ValueError(f"inline NVTX text but the NVTX table has no text column (use registered=True): {n!r}")
        row["text"] = n.text
    return row


def _gpu_op(op: Memcpy | Memset | Sync | GraphTrace) -> dict[str, object]:
    return {"start": op.start, "end": op.end, "deviceId": op.device, "contextId": 1, "greenContextId": 0,
            "streamId": op.stream, "correlationId": op.correlation, "globalPid": gpid(op.pid)}


def _kernel_row(ex: _Export, k: Kernel, grid_id: int) -> dict[str, object]:
    grid, block = _dims(k.grid, "grid"), _dims(k.block, "block")
    return {"start": k.start, "end": k.end, "deviceId": k.device, "contextId": 1, "greenContextId": 0,
            "streamId": k.stream, "correlationId": k.correlation, "globalPid": gpid(k.pid),
            "demangledName": ex.sid(k.name), "shortName": ex.sid(k.name if k.short is None else k.short),
            "mangledName": None if k.mangled is None else ex.sid(k.mangled), "launchType": 1, "cacheConfig": 1,
            "registersPerThread": 32, "gridX": grid[0], "gridY": grid[1], "gridZ": grid[2], "blockX": block[0],
            "blockY": block[1], "blockZ": block[2], "staticSharedMemory": 0, "dynamicSharedMemory": 0,
            "localMemoryPerThread": 0, "localMemoryTotal": 0, "gridId": grid_id, "sharedMemoryExecuted": 32768,
            "graphNodeId": k.graph_node_id, "sharedMemoryLimitConfig": 0}


# ------------------------------------------------------------------------------------------------
# Rows for write_nsys_export: a launch and its kernel


def launch(name, thread, start, corr, *, kernel_start=None, dur=10, stream=7, api="cudaLaunchKernel_v7000",
           event_class=0, pid=None):
    """A launch call of 5 ns at ``start`` and its kernel (``dur`` ns, starting 20 ns later by default)."""
    pid = pid if pid is not None else int(thread.split(":")[0])
    k0 = kernel_start if kernel_start is not None else start + 20
    return (Runtime(api, thread, start, start + 5, corr, event_class=event_class),
            Kernel(name, pid, stream, k0, k0 + dur, corr))


def rows(*launches):
    """write_nsys_export's ``runtime`` and ``kernels`` arguments from :func:`launch` pairs."""
    return {"runtime": [r for r, _ in launches], "kernels": [k for _, k in launches]}


# ------------------------------------------------------------------------------------------------
# Small ready-made exports and a fake nsys, shared by the tests


def c01_export(path, **options) -> Path:
    """docs/field-cases.md C01: two kernels launched from the autograd thread (tid 2) of pid 10, one under an
    NVTX range of that thread, while a range of tid 1 covers both; ``options`` go to write_nsys_export."""
    return write_nsys_export(
        path,
        nvtx=[Nvtx("user:backward", 59, "10:1", 1000, 9000), Nvtx("MmBackward0", 59, "10:2", 2000, 4000)],
        runtime=[Runtime("cudaLaunchKernel_v7000", "10:2", 2500, 2600, 7),
                 Runtime("cudaLaunchKernel_v7000", "10:2", 5000, 5100, 8)],
        kernels=[Kernel("gemm_bwd", 10, 7, 2700, 3700, 7, grid=(4, 2, 1), block=(256, 1, 1)),
                 Kernel("reduce_bwd", 10, 7, 5200, 5400, 8)],
        **options,
    )


_FAKE_NSYS = """#!{python}
# FAKE nsys (a test double): real Nsight Systems cannot run on the test machine. It logs its arguments,
# accepts only 'nsys export --type sqlite ... --output OUT REPORT.nsys-rep' and copies a prepared export to OUT.
import json, shutil, sys
args = sys.argv[1:]
with open({log!r}, "a") as fh:
    fh.write(json.dumps(args) + "\\n")
def value(flag):
    return args[args.index(flag) + 1] if flag in args[:-1] else None
if args[:1] != ["export"] or value("--type") != "sqlite" or not value("--output") or not args[-1].endswith(".nsys-rep"):
    sys.exit("fake nsys: unexpected call: nsys " + " ".join(args))
shutil.copyfile({fixture!r}, value("--output"))
"""


def fake_nsys(bin_dir, log, fixture) -> Path:
    """Write an executable fake ``nsys`` into ``bin_dir`` (put it first on PATH) that logs each call as
    a JSON line in ``log`` and "exports" any .nsys-rep by copying the SQLite file ``fixture``."""
    import stat
    import sys

    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "nsys"
    fake.write_text(_FAKE_NSYS.format(python=sys.executable, log=str(log), fixture=str(fixture)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake
