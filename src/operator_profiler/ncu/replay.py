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
import shutil
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


#: The ``ncu`` config section's defaults (config schema ``ncu``).
DEFAULT_OPTIONS = {"window": "nvtx", "cache_control": "all"}
WINDOWS = ("nvtx", "profiler_api")


def replay_options(ncu_cfg: dict | None) -> dict:
    """The config's ``ncu`` section over :data:`DEFAULT_OPTIONS` (the schema has checked the values)."""
    options = {**DEFAULT_OPTIONS, **{k: v for k, v in (ncu_cfg or {}).items() if v is not None}}
    if options["window"] not in WINDOWS or options["cache_control"] not in ("all", "none"):
        raise ValueError(f"ncu options {options!r}: window must be one of {WINDOWS}, cache_control all or none")
    return options


def window_args(options: dict) -> list[str]:
    """How ncu finds the measured window (docs/gpu.md, "The window"): ``--profile-from-start off`` (launches before
    cudaProfilerStart are neither profiled nor, with window ``nvtx``, counted) and, for window ``nvtx``, ``--nvtx
    --nvtx-include opprof@opprof.measured``: the harness's NVTX start/end range around the measured iterations
    (start/end syntax ``Domain@Range``, no trailing ``/``; Nsight Compute CLI guide, NVTX Filtering). ``--launch-skip``
    and ``--launch-count`` count only launches that match the filters (ncu ``--help``), so the k-th launch counted
    is the k-th kernel of the window whatever ran before it."""
    from ..naming import measured_range_include

    args = ["--profile-from-start", "off"]
    if options["window"] == "nvtx":  # the harness re-run opens the range in this environment's domain
        args += ["--nvtx", "--nvtx-include", measured_range_include()]
    return args


def replay_command(plan: dict, metrics: list[str], out_report: Path, applied_clocks: dict, target: list[str],
                   segment: int = 0, options: dict | None = None, mig: bool = False) -> list[str]:
    """The exact ncu argv of one segment of ``plan`` (a list: never through a shell, so paths with spaces
    stay one argument).

    ``ncu --profile-from-start off [--nvtx --nvtx-include opprof@opprof.measured] --launch-skip N --launch-count M
    --metrics <metrics> --replay-mode kernel --cache-control all|none [--clock-control none] --print-kernel-base
    mangled --export REPORT --force-overwrite <target ...>`` (docs/formats.md#ncu-filters-and-replay; Nsight Compute
    CLI guide). ``--clock-control none`` when :func:`operator_profiler.capture.clocks.locked_clocks` locked the
    clocks (:func:`~operator_profiler.capture.clocks.ncu_clock_args`) or on a MIG GPU (``mig``: ncu cannot lock
    clocks on MIG and fails: "Cannot lock GPU clock frequencies on MIG!"); otherwise ncu locks them itself.
    ``metrics``: the full names to collect (:func:`operator_profiler.ncu.availability.check_metrics`);
    ``options``: :func:`replay_options`.
    """
    from ..capture.clocks import ncu_clock_args

    options = replay_options(options)
    seg = plan["segments"][segment]
    clock_args = ncu_clock_args(applied_clocks) or (["--clock-control", "none"] if mig else [])
    return [NCU, *window_args(options),
            "--launch-skip", str(seg["launch_skip"]), "--launch-count", str(seg["launch_count"]),
            "--metrics", ",".join(metrics),
            "--replay-mode", "kernel", "--cache-control", options["cache_control"], *clock_args,
            "--print-kernel-base", "mangled",
            "--export", str(out_report), "--force-overwrite", *target]


# ------------------------------------------------------------------------------------------ run


DCGM_FIX = ("pause DCGM's profiling while the replays run: `dcgmi profile --pause` (and `dcgmi profile --resume` "
            "after), or stop the other profiler (Nsight Compute, Nsight Systems' GPU metrics, a CUPTI profiling "
            "client); the counters are one system-wide resource")
PERMISSION_FIX = ("run the GPU jobs as root, or start the container with --cap-add=SYS_ADMIN, or have an administrator "
                  "set the driver option NVreg_RestrictProfilingToAdminUsers=0; see " + PERMISSION_URL)


def _failure(cls: str, cmd: list[str], proc: subprocess.CompletedProcess, what: str | None = None) -> NcuReplayError | None:
    """The error of a failed ncu collection, with the fix where the output names the cause (texts: real ncu
    output, docs/formats.md#ncu-errors): counters held by another tool (DCGM: "a driver resource was unavailable"),
    no counter permission (ERR_NVGPUCTRPERM), clocks on MIG; None when the collection succeeded."""
    text = (proc.stdout or "") + "\n" + (proc.stderr or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("==ERROR==") or "ERR_NVGPUCTRPERM" in ln]
    what = what or f"layer class {cls}: `{shlex.join(cmd[:7])} ...`"
    if any("driver resource was unavailable" in ln for ln in errors):
        both = any("permission" in ln.lower() for ln in errors if "driver resource" in ln)
        return NcuReplayError(f"{what} could not reserve the GPU performance counters (\"a driver resource was "
                              "unavailable\": another tool such as DCGM holds them"
                              + (", or no counter permission" if both else "") + f"); fix: {DCGM_FIX}"
                              + (f"; or, for the permission: {PERMISSION_FIX}" if both else ""))
    if any("ERR_NVGPUCTRPERM" in ln for ln in errors):
        return NcuReplayError(f"{what} was not allowed to read the GPU performance counters (ERR_NVGPUCTRPERM); fix: "
                              f"{PERMISSION_FIX}")
    if any("Cannot lock GPU clock frequencies on MIG" in ln for ln in errors):
        return NcuReplayError(f"{what} failed: ncu cannot lock clocks on a MIG instance; set `clocks: {{policy: none}}` "
                              "(the replay then passes --clock-control none) or lock the whole GPU's clocks as root "
                              "before the run")
    if proc.returncode != 0 or errors:
        said = errors[0] if errors else (lines[-1] if lines else "no output")
        return NcuReplayError(f"{what} failed (exit {proc.returncode}): {said}; the full output is in the log")
    if any("No kernels were profiled" in ln for ln in lines):
        return NcuReplayError(f"{what} profiled no kernels: the re-run launched fewer kernels than the timeline "
                              "planned (a non-deterministic workload, or a config changed since the capture), or the "
                              "NVTX window filter matched nothing (ncu.window: nvtx; scripts/gpu-check --first-contact "
                              "checks it); re-run the capture and classify_layers")
    return None


#: How many times one segment is re-run without the metric names ncu refused (each run drops what it named).
METRIC_RETRIES = 2


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


def run_replay(plan: dict, metrics: dict | list[str], out_csv: Path, out_json: Path, applied_clocks: dict,
               target: list[str], arch: str | None = None, options: dict | None = None, mig: bool = False) -> dict:
    """Run the ncu replay of ``plan`` (one ncu process per segment), export each report's raw page, merge
    them into ``out_csv`` and write ``out_json`` (``replay.json``).

    ``metrics``: the ``metrics`` record of :func:`operator_profiler.ncu.availability.check_metrics` (its
    ``collect`` names are requested), or a plain list of names. A collection that fails naming metrics it cannot
    access or find (``==ERROR== Failed to access the following N metrics: ...``, ``Failed to find metric ...``) is
    run again without them (at most :data:`METRIC_RETRIES` times); names a collection reports unable to access but
    goes on without (``==WARNING== Unable to access ...``) are recorded too (``metrics.not_collected``).

    The reports are kept beside the CSV: ``{cls}.ncu-rep`` (``{cls}.part<k>.ncu-rep`` for several segments).
    ``replay.json``: ``class, instances, replay_instances, kernels_planned, segments`` (each with ``command``
    (argv list), ``command_text`` (shell-quoted), ``wall_s``, ``report``, ``pid``), ``wall_s`` (seconds, sum
    over segments, ncu's own wall time including the harness re-run), ``estimate_all_instances_s`` (wall_s x
    instances / replayed instances: replaying every instance of the class), ``arch``, ``clocks``,
    ``window`` (for matching), ``ncu_window`` and ``cache_control`` (the options), ``metrics`` (requested,
    collected, dropped with reasons, not collected), ``warnings``, ``ncu_version`` (:func:`ncu_version`).

    Raises:
        NcuReplayError: ncu not on PATH, ncu failed (counters held by DCGM, ERR_NVGPUCTRPERM, MIG clocks get
            their fix), or profiled nothing.
        NcuCsvError: the export of a report failed.
    """
    import shutil

    from .availability import inaccessible_metrics

    if shutil.which(NCU) is None:
        raise NcuReplayError(f"layer class {plan['class']}: Nsight Compute's '{NCU}' is not on PATH; install Nsight "
                             "Compute (it ships with the CUDA toolkit) and add its folder to PATH, or run with "
                             "device: cpu")
    record_metrics = dict(metrics) if isinstance(metrics, dict) else {
        "requested": list(metrics), "collect": list(metrics), "dropped": [], "unchecked": [], "warnings": []}
    record_metrics["dropped"] = list(record_metrics.get("dropped", []))
    collect = list(record_metrics["collect"])
    not_collected: list[str] = []
    options = replay_options(options)
    out_csv, out_json = Path(out_csv), Path(out_json)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    cls = plan["class"]
    several = len(plan["segments"]) > 1
    segments, csvs = [], []
    warnings = list(plan.get("warnings", [])) + list(record_metrics.get("warnings", []))
    for k in range(len(plan["segments"])):
        report = out_csv.with_name(f"{cls}.part{k}.ncu-rep" if several else f"{cls}.ncu-rep")
        for attempt in range(METRIC_RETRIES + 1):
            cmd = replay_command(plan, collect, report, applied_clocks, target, k, options, mig)
            log.info("replay_ncu: %s", shlex.join(cmd))
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t0
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    print(stream, file=sys.stderr, end="" if stream.endswith("\n") else "\n")
            said = inaccessible_metrics((proc.stdout or "") + "\n" + (proc.stderr or ""), collect)
            error = _failure(cls, cmd, proc)
            refused = said["not_found"] + (said["unable"] if error is not None else [])
            if error is not None and refused and attempt < METRIC_RETRIES:
                warnings.append(f"segment {k}: ncu refused {len(refused)} metric(s) ({', '.join(refused)}); "
                                "collected again without them")
                log.warning("replay_ncu: %s", warnings[-1])
                record_metrics["dropped"] += [{"name": n, "reason": "refused by ncu during the replay"} for n in refused]
                collect = [n for n in collect if n not in set(refused)]
                continue
            break
        if error is not None:
            raise error
        new = [n for n in said["unable"] if n not in not_collected]
        if new:
            not_collected += new
            warnings.append(f"segment {k}: ncu could not access {len(new)} metric(s) and went on without them: "
                            f"{', '.join(new)}")
            log.warning("replay_ncu: %s", warnings[-1])
        csvs.append(export_report_csv(report, out_csv.parent))
        segments.append({**plan["segments"][k], "command": cmd, "command_text": shlex.join(cmd),
                         "wall_s": round(wall, 3), "report": report.name, "attempts": attempt + 1})
    pids = merge_raw_csvs(csvs, out_csv)
    for seg, pid, path in zip(segments, pids, csvs):
        seg["pid"] = pid
        if path != out_csv:
            path.unlink(missing_ok=True)
    wall_s = round(sum(s["wall_s"] for s in segments), 3)
    record_metrics["collect"] = collect
    record_metrics["not_collected"] = not_collected
    record = {
        "class": cls, "instances": plan["instances"], "replay_instances": plan["replay_instances"],
        "kernels_planned": plan["kernel_count"], "segments": segments, "wall_s": wall_s,
        "estimate_all_instances_s": round(instances_scale(plan) * wall_s, 3), "arch": arch,
        "clocks": applied_clocks, "window": plan["window"], "ncu_window": options["window"],
        "cache_control": options["cache_control"], "mig": mig, "metrics": record_metrics,
        "warnings": list(dict.fromkeys(warnings)), "ncu_version": ncu_version(),
    }
    write_json(out_json, record)
    return record


_NCU_VERSION = re.compile(r"^Version (\S+)", re.MULTILINE)


def ncu_version(timeout_s: float = 60) -> str | None:
    """The version of the ``ncu`` on PATH (``2025.1.1.0``) from ``ncu --version``, whose last line reads
    ``Version 2025.1.1.0 (build 35528883) (public-release)``; None when it cannot be told (the report
    then says unknown). Source: the output of ``ncu --version`` (Nsight Compute CLI docs,
    https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html#general)."""
    from ..tool_runs import run_tool

    done = run_tool([NCU, "--version"], timeout_s)
    found = _NCU_VERSION.search(done.text) if done.code == 0 else None
    return found.group(1) if found else None


def compute_capability(device: str = "cuda", timeout_s: float = 60) -> tuple[tuple[int, int], str]:
    """The compute capability of the GPU torch calls ``device``: ``((major, minor), source)``.

    From ``nvidia-smi -i ID --query-gpu=compute_cap`` (``9.0``; ID by :func:`~operator_profiler.capture.clocks.gpu_id`),
    else ``torch.cuda.get_device_capability``. Without it the replay would have to ask for every architecture's
    metric names, which always include names of another chip.

    Raises:
        NcuReplayError: neither tells it (one line naming both attempts).
    """
    from ..capture.clocks import gpu_id
    from ..errors import ClockError

    said = []
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            from ..tool_runs import run_tool

            idx = gpu_id(device)
            done = run_tool([smi, "-i", str(idx), "--query-gpu=compute_cap", "--format=csv,noheader,nounits"],
                            timeout_s)
            if done.code != 0:
                raise ValueError(f"exit {done.code}: {done.said()}")
            major, minor = (int(v) for v in done.text.strip().splitlines()[0].strip().split("."))
            return (major, minor), "nvidia-smi compute_cap"
        except (ValueError, IndexError, OSError) as exc:
            said.append(f"nvidia-smi gave no compute_cap ({type(exc).__name__}: {exc})")
        except ClockError as exc:  # a device outside CUDA_VISIBLE_DEVICES
            said.append(str(exc))
    else:
        said.append("nvidia-smi not on PATH")
    try:
        import torch

        if torch.cuda.is_available():
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            major, minor = torch.cuda.get_device_capability(index)
            return (int(major), int(minor)), "torch.cuda.get_device_capability"
        said.append("torch sees no CUDA GPU")
    except Exception as exc:  # an import or driver failure: said, not raised
        said.append(f"torch: {type(exc).__name__}: {exc}")
    raise NcuReplayError(f"the compute capability of {device} is unknown ({'; '.join(said)}): the replay cannot choose "
                         "the chip's metric names; check the NVIDIA driver (nvidia-smi) and that torch sees the GPU")


def gpu_arch(device: str = "cuda") -> str:
    """Catalog architecture (ampere, hopper, blackwell) of ``device``'s GPU (:func:`compute_capability`).

    Raises:
        NcuReplayError: the compute capability is unknown."""
    from .catalog import arch_for_cc

    (major, minor), _source = compute_capability(device)
    return arch_for_cc(f"{major}.{minor}")


def replay_files(plan_path: Path, clocks_target: Path, workload: dict, harness_cfg: dict, workload_name: str,
                 device: str, out_csv: Path, out_json: Path, out_clocks: Path, ncu_cfg: dict | None = None,
                 metrics_cache: Path | None = None) -> dict:
    """Rule ``replay_ncu``: read the class's plan (``layers/replay/{cls}.json``) and ``clocks/target.json``,
    choose the metrics the chip has (:func:`compute_capability`, :func:`operator_profiler.ncu.availability.check_metrics`,
    answers cached in ``metrics_cache``), lock the clocks (:func:`operator_profiler.capture.clocks.locked_clocks`,
    restored whatever happens; written to ``out_clocks``), run :func:`run_replay` with the harness re-run of
    :func:`target_argv` (the plan's iterations only) and the ``ncu`` options ``ncu_cfg`` (:func:`replay_options`),
    and return the ``replay.json`` record.

    Raises:
        GpuStageUnavailable: ``device`` is not cuda.
        InputError, ClockError, NcuReplayError, NcuCsvError: see the functions above.
    """
    from ..capture.clocks import locked_clocks
    from ..errors import GpuStageUnavailable
    from ..files import read_json_file
    from .availability import check_metrics
    from .catalog import arch_for_cc, load_catalog

    if device != "cuda" and not device.startswith("cuda:"):
        raise GpuStageUnavailable(f"replay_ncu needs a CUDA GPU with Nsight Compute (device is {device!r}); ncu "
                                  "counters are not collected on a CPU run")
    plan = read_json_file(Path(plan_path), "an ncu replay plan", "it is written by classify_layers", expect=dict)
    target = read_json_file(Path(clocks_target), "clocks/target.json", "run select_clocks first", expect=dict)
    options = replay_options(ncu_cfg)
    catalog = load_catalog()
    cc, cc_source = compute_capability(device)
    arch = arch_for_cc(f"{cc[0]}.{cc[1]}")
    torch_index = int(device.split(":", 1)[1]) if ":" in device else 0
    metrics = check_metrics(catalog.replay_metrics(arch), torch_index, cc, ncu_version(),
                            Path(metrics_cache) if metrics_cache else None, target.get("gpu"))
    metrics["compute_capability"] = {"value": f"{cc[0]}.{cc[1]}", "source": cc_source, "arch": arch}
    out_csv = Path(out_csv)
    run_dir = out_csv.with_name(f"{plan['class']}.target")  # the re-run's layers.json and run.json
    iterations = plan["iteration"] + 1 if plan.get("iteration") is not None else None
    argv = target_argv(workload, harness_cfg, run_dir, workload_name, iterations)
    with locked_clocks(target, Path(out_clocks), device) as applied:
        record = run_replay(plan, metrics, out_csv, out_json, applied, argv, arch, options, bool(target.get("mig")))
    # replay.json's clocks: the verdict written when the lock ended (read-backs during the replay, the restore),
    # not the snapshot taken while ncu ran
    record["clocks"] = read_json_file(Path(out_clocks), "clocks_applied.json", "re-run replay_ncu", expect=dict)
    write_json(out_json, record)
    return record


def instances_scale(record: dict) -> float:
    """instances / replayed instances (N/K) of one class (1 for ``rest``)."""
    n, k = len(record.get("instances") or []), len(record.get("replay_instances") or [])
    return n / k if n and k else 1.0
