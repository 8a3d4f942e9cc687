"""Nsight Compute replay of one layer class: plan the launch window (counted from cudaProfilerStart, so
warm-up is never counted), build the exact ncu command, run it per segment, export the raw page and
record what ran (``replay.json``), so that every ncu row can be matched to its planned kernel.
Details: docs/modules.md#ncu-replay."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..errors import NcuReplayError
from ..files import write_json
from .csv_reader import PERMISSION_URL, export_report_csv

log = logging.getLogger(__name__)

NCU = "ncu"


# ------------------------------------------------------------------------------------------ plan


# ------------------------------------------------------------------------------------------ command


def target_argv(workload: dict, harness_cfg: dict, out_dir: Path, workload_name: str | None = None,
                iterations: int | None = None) -> list[str]:
    """The program ncu runs: the workload harness again in a fresh process, its measured iterations
    inside cudaProfilerStart/Stop: ``opprof run-harness ... --device cuda --profiler cuda_profiler_api``
    (:func:`operator_profiler.capture.jobs.harness_argv`, the same entry the nsys capture launches), writing
    its ``run.json``/``layers.json`` into ``out_dir``. ``iterations`` (default: the harness's) cuts the
    re-run to the iterations the plan needs (the first measured one)."""
    from ..capture.jobs import harness_argv

    harness_cfg = dict(harness_cfg, **({"iterations": int(iterations)} if iterations else {}))
    out_dir = Path(out_dir)
    return harness_argv(workload_name or "workload", workload, harness_cfg, "cuda", "cuda_profiler_api",
                        out_dir / "run.json", out_layers=out_dir / "layers.json")


def replay_command(plan: dict, catalog, out_report: Path, applied_clocks: dict, target: list[str],
                   segment: int = 0, arch: str | None = None) -> list[str]:
    """The exact ncu argv of one segment of ``plan`` (a list: never through a shell, so paths with spaces
    stay one argument).

    ``ncu --profile-from-start off --launch-skip N --launch-count M --metrics <catalog, arch>
    --replay-mode kernel --cache-control all [--clock-control none] --print-kernel-base mangled
    --export REPORT --force-overwrite <target ...>`` (docs/formats.md#ncu-filters-and-replay, #ncu-gpu-checks; Nsight Compute CLI guide
    https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html). ``--clock-control none`` only when
    :func:`operator_profiler.capture.clocks.locked_clocks` locked the clocks (:func:`~operator_profiler.capture.clocks.ncu_clock_args`);
    otherwise ncu locks them itself. ``catalog``: :class:`~operator_profiler.ncu.catalog.Catalog`;
    ``arch``: ampere/hopper/blackwell (None: every architecture's names).
    """
    from ..capture.clocks import ncu_clock_args

    seg = plan["segments"][segment]
    return [NCU, "--profile-from-start", "off",
            "--launch-skip", str(seg["launch_skip"]), "--launch-count", str(seg["launch_count"]),
            "--metrics", catalog.metrics_argument(arch),
            "--replay-mode", "kernel", "--cache-control", "all", *ncu_clock_args(applied_clocks),
            "--print-kernel-base", "mangled",
            "--export", str(out_report), "--force-overwrite", *target]


# ------------------------------------------------------------------------------------------ run


def _failure(cls: str, cmd: list[str], proc: subprocess.CompletedProcess) -> NcuReplayError | None:
    text = (proc.stdout or "") + "\n" + (proc.stderr or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("==ERROR==") or "ERR_NVGPUCTRPERM" in ln]
    what = f"layer class {cls}: `{shlex.join(cmd[:7])} ...`"
    if any("ERR_NVGPUCTRPERM" in ln for ln in errors):
        return NcuReplayError(f"{what} was not allowed to read the GPU performance counters (ERR_NVGPUCTRPERM); fix: "
                              "run the GPU jobs as root, or start the container with --cap-add=SYS_ADMIN, or have an "
                              "administrator set the driver option NVreg_RestrictProfilingToAdminUsers=0; see "
                              f"{PERMISSION_URL}")
    if proc.returncode != 0 or errors:
        said = errors[0] if errors else (lines[-1] if lines else "no output")
        return NcuReplayError(f"{what} failed (exit {proc.returncode}): {said}; the full output is in the rule's log")
    if any("No kernels were profiled" in ln for ln in lines):
        return NcuReplayError(f"{what} profiled no kernels: the re-run launched fewer kernels than the timeline "
                              "planned (a non-deterministic workload, or a config changed since the capture); "
                              "re-run the capture and classify_layers")
    return None


def merge_raw_csvs(paths: list[Path], out: Path) -> list[int | None]:
    """Concatenate raw-page CSVs (header, units row, one row per result; docs/formats.md#ncu-pages) of the segments of one
    class, in order, into ``out``: ``ID`` renumbered 0.. in order and ``Process ID`` set to the first
    file's, so the file reads as one run in launch order. Returns each file's original process id.

    Raises:
        NcuReplayError: a file without a header, or headers that differ (another metric set or ncu version).
    """
    header, units, rows, pids = None, None, [], []
    for path in paths:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip() and not ln.startswith("==")]
        table = list(csv.reader(lines))
        if not table or "ID" not in table[0]:
            raise NcuReplayError(f"{path}: no raw-page CSV header (\"ID\",...); re-export with "
                                 "ncu -i REPORT --csv --page raw")
        if header is None:
            header, units = table[0], (table[1] if len(table) > 1 and table[1][0] == "" else None)
        elif table[0] != header:
            raise NcuReplayError(f"{path}: its columns differ from {paths[0]} (another metric set or ncu version); "
                                 "re-run the replay of this class")
        body = [r for r in table[1:] if r and r[0] != ""]
        pid_col = header.index("Process ID") if "Process ID" in header else None
        pids.append(int(body[0][pid_col]) if body and pid_col is not None and body[0][pid_col].isdigit() else None)
        rows.extend(body)
    id_col = header.index("ID")
    pid_col = header.index("Process ID") if "Process ID" in header else None
    for i, row in enumerate(rows):
        row[id_col] = str(i)
        if pid_col is not None and pids[0] is not None:
            row[pid_col] = str(pids[0])
    buf = io.StringIO()
    writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(header)
    if units is not None:
        writer.writerow(units)
    writer.writerows(rows)
    tmp = Path(str(out) + ".partial")
    tmp.write_text(buf.getvalue())
    os.replace(tmp, out)
    return pids


def run_replay(plan: dict, catalog, out_csv: Path, out_json: Path, applied_clocks: dict, target: list[str],
               arch: str | None = None) -> dict:
    """Run the ncu replay of ``plan`` (one ncu process per segment), export each report's raw page, merge
    them into ``out_csv`` and write ``out_json`` (``replay.json``).

    The reports are kept beside the CSV: ``{cls}.ncu-rep`` (``{cls}.part<k>.ncu-rep`` for several segments).
    ``replay.json``: ``class, instances, replay_instances, kernels_planned, segments`` (each with ``command``
    (argv list), ``command_text`` (shell-quoted), ``wall_s``, ``report``, ``pid``), ``wall_s`` (seconds, sum
    over segments, ncu's own wall time including the harness re-run), ``estimate_all_instances_s`` (wall_s x
    instances / replayed instances: replaying every instance of the class), ``arch``, ``clocks``,
    ``window`` (for matching), ``warnings``, ``ncu_version`` (:func:`ncu_version`).

    Raises:
        NcuReplayError: ncu not on PATH, ncu failed (ERR_NVGPUCTRPERM gets the fix), or profiled nothing.
        NcuCsvError: the export of a report failed.
    """
    import shutil

    if shutil.which(NCU) is None:
        raise NcuReplayError(f"layer class {plan['class']}: Nsight Compute's '{NCU}' is not on PATH; install Nsight "
                             "Compute (it ships with the CUDA toolkit) and add its folder to PATH, or run with "
                             "device: cpu")
    out_csv, out_json = Path(out_csv), Path(out_json)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    cls = plan["class"]
    several = len(plan["segments"]) > 1
    segments, csvs = [], []
    for k in range(len(plan["segments"])):
        report = out_csv.with_name(f"{cls}.part{k}.ncu-rep" if several else f"{cls}.ncu-rep")
        cmd = replay_command(plan, catalog, report, applied_clocks, target, k, arch)
        log.info("replay_ncu: %s", shlex.join(cmd))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        for stream in (proc.stdout, proc.stderr):
            if stream:
                print(stream, file=sys.stderr, end="" if stream.endswith("\n") else "\n")
        error = _failure(cls, cmd, proc)
        if error is not None:
            raise error
        csvs.append(export_report_csv(report, out_csv.parent))
        segments.append({**plan["segments"][k], "command": cmd, "command_text": shlex.join(cmd),
                         "wall_s": round(wall, 3), "report": report.name})
    pids = merge_raw_csvs(csvs, out_csv)
    for seg, pid, path in zip(segments, pids, csvs):
        seg["pid"] = pid
        if path != out_csv:
            path.unlink(missing_ok=True)
    wall_s = round(sum(s["wall_s"] for s in segments), 3)
    record = {
        "class": cls, "instances": plan["instances"], "replay_instances": plan["replay_instances"],
        "kernels_planned": plan["kernel_count"], "segments": segments, "wall_s": wall_s,
        "estimate_all_instances_s": round(instances_scale(plan) * wall_s, 3), "arch": arch,
        "clocks": applied_clocks, "window": plan["window"], "warnings": plan.get("warnings", []),
        "ncu_version": ncu_version(),
    }
    write_json(out_json, record)
    return record


_NCU_VERSION = re.compile(r"^Version (\S+)", re.MULTILINE)


def ncu_version() -> str | None:
    """The version of the ``ncu`` on PATH (``2025.1.1.0``) from ``ncu --version``, whose last line reads
    ``Version 2025.1.1.0 (build 35528883) (public-release)``; None when it cannot be told (the report
    then says unknown). Source: the output of ``ncu --version`` (Nsight Compute CLI docs,
    https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html#general)."""
    try:
        proc = subprocess.run([NCU, "--version"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _NCU_VERSION.search(proc.stdout) if proc.returncode == 0 else None
    return found.group(1) if found else None


def gpu_arch(device_index: str = "0") -> str | None:
    """Catalog architecture of a GPU from ``nvidia-smi --query-gpu=compute_cap`` (None when it cannot tell:
    the replay then asks for every architecture's metric names)."""
    import shutil

    from .catalog import arch_for_cc

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    proc = subprocess.run([smi, "-i", str(device_index), "--query-gpu=compute_cap", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=False)
    try:
        return arch_for_cc(proc.stdout.strip().splitlines()[0]) if proc.returncode == 0 else None
    except (ValueError, IndexError):
        return None


def replay_files(plan_path: Path, clocks_target: Path, workload: dict, harness_cfg: dict, workload_name: str,
                 device: str, out_csv: Path, out_json: Path, out_clocks: Path) -> dict:
    """Rule ``replay_ncu``: read the class's plan (``layers/replay/{cls}.json``) and ``clocks/target.json``,
    lock the clocks (:func:`operator_profiler.capture.clocks.locked_clocks`, restored whatever happens; written to
    ``out_clocks``), run :func:`run_replay` with the harness re-run of :func:`target_argv` (the plan's
    iterations only), and return the ``replay.json`` record.

    Raises:
        GpuStageUnavailable: ``device`` is not cuda.
        InputError, ClockError, NcuReplayError, NcuCsvError: see the functions above.
    """
    from ..capture.clocks import gpu_id, locked_clocks
    from ..errors import GpuStageUnavailable
    from ..files import read_json_file
    from .catalog import load_catalog

    if device != "cuda":
        raise GpuStageUnavailable(f"replay_ncu needs a CUDA GPU with Nsight Compute (device is {device!r}); ncu "
                                  "counters are not collected on a CPU run")
    plan = read_json_file(Path(plan_path), "an ncu replay plan", "it is written by classify_layers", expect=dict)
    target = read_json_file(Path(clocks_target), "clocks/target.json", "run select_clocks first", expect=dict)
    catalog = load_catalog()
    arch = gpu_arch(gpu_id(device))
    out_csv = Path(out_csv)
    run_dir = out_csv.with_name(f"{plan['class']}.target")  # the re-run's layers.json and run.json
    iterations = plan["iteration"] + 1 if plan.get("iteration") is not None else None
    argv = target_argv(workload, harness_cfg, run_dir, workload_name, iterations)
    with locked_clocks(target, Path(out_clocks), device) as applied:
        return run_replay(plan, catalog, out_csv, out_json, applied, argv, arch)


def instances_scale(record: dict) -> float:
    """instances / replayed instances (N/K) of one class (1 for ``rest``)."""
    n, k = len(record.get("instances") or []), len(record.get("replay_instances") or [])
    return n / k if n and k else 1.0
