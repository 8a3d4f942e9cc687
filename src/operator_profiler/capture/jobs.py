"""Capture stages: run the harness under a timeline tool; the torch.profiler capture of a compiled workload also
writes Inductor's debug output of the very compile it profiles.

Kept apart from the analysis stages (:mod:`operator_profiler.stages`) so the GPU rules depend only on
this module, the harness and the workloads: an analysis change never re-runs a capture.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import CaptureError
from ..files import InputError, read_json_file, write_json
from .clocks import locked_clocks, read_back, select_clocks  # noqa: F401  (select_clocks: kept importable from here)

log = logging.getLogger(__name__)


TIMELINES = ("auto", "nsys", "torch")
NSYS = "nsys"
# ``nsys profile`` options of the timeline capture (Nsight Systems User Guide, CLI profile command switches;
# docs/formats.md#nsys-cuda-graphs):
# --trace=cuda,nvtx                 CUDA API + GPU activities and NVTX ranges, no OS-runtime tracing;
# --sample=none --cpuctxsw=none     no CPU IP sampling and no context-switch tracing: ``--trace`` does not turn
#                                   them off (both default on), and they only add overhead and report size here;
# --capture-range=cudaProfilerApi   record only between cudaProfilerStart and cudaProfilerStop (the harness's
#                                   measured iterations, harness.cuda_profiler_range);
# --capture-range-end=stop          stop recording at cudaProfilerStop and let the application finish (it
#                                   still writes run.json and layers.json); ``stop-shutdown`` would kill it;
# --cuda-graph-trace=node           one kernel row per CUDA-graph node (the default ``graph`` records one row
#                                   per graph launch and no kernel rows);
# --force-overwrite=true            replace a report left by an earlier failed run.
NSYS_PROFILE_OPTIONS = ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--capture-range=cudaProfilerApi",
                        "--capture-range-end=stop", "--cuda-graph-trace=node", "--force-overwrite=true")


def resolve_timeline(requested: str, device: str) -> str:
    """The timeline tool for a run: ``torch`` on CPU; on CUDA ``nsys``/``torch`` as asked, and ``auto`` ->
    ``nsys`` when an ``nsys`` executable is on ``PATH`` (looked up now), else ``torch``.

    The workflow resolves it once, when the DAG is built (``workflow/common.smk``), and records it in
    ``run.json`` (``timeline``, ``timeline_requested``).

    Raises:
        ValueError: ``requested`` is not one of :data:`TIMELINES` (the config schema prevents it).
    """
    if requested not in TIMELINES:
        raise ValueError(f"timeline {requested!r} is not one of {', '.join(TIMELINES)}")
    if device == "cpu":
        return "torch"
    if requested == "auto":
        return "nsys" if shutil.which(NSYS) else "torch"
    return requested


def harness_argv(workload_name: str, workload: dict, harness_cfg: dict, device: str, profiler: str,
                 out_run: Path, out_layers: Path | None = None, out_trace: Path | None = None,
                 record: dict | None = None, python: str | None = None) -> list[str]:
    """The argv that runs the harness once in a fresh process (``opprof run-harness``, see
    :func:`operator_profiler.cli._cmd_run_harness` for the contract): what nsys launches, and what an ncu
    replay can launch with ``profiler="cuda_profiler_api"``. Config slices are passed inline as JSON, paths as
    single argv elements (spaces need no quoting: never run through a shell)."""
    argv = [python or sys.executable, "-m", "operator_profiler.cli", "run-harness",
            "--workload-json", json.dumps(workload, sort_keys=True),
            "--harness-json", json.dumps(harness_cfg, sort_keys=True),
            "--device", device, "--profiler", profiler, "--out-run", str(out_run),
            "--workload-name", workload_name]
    if out_layers is not None:
        argv += ["--out-layers", str(out_layers)]
    if out_trace is not None:
        argv += ["--out-trace", str(out_trace)]
    if record:
        argv += ["--record-json", json.dumps(record, sort_keys=True)]
    return argv


def nsys_command(report_base: Path, target_argv: list[str], nsys: str = NSYS) -> list[str]:
    """``nsys profile <NSYS_PROFILE_OPTIONS> --output <report_base> <target argv...>`` as an argv list.

    nsys appends ``.nsys-rep`` to ``report_base`` (``.qdrep`` before nsys 2021.4). ``--cuda-graph-trace``
    is in the Nsight Systems 2022.x user guides and later; its first release could not be confirmed from the
    sources at hand, so an nsys that rejects it fails the capture with its own message.
    """
    return [nsys, "profile", *NSYS_PROFILE_OPTIONS, "--output", str(report_base), *target_argv]


def _library_env() -> dict:
    """The environment of a harness subprocess: this package importable first (as in this process)."""
    env = os.environ.copy()
    src = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def _read_target(clocks_target: Path | dict | None) -> dict:
    if isinstance(clocks_target, dict):
        return clocks_target
    if clocks_target is None:
        raise InputError("a GPU capture needs the clock target (clocks/target.json from select_clocks); pass it")
    return read_json_file(Path(clocks_target), "the clock target", "run the select_clocks rule", expect=dict)


def _run_nsys(workload_name: str, workload: dict, harness_cfg: dict, out_trace: Path, out_run: Path,
              out_layers: Path, record: dict) -> dict:
    """Run the harness under ``nsys profile`` (argv list, never a shell); returns the harness's run.json."""
    nsys = shutil.which(NSYS)
    if nsys is None:
        raise CaptureError("timeline nsys, but no nsys executable is on PATH; install Nsight Systems (and put "
                           "its bin/ on PATH) or set timeline: torch")
    out_trace, out_run = Path(out_trace), Path(out_run)
    out_trace.parent.mkdir(parents=True, exist_ok=True)
    base = out_trace.with_name(out_trace.name.removesuffix(".nsys-rep") + ".partial")
    partial_run = out_run.with_name(out_run.name + ".nsys-partial")
    for stale in (base.with_name(base.name + ".nsys-rep"), base.with_name(base.name + ".qdrep"), partial_run):
        stale.unlink(missing_ok=True)
    argv = harness_argv(workload_name, workload, harness_cfg, "cuda", "cuda_profiler_api", partial_run,
                        out_layers, record=record)
    cmd = nsys_command(base, argv, nsys=nsys)
    log.info("capture: %s", " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_library_env(),
                          check=False)
    sys.stderr.write(proc.stdout)
    if proc.returncode != 0:
        harness_error = [line for line in proc.stdout.splitlines() if line.startswith("opprof run-harness: error:")]
        why = harness_error[-1].removeprefix("opprof run-harness: error: ") if harness_error else (
            f"exit status {proc.returncode}; its output is in the log")
        if why.endswith(" (the traceback is above)"):  # cli.USER_TRACEBACK_ABOVE: the model's own traceback
            why = why.removesuffix(" (the traceback is above)") + " (its traceback is in the log)"
        raise CaptureError(f"nsys profile of workload {workload_name!r} failed: {why}")
    report = next((p for p in (base.with_name(base.name + ".nsys-rep"), base.with_name(base.name + ".qdrep"))
                   if p.is_file()), None)
    if report is None:
        raise CaptureError(f"nsys profile of workload {workload_name!r} wrote no report {base}.nsys-rep: did the "
                           "harness reach cudaProfilerStart? (the nsys output is in the log)")
    if not partial_run.is_file():
        raise CaptureError(f"the harness under nsys wrote no {partial_run}; its output is in the log")
    run = read_json_file(partial_run, "the harness's run.json", "see the capture log", expect=dict)
    os.replace(report, out_trace)
    os.replace(partial_run, out_run)
    return run


def capture_timeline(workload_name: str, workload: dict, harness_cfg: dict, device: str, timeline_tool: str,
                     out_trace: Path, out_run: Path, out_layers: Path, out_clocks: Path,
                     clocks_target: Path | dict | None = None, timeline_requested: str | None = None,
                     out_shapes: Path | None = None, out_debug: Path | None = None) -> None:
    """Run the harness once under the timeline tool, writing the trace, ``run.json``, ``layers.json`` and
    ``clocks_applied.json``; with torch.profiler also ``out_shapes``, the input shapes of one more iteration
    (``harness.run_capture`` ``shapes_path``), and ``out_debug``, Inductor's debug directories of the compile
    this run profiled (:func:`_with_debug_artifacts`; torch.profiler only).

    - CPU (always ``torch``): torch.profiler in this process; no clocks to lock.
    - CUDA, ``torch``: torch.profiler in this process, inside
      :func:`operator_profiler.capture.clocks.locked_clocks`, with a clock read-back
      (:func:`~operator_profiler.capture.clocks.read_back`) after the run while this process still holds the GPU;
      the trace is a gzipped Chrome trace and ``run.json`` records ``measured_kernels`` (kernel records of the
      measured window).
    - CUDA, ``nsys``: inside ``locked_clocks``, ``nsys profile`` (:func:`nsys_command`, options
      :data:`NSYS_PROFILE_OPTIONS`) launches ``opprof run-harness --profiler cuda_profiler_api`` in a new
      process; the report (``.nsys-rep``) is ``out_trace``. Its SQLite export is the export_timeline rule's
      job (``nsys export --type sqlite``, :func:`operator_profiler.stages.export_timeline`). ``measured_kernels``
      stays null in ``run.json``: the timeline reader counts the kernels. The clock read-back loop's samples
      taken while nsys ran verify the lock.

    ``clocks_target`` is ``clocks/target.json`` (path or dict); ``run.json`` gets ``timeline`` (the tool
    used) and ``timeline_requested`` (the config's value, e.g. ``auto``).

    Raises:
        InputError: CUDA without a readable ``clocks_target``.
        CaptureError: nsys missing on PATH, failing, or writing no report.
        ClockError, ClockPermissionError: see :func:`~operator_profiler.capture.clocks.locked_clocks`.
        WorkloadError, DeviceUnavailable: from the harness (in-process runs).
    """
    from . import harness

    if out_debug is not None and timeline_tool == NSYS:
        raise ValueError("the nsys capture writes no Inductor debug output: the Kineto run beside it does "
                         "(capture_kineto out_debug)")
    record = {"timeline": timeline_tool, "timeline_requested": timeline_requested or timeline_tool}
    out_trace = Path(out_trace)
    tmp_trace = Path(str(out_trace) + ".partial.gz")
    tmp_shapes = Path(str(out_shapes) + ".partial.gz") if out_shapes is not None else None

    def torch_capture():
        run = _with_debug_artifacts(
            workload, out_debug, workload_name,
            lambda debug: harness.run_capture(workload, harness_cfg, device, tmp_trace, out_layers, out_run,
                                              inductor_dir=debug, workload_name=workload_name, record=record,
                                              shapes_path=tmp_shapes))
        if tmp_shapes is not None:
            os.replace(tmp_shapes, out_shapes)
        os.replace(tmp_trace, out_trace)
        return run

    if device == "cpu":
        run = torch_capture()
        write_json(out_clocks, {"locked": False, "device": device, "reason": "CPU run: no GPU clocks",
                                "workload": workload_name, "measured_s": run["measured_s"]})
        return
    target = _read_target(clocks_target)
    with locked_clocks(target, Path(out_clocks), device) as applied:
        applied["workload"] = workload_name
        applied["tool"] = timeline_tool
        if timeline_tool == "nsys":
            run = _run_nsys(workload_name, workload, harness_cfg, out_trace, Path(out_run), Path(out_layers), record)
        else:
            run = torch_capture()
            read_back(applied, "after the torch capture, its CUDA context still open")
        applied["measured_s"] = run["measured_s"]


def capture_kineto(workload_name: str, workload: dict, harness_cfg: dict, device: str, out_trace: Path,
                   out_run: Path, out_clocks: Path, clocks_target: Path | dict | None = None,
                   out_debug: Path | None = None) -> None:
    """The torch.profiler run for path (a) beside an nsys timeline: the same harness (same seed, shapes and
    settings) once more in this process, inside ``locked_clocks``, writing ``capture/kineto.json.gz`` (gzipped
    Chrome trace), its ``kineto_run.json`` (with ``measured_kernels``) and ``kineto_clocks_applied.json``; and
    ``out_debug``, Inductor's debug directories of its compile (:func:`_with_debug_artifacts`).

    nsys and torch.profiler cannot share CUPTI in one process (``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``,
    docs/formats.md#nsys-export), hence a second run. The attribute rule compares the kernel counts
    of both runs and fails on a mismatch (:func:`operator_profiler.stages.check_kernel_counts`).

    Raises:
        InputError, ClockError, WorkloadError, DeviceUnavailable: as :func:`capture_timeline`.
    """
    from . import harness

    record = {"timeline": "torch", "role": "kineto run beside the nsys timeline (path a)"}
    out_trace = Path(out_trace)
    tmp_trace = Path(str(out_trace) + ".partial.gz")
    target = _read_target(clocks_target) if device != "cpu" else {"policy": "none", "device": "cpu"}
    with locked_clocks(target, Path(out_clocks), device) as applied:
        applied["workload"] = workload_name
        applied["tool"] = "torch.profiler (capture_kineto)"
        run = _with_debug_artifacts(
            workload, out_debug, workload_name,
            lambda debug: harness.run_capture(workload, harness_cfg, device, tmp_trace, None, out_run,
                                              inductor_dir=debug, workload_name=workload_name, record=record,
                                              window_shapes=True))
        read_back(applied, "after the torch capture, its CUDA context still open")
        os.replace(tmp_trace, out_trace)
        applied["measured_s"] = run["measured_s"]


def compile_artifacts(workload: dict, harness_cfg: dict, device: str, out_dir: Path,
                      clocks_target: Path | dict | None = None, out_clocks: Path | None = None,
                      workload_name: str | None = None) -> None:
    """Inductor's debug output alone, without a trace: the workload compiled once (one warm-up + one iteration, same
    seed, shapes and settings as a capture) with the debug output :func:`_with_debug_artifacts` writes, into
    ``out_dir``. The workflow does not run it: its torch.profiler capture writes the debug output of the compile it
    profiles (``capture_timeline``/``capture_kineto`` ``out_debug``). Kept for analyses of a model outside the
    workflow and for tests that need only the graphs.

    On CUDA with ``clocks_target`` the run happens inside ``locked_clocks`` (writes ``out_clocks``), like
    every GPU job: Inductor's autotuning (warm-up) then sees the clocks the captures run at.

    Raises:
        CaptureError: the workload is not compiled (``compile`` false), or torch.compile wrote no ``output_code.py``.
        InputError, ClockError, WorkloadError: as :func:`capture_timeline`.
    """
    from . import harness

    short = dict(harness_cfg, warmup=1, warmup_max=1, iterations=1)  # compiling needs one call, not a steady state
    out_dir = Path(out_dir)
    if not workload.get("compile"):
        raise CaptureError(f"{workload_name or workload.get('kind')}: compile is false: an eager workload has no "
                           "Inductor debug output")

    def run() -> None:
        # (the partial folder's layers.json and run.json are this short run's, kept beside the graphs)
        _with_debug_artifacts(workload, out_dir, workload_name,
                              lambda debug: harness.run_capture(workload, short, device, None, debug / "layers.json",
                                                                debug / "run.json", inductor_dir=debug,
                                                                profiler="none", workload_name=workload_name))

    if device == "cuda" and clocks_target is not None:
        with locked_clocks(_read_target(clocks_target), Path(out_clocks or out_dir.parent / "clocks_applied.json"),
                           device) as applied:
            applied["tool"] = "torch.compile (compile_artifacts)"
            run()
            read_back(applied, "after compiling, its CUDA context still open")
    else:
        run()
        if out_clocks is not None:
            write_json(out_clocks, {"locked": False, "device": device, "reason": f"{device} run: no GPU clocks locked"})


#: Written into the debug folder of an eager workload (compile false): the folder is the capture's output either way.
EAGER_DEBUG_NOTE = "EAGER.txt"


def _with_debug_artifacts(workload: dict, out_debug: Path | None, workload_name: str | None, run):
    """``run(debug_dir)`` (the harness; returns its run record) with Inductor's debug output going to ``out_debug``:
    for a compiled workload, TORCH_COMPILE_DEBUG directories (``output_code.py``, FX graphs, provenance JSON:
    ``trace.provenance_tracking_level = 1``, docs/formats.md#inductor-switches), each with the module path of every
    FX node (``opprof_module_paths.json``, :mod:`operator_profiler.capture.fx_module_paths`), written into
    ``out_debug``.partial and renamed into place after the run; the harness turns the FX graph cache off for it (a
    cache hit generates no code, hence no debug output). These are the graphs of the compile the capture profiles,
    so the fusion map names exactly the kernels the trace holds. An eager workload's folder holds only
    :data:`EAGER_DEBUG_NOTE`. ``out_debug`` None: ``run(None)``, no debug output.

    Raises:
        CaptureError: a compiled workload's run wrote no ``output_code.py`` (nothing was compiled).
    """
    if out_debug is None:
        return run(None)
    out_debug = Path(out_debug)
    tmp = out_debug.with_name(out_debug.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if workload.get("compile"):
        from .fx_module_paths import recording

        with recording():  # each graph dir gets the module paths of its FX nodes (opprof_module_paths.json)
            result = run(tmp)
        if not any(tmp.rglob("output_code.py")):
            raise CaptureError(f"{workload_name or workload.get('kind')}: torch.compile wrote no Inductor debug "
                               f"directory under {tmp}; is the workload compiled (its forward run at all)?")
    else:
        result = run(None)
        (tmp / EAGER_DEBUG_NOTE).write_text(
            "compile: false: this workload runs eagerly; torch.compile generated no kernels, so there is no "
            "Inductor debug output and no fusion map.\n")
    shutil.rmtree(out_debug, ignore_errors=True)
    os.replace(tmp, out_debug)
    return result
