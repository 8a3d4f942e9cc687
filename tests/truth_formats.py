"""Writers for :mod:`ground_truth` programs: what each tool would have written (test support, not a test).

* nsys: an SQLite export through :func:`nsys_export.write_nsys_export` (the real table layout of nsys 2025.1):
  ``emit_nvtx`` push/pop ranges (``aten::mm, seq = 3, op_id = 7``) in the default domain on the launching thread,
  runtime/driver API rows, KERNEL rows with mangled/demangled/short names, graph node creation events and their
  instantiation clones (``originalGraphNodeId``), PROCESSES and ThreadNames, one TARGET_INFO_GPU row per device.
* Kineto: a Chrome trace as torch.profiler writes it (docs/formats.md#kineto-trace-json): ``cpu_op``/``user_annotation``
  ranges with ``External id``, ``cuda_runtime``/``cuda_driver`` launches with ``correlation``, ``kernel`` events
  with ``pid`` = device, ``tid`` = stream and ``graph id``/``graph node id`` for graph nodes; ``ts``/``dur`` in µs
  with three decimals, either relative to ``baseTimeNanoseconds`` (2024-05 on) or absolute epoch µs with ns
  fractions and no base (early 2024), written as exact decimal text.
* ncu: ``ncu -i R --csv --page raw --print-units base`` (header, units row, one row per result) or the details page
  (one row per result and metric), with the identity columns of ncu 2022+ (docs/formats.md#ncu-pages).
* Inductor: one debug directory per compiled graph with ``output_code.py`` (Triton kernel definitions with
  ``inductor_meta['kernel_name']``, ``call()`` with a ``Topologically Sorted Source Nodes`` comment per call site)
  and ``fx_graph_readable.py`` (docs/formats.md#inductor-output-code).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ground_truth import Case, NcuFile, Program, ncu_printed
from nsys_export import GraphNode, Kernel, Nvtx, Runtime, write_nsys_export

# ================================================================================================================
# nsys

NSYS_API = {"cudaLaunchKernel": ("cudaLaunchKernel_v7000", 0), "cuLaunchKernel": ("cuLaunchKernel", 1),
            "cudaGraphLaunch": ("cudaGraphLaunch_v10000", 0)}


def nvtx_text(op) -> str:
    """The range text ``emit_nvtx`` writes for an op (docs/formats.md#emit_nvtx-range-names): ``name[, seq = N], op_id = M``."""
    seq = op.args.get("Sequence number")
    return op.name + (f", seq = {seq}" if seq is not None else "") + f", op_id = {op.external_id}"


def write_nsys(program: Program, path: Path, repeated: list[int] = ()) -> Path:
    """The program as an nsys SQLite export; times as the program's (ns since the capture start). ``repeated``:
    uids of kernels whose KERNEL row is written a second time, after the others (a corrupt or merged export)."""
    nvtx = [Nvtx(nvtx_text(op), 59, f"{op.pid}:{op.tid}", op.start_ns, op.end_ns) for op in program.ops]
    runtime = [Runtime(NSYS_API[c.name][0], f"{c.pid}:{c.tid}", c.start_ns, c.end_ns, c.correlation,
                       event_class=NSYS_API[c.name][1]) for c in program.calls]
    kernels = [Kernel(k.kernel.demangled, k.pid, k.stream, k.start_ns, k.end_ns, k.call.correlation,
                      grid=k.config.grid, block=k.config.block, device=k.device, graph_node_id=k.graph_node_id,
                      mangled=k.kernel.mangled, short=k.kernel.function) for k in program.launches]
    kernels += [kernels[uid] for uid in repeated]
    nodes = [GraphNode(f"{n.pid}:{n.tid}", n.start_ns, n.end_ns, n.node_id, n.original) for n in program.node_events]
    return write_nsys_export(
        path, kernels=kernels, runtime=runtime, nvtx=nvtx, graph_nodes=nodes, processes=program.processes,
        thread_names={f"{pid}:{tid}": name for (pid, tid), name in program.threads.items()},
        devices=[{"id": d} for d in sorted(program.devices)])


# ================================================================================================================
# Kineto

KINETO_BASE_NS = 1_727_740_800_000_000_000  # baseTimeNanoseconds: a time floored to three months
_KINETO_API_CATEGORY = {"cudaLaunchKernel": ("cuda_runtime", 211), "cuLaunchKernel": ("cuda_driver", 307),
                        "cudaGraphLaunch": ("cuda_runtime", 311)}


class _Exact:
    """A number to be written as this exact decimal text (``json`` would write a float's nearest repr)."""

    def __init__(self, text: str):
        self.text = text


def _us(ns: int) -> _Exact:
    """ns -> µs with three decimals, as Kineto's ``fmtTs`` writes it."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return _Exact(f"{sign}{ns // 1000}.{ns % 1000:03d}")


def _dumps(obj) -> str:
    """JSON with :class:`_Exact` numbers written verbatim."""
    exact: list[str] = []

    def default(o):
        if isinstance(o, _Exact):
            exact.append(o.text)
            return f"\x00EXACT{len(exact) - 1}\x00"
        raise TypeError(type(o))

    text = json.dumps(obj, default=default)
    for i, value in enumerate(exact):
        text = text.replace(f'"\\u0000EXACT{i}\\u0000"', value, 1)
    return text


def kineto_events(program: Program, time_format: str, repeated: list[int] = ()) -> tuple[list[dict], dict]:
    """Trace events and top-level keys. ``time_format``: ``relative`` (ts from ``baseTimeNanoseconds``) or
    ``absolute_fraction`` (absolute epoch µs with ns fractions, no base). ``repeated``: uids of kernels whose
    ``kernel`` event is written a second time, after every other event (a corrupt or merged trace)."""
    offset = 0 if time_format == "relative" else KINETO_BASE_NS
    top = {"baseTimeNanoseconds": KINETO_BASE_NS} if time_format == "relative" else {}

    def ts(ns: int) -> _Exact:
        return _us(ns + offset)

    events: list[dict] = []
    for pid, name in program.processes.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
    for (pid, tid), name in program.threads.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": f"thread {tid} ({name})"}})
    for op in program.ops:
        events.append({"ph": "X", "cat": op.kind, "name": op.name, "pid": op.pid, "tid": op.tid,
                       "ts": ts(op.start_ns), "dur": _us(op.end_ns - op.start_ns),
                       "args": {"External id": op.external_id, "Record function id": 0, **op.args}})
    for c in program.calls:
        category, cbid = _KINETO_API_CATEGORY[c.name]
        args = {"cbid": cbid, "correlation": c.correlation}
        if c.external_id:
            args["External id"] = c.external_id
        events.append({"ph": "X", "cat": category, "name": c.name, "pid": c.pid, "tid": c.tid,
                       "ts": ts(c.start_ns), "dur": _us(c.end_ns - c.start_ns), "args": args})
    kernel_events = {}
    for k in program.launches:
        ext = k.external_id if k.external_id is not None else k.call.external_id
        args = {"queued": 0, "device": k.device, "context": 1, "stream": k.stream, "correlation": k.call.correlation,
                "registers per thread": 32, "shared memory": 0, "grid": list(k.config.grid),
                "block": list(k.config.block)}
        if ext:
            args["External id"] = ext
        if k.graph_node_id is not None:
            args["graph id"] = k.graph_id
            args["graph node id"] = k.graph_node_id
        events.append({"ph": "X", "cat": "kernel", "name": k.kernel.demangled, "pid": k.device, "tid": k.stream,
                       "ts": ts(k.start_ns), "dur": _us(k.end_ns - k.start_ns), "args": args})
        kernel_events[k.uid] = events[-1]
    events += [dict(kernel_events[uid]) for uid in repeated]
    return events, top


def write_kineto(program: Program, path: Path, time_format: str = "relative", repeated: list[int] = ()) -> Path:
    """The program as a torch.profiler trace (``.json`` or ``.json.gz`` by the suffix); ``repeated`` as
    :func:`kineto_events`."""
    events, top = kineto_events(program, time_format, repeated)
    devices = [{"id": d, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}
               for d in sorted(program.devices)]
    trace = {"schemaVersion": 1, "deviceProperties": devices, **top, "displayTimeUnit": "ms",
             "traceEvents": events, "traceName": str(path.name)}
    text = _dumps(trace)
    path = Path(path)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path


# ================================================================================================================
# ncu

NCU_IDENTITY = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
                "Grid Size", "Device", "CC"]
NCU_METRICS = [("dram__bytes.sum", "byte"), ("gpu__time_duration.sum", "nsecond"),
               ("smsp__inst_executed.sum", "inst")]
TOKEN_METRIC = "smsp__inst_executed.sum"


def _quote(cells) -> str:
    return ",".join('"' + str(c).replace('"', '""') + '"' for c in cells)


def _number(value: int, grouping: bool) -> str:
    return f"{value:,}" if grouping else str(value)


def _dims(d: tuple) -> str:
    return f"({d[0]}, {d[1]}, {d[2]})"


def ncu_csv_text(f: NcuFile, process_names: dict[int, str]) -> str:
    """The file's CSV text: raw page (wide) or details page (long), ``--print-units base``."""
    lines = []
    if f.page == "raw":
        lines.append(_quote(NCU_IDENTITY + [m for m, _ in NCU_METRICS]))
        lines.append(_quote([""] * len(NCU_IDENTITY) + [u for _, u in NCU_METRICS]))
    else:
        lines.append(_quote(NCU_IDENTITY + ["Section Name", "Metric Name", "Metric Unit", "Metric Value"]))
    for i, row in enumerate(f.rows):
        identity = [i, row.pid, process_names.get(row.pid, "python3.12"), "127.0.0.1", ncu_printed(row.kernel, f.style),
                    1, row.stream, _dims(row.config.block), _dims(row.config.grid), row.device, "9.0"]
        values = {"dram__bytes.sum": row.token * 32, "gpu__time_duration.sum": row.duration_ns,
                  TOKEN_METRIC: row.token}
        if f.page == "raw":
            lines.append(_quote(identity + [_number(values[m], f.grouping) for m, _ in NCU_METRICS]))
        else:
            for metric, unit in NCU_METRICS:
                lines.append(_quote(identity + ["Command line profiler metrics", metric, unit,
                                                _number(values[metric], f.grouping)]))
    return "\n".join(lines) + "\n"


def write_ncu(f: NcuFile, path: Path, process_names: dict[int, str]) -> Path:
    path = Path(path)
    path.write_text(ncu_csv_text(f, process_names))
    return path


# ================================================================================================================
# The case folder


def write_case(case: Case, folder: Path) -> dict:
    """All input files of a case into ``folder``; returns the relative paths for ``truth.json``."""
    from ground_truth import truth_record

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict = {"ncu": {}}
    if case.timeline_format == "nsys":
        write_nsys(case.program, folder / "timeline.sqlite", case.repeated_records)
        paths["timeline"] = "timeline.sqlite"
    else:
        name = "timeline.pt.trace.json.gz" if case.seed % 2 else "timeline.pt.trace.json"
        write_kineto(case.program, folder / name, case.kineto_time, case.repeated_records)
        paths["timeline"] = name
        paths["time_base_ns"] = KINETO_BASE_NS
    (folder / "ncu").mkdir(exist_ok=True)
    for f in case.ncu_files:
        write_ncu(f, folder / "ncu" / f.name, {})
        paths["ncu"][f.name] = f"ncu/{f.name}"
    if case.inductor_graphs:
        from truth_inductor import write_debug_dirs

        write_debug_dirs(case.inductor_graphs, folder / "inductor")
        paths["inductor"] = "inductor"
    record = truth_record(case, paths)
    (folder / "truth.json").write_text(json.dumps(record, indent=1))
    return record
