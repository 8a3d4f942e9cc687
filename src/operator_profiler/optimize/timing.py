"""Wall time per iteration of the variants of one workload, measured fairly: interleaved, in several processes
one after another, with page faults per iteration, numerics against the FP32 eager reference, and the median's
bootstrap interval and speedups (docs/optimize.md#verification).

:func:`measure` writes one spec per process and runs ``python -m operator_profiler.optimize.timing_worker
SPEC.json OUT.json`` (:mod:`operator_profiler.optimize.timing_worker`) for each, never two at once (they would
share the cores), and never one that outlives this process (an exception or signal here kills it; the worker
also ends by itself when this process is killed outright: ``timing_worker.die_with_parent``). Each process
builds, compiles and warms up every variant itself, so process-level luck (allocator state, page cache, code
placement) shows up as spread between processes instead of deciding a comparison. The first process
calibrates each variant's iterations per repetition (k, so that a repetition lasts at least
``min_repetition_s``, from the fastest of its last warm-up iterations: ``timing_worker.calibrate``); the later
ones reuse the largest k calibrated so far (a discarded busy process's too), or their own when that is larger;
a process whose repetitions still lasted under half the minimum gets a warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, WorkloadError
from . import stats
from .timing_worker import PARENT_ENV, PROGRESS_PREFIX

#: ``build(model, inputs, changes, device, mode=...) -> Variant`` used by default (transforms.changes).
DEFAULT_BUILD = "operator_profiler.transforms.changes:build_variant"
#: Module with ``compare_outputs``, ``variant_dtype`` and ``DEFAULT_TOLERANCES`` used by default.
DEFAULT_NUMERICS = "operator_profiler.optimize.numerics"
#: What a fair speed comparison needs (docs/optimize.md#verification): at least this many repetitions over at
#: least this many processes.
MIN_REPETITIONS, MIN_PROCESSES = 20, 2
#: Minor + major page faults per iteration by which a variant may differ from the baseline (or its own processes
#: from each other) before the result warns (100 faults of 4 KiB pages = 400 KiB touched for the first time per
#: iteration: an allocator returning and re-faulting memory, e.g. bf16 weight casts in every call).
FAULT_THRESHOLD = 100.0
#: Processes a measurement may run beyond its ``processes`` to replace ones during whose repetitions other
#: processes kept the CPUs busy (:func:`busy_load`); a busy process is discarded when its replacement is quiet.
#: One replaces a process that met a passing load; on a machine busy all along more would only multiply the
#: time (with 2 allowed, the workflow test's verification on 2 cores shared with other jobs ran 4 processes of
#: about 3 min each instead of 2, every one busy).
BUSY_REMEASURE = 1
#: A process whose median repetition of a variant lasted under this fraction of ``min_repetition_s`` gets a
#: warning (:func:`short_repetition_warnings`): its k was too small for the machine.
SHORT_REPETITION_FRACTION = 0.5

DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "mode": "infer",
    "threads": None,
    "repetitions": MIN_REPETITIONS,
    "processes": MIN_PROCESSES,
    "seed": 0,
    "min_repetition_s": 0.1,
    "warmup": {"minimum": 2, "maximum": 30, "window": 5, "tolerance": 0.1},
    "tolerances": None,
    "fault_threshold": FAULT_THRESHOLD,
    "confidence": stats.CONFIDENCE,
    "resamples": stats.RESAMPLES,
    "busy_remeasure": BUSY_REMEASURE,
}


def callable_path(build: str | Callable[..., Any], what: str = "build") -> str:
    """``"module:function"`` for ``build`` (a string passes through): the worker imports it in its own process.

    Raises:
        ConfigError: a callable that cannot be imported by name (a lambda, a function defined inside another).
    """
    if isinstance(build, str):
        if ":" not in build:
            raise ConfigError(f"{what} {build!r} is not of the form 'package.module:function'")
        return build
    module, name = getattr(build, "__module__", None), getattr(build, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise ConfigError(f"{what} {build!r} cannot be imported by the timing worker (a lambda, a nested or a "
                          "__main__ function); pass a module-level function or its 'package.module:function' name")
    return f"{module}:{name}"


def check_importable(build: str, numerics: str | None) -> None:
    """Fail before any process starts when the builder or the numerics module cannot be imported.

    Raises:
        ConfigError: naming the missing module and what to pass instead.
    """
    import importlib

    from .timing_worker import load_callable

    try:
        load_callable(build, "build")
        if numerics:
            importlib.import_module(numerics)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"cannot load the variant builder {build!r} or the numerics module {numerics!r} ({exc}); "
                          "the defaults come with the optimizer (operator_profiler.transforms.changes and .numerics): "
                          "use a checkout that has them, or pass build='package.module:function' and a numerics "
                          "module of your own") from None


def _settings(spec: dict) -> dict:
    """``spec`` with defaults filled and checked (module docstring of :func:`measure`)."""
    from ..config import validate_config

    merged = {**DEFAULTS, **spec, "warmup": {**DEFAULTS["warmup"], **(spec.get("warmup") or {})}}
    missing = [key for key in ("workload", "variants") if not merged.get(key)]
    if missing:
        raise ConfigError(f"timing spec: missing {', '.join(missing)}")
    name = merged.get("workload_name") or merged["workload"].get("kind", "workload")
    merged["workload_name"] = name
    merged["workload"] = validate_config({"workloads": {name: merged["workload"]}},
                                         f"timing spec for {name!r}")["workloads"][name]
    merged["variants"] = {str(v): list(changes) for v, changes in merged["variants"].items()}
    first = "fp32_eager" if "fp32_eager" in merged["variants"] else next(iter(merged["variants"]))
    merged.setdefault("baseline", first)
    if merged["baseline"] not in merged["variants"]:
        raise ConfigError(f"timing spec: baseline {merged['baseline']!r} is not one of the variants "
                          f"{sorted(merged['variants'])}")
    if int(merged["busy_remeasure"]) < 0:
        raise ConfigError(f"timing spec: busy_remeasure must be 0 or more, got {merged['busy_remeasure']}")
    if merged["processes"] < 1 or merged["repetitions"] < merged["processes"]:
        raise ConfigError(f"timing spec: need at least one repetition per process (repetitions "
                          f"{merged['repetitions']}, processes {merged['processes']})")
    return merged


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _last_variant(log: Path) -> str | None:
    """The variant the log's last progress line names (where a process that wrote no OUT.json was)."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(PROGRESS_PREFIX)]
    except OSError:
        return None
    return lines[-1][len(PROGRESS_PREFIX):].partition(":")[0] if lines else None


def _run_process(index: int, spec: dict, work_dir: Path, python: str, timeout_s: float | None) -> dict:
    """Run one worker; its OUT.json content.

    Raises:
        WorkloadError: the worker failed, timed out or wrote no result; the message names the variant, the
            phase and the worker's log.
    """
    spec_path = work_dir / f"process-{index}.spec.json"
    out_path = work_dir / f"process-{index}.out.json"
    log_path = work_dir / f"process-{index}.log"
    spec_path.write_text(json.dumps(spec, indent=1) + "\n")
    out_path.unlink(missing_ok=True)
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the src/ folder this package was imported from
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    env[PARENT_ENV] = str(os.getpid())  # the worker dies with this process (timing_worker.die_with_parent)
    name = spec["workload_name"]
    started = time.monotonic()
    with open(log_path, "w") as log:
        worker = subprocess.Popen([python, "-m", "operator_profiler.optimize.timing_worker", str(spec_path),
                                   str(out_path)], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            worker.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            raise WorkloadError(f"timing of {name!r}: worker process {index} ran longer than {timeout_s} s "
                                f"(last at variant {_last_variant(log_path)!r}); its log: {log_path}") from None
        except BaseException:  # KeyboardInterrupt (SIGINT, or SIGTERM made one), SystemExit: no worker outlives us
            worker.kill()
            worker.wait()
            raise
    completed = worker
    outcome = json.loads(out_path.read_text()) if out_path.exists() else None
    if completed.returncode == 0 and outcome is not None and "error" not in outcome:
        outcome["wall_s"] = round(time.monotonic() - started, 3)  # the whole process: start, imports, every variant
        return outcome
    if outcome is not None and "error" in outcome:
        raise WorkloadError(f"timing of {name!r}: worker process {index} failed on variant {outcome['variant']!r} "
                            f"while {outcome['phase']}: {outcome['error']}; its log: {log_path}",
                            traceback_text=outcome.get("traceback"))
    how = (f"was killed by signal {-completed.returncode}" + (" (out of memory?)" if completed.returncode == -9 else "")
           if completed.returncode < 0 else f"exited with status {completed.returncode} without a result")
    raise WorkloadError(f"timing of {name!r}: worker process {index} {how} at variant {_last_variant(log_path)!r}; "
                        f"its log: {log_path}")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _merge(settings: dict, outcomes: list[dict]) -> dict:
    """The per-variant result from every process's OUT.json (see :func:`measure`)."""
    variants: dict[str, dict] = {}
    warnings: list[str] = []
    threshold = settings["fault_threshold"]
    for name, changes in settings["variants"].items():
        per_process = [o["variants"][name] for o in outcomes]
        rejected = next((f"process {o['process']}: {r['rejected']}" for o, r in zip(outcomes, per_process)
                         if r["rejected"]), None)
        entry: dict[str, Any] = {"changes": changes, "rejected": rejected,
                                 "numerics": next((r.get("numerics") for r in per_process if r.get("numerics")), None),
                                 "numerics_in_dtype": next((r.get("numerics_in_dtype") for r in per_process
                                                            if r.get("numerics_in_dtype")), None),
                                 "checks": per_process[0].get("checks"), "rewrites": per_process[0].get("rewrites")}
        variants[name] = entry
        changed = next((r["process_settings_changed"] for r in per_process if r.get("process_settings_changed")), None)
        if changed:
            warnings.append(f"{name}: building it changed process-wide settings {changed} ([before, after]): the "
                            "variants built and timed after it in the same process ran with them too")
        if rejected:
            continue
        samples = [s for r in per_process for s in r["samples_ms"]]
        faults = [mi + ma for r in per_process for mi, ma in zip(r["minor_faults"], r["major_faults"])]
        interval = stats.median_interval(samples, settings["confidence"], settings["resamples"], settings["seed"])
        entry.update(
            samples_ms=samples, repetitions=len(samples), processes=len(per_process),
            iterations_per_repetition=[r["iterations_per_repetition"] for r in per_process],
            median_repetition_s=[round(_median(r["repetition_s"]), 6) if r.get("repetition_s") else None
                                 for r in per_process],
            seconds=[r.get("seconds") for r in per_process],
            median_ms=interval["median"], ci_ms=[interval["low"], interval["high"]],
            faults_per_iteration={
                "minor": _median([f for r in per_process for f in r["minor_faults"]]),
                "major": _median([f for r in per_process for f in r["major_faults"]]),
                "total": _median(faults),
                "per_process": [_median([mi + ma for mi, ma in zip(r["minor_faults"], r["major_faults"])])
                                for r in per_process]},
            warmup=[r["warmup"] for r in per_process],
            rss_after_warmup_bytes=[r.get("rss_after_warmup_bytes") for r in per_process])
        spread = max(entry["faults_per_iteration"]["per_process"]) - min(entry["faults_per_iteration"]["per_process"])
        if spread > threshold:
            warnings.append(f"{name}: page faults per iteration differ by {spread:.0f} between processes "
                            f"({entry['faults_per_iteration']['per_process']}): process-level allocator state moves "
                            "this variant's time")
        unsteady = [o["process"] for o, r in zip(outcomes, per_process) if r["warmup"].get("steady") is False]
        if unsteady:
            warnings.append(f"{name}: warm-up did not become steady within {settings['warmup']['maximum']} "
                            f"iterations in process(es) {unsteady} (a busy machine, or a model that never settles)")
    baseline = variants[settings["baseline"]]
    for name, entry in variants.items():
        entry["speedup"] = None
        if entry["rejected"] or baseline["rejected"]:
            continue
        ratio = stats.speedup_interval(baseline["samples_ms"], entry["samples_ms"], settings["confidence"],
                                       settings["resamples"], settings["seed"])
        entry["speedup"] = {"vs": settings["baseline"], "value": ratio["speedup"], "ci": [ratio["low"], ratio["high"]],
                            "shows_gain": ratio["shows_gain"]}
        difference = entry["faults_per_iteration"]["total"] - baseline["faults_per_iteration"]["total"]
        if name != settings["baseline"] and abs(difference) > threshold:
            warnings.append(
                f"{name}: {entry['faults_per_iteration']['total']:.0f} page faults per iteration against the baseline "
                f"{settings['baseline']}'s {baseline['faults_per_iteration']['total']:.0f} (threshold {threshold:g}): "
                "part of this speedup is the allocator's, not the change's")
    if baseline["rejected"]:
        warnings.append(f"baseline {settings['baseline']} was rejected ({baseline['rejected']}): no speedups")
    return {"variants": variants, "warnings": warnings}


def busy_load(outcome: dict) -> dict | None:
    """How busy the machine was during one process's repetitions, when busy: ``{"other_cpu_load", "spare",
    "threads"}`` (CPUs) when other processes kept more CPUs busy (``other_cpu_load``) than the spare ones beside
    its threads plus :data:`operator_profiler.capture.machine.BUSY_MARGIN_CPUS` (0.5); None when quiet or when the
    load is unknown (unreadable, or repetitions under 1 s in all)."""
    from ..capture.machine import BUSY_MARGIN_CPUS

    others, threads = outcome.get("other_cpu_load"), outcome["threads"]
    spare = max(0, (outcome.get("usable_cpus") or threads) - threads)
    if others is None or others <= spare + BUSY_MARGIN_CPUS:
        return None
    return {"other_cpu_load": others, "spare": spare, "threads": threads}


def busy_machine_warnings(outcomes: list[dict]) -> list[str]:
    """One warning per process during whose repetitions other processes kept more CPUs busy (``other_cpu_load``)
    than the spare ones beside its threads plus 0.5 (:func:`busy_load`)."""
    warnings = []
    for outcome in outcomes:
        busy = busy_load(outcome)
        if busy is not None:
            warnings.append(f"process {outcome['process']}: other processes kept {busy['other_cpu_load']:.1f} CPUs "
                            f"busy on average during the repetitions ({busy['spare']} spare beside its "
                            f"{busy['threads']} thread(s)): the times are inflated and noisy (an OpenMP team waits "
                            "for its descheduled thread at every operator); measure on a quiet machine or with fewer "
                            "threads")
    return warnings


def _slot(settings: dict, slot: int, repetitions: int, calibrated: dict, start: int, allowed: int, run: Callable,
          progress: Callable[[str], None] | None) -> tuple[dict, list[dict]]:
    """Run process slot ``slot`` (``repetitions`` repetitions), first as process ``start``, again as the next
    process while it was busy (:func:`busy_load`) and fewer than ``allowed`` re-measurements were run. Returns
    ``(kept, discarded)``: the first quiet process, else the least busy one (its samples kept with the busy
    warning); every other one discarded, ``{"process", "pid", "other_cpu_load", "usable_cpus", "threads",
    "spare", "replaced_by"}``."""
    attempts: list[dict] = []
    while True:
        index = start + len(attempts)
        # a replacement reuses the larger k of the processes before it: load only slows iterations, so a k
        # calibrated under load is too small, never too large (timing_worker.calibrate)
        given = _largest_k([{"variants": {n: {"iterations_per_repetition": k} for n, k in calibrated.items()}},
                            *attempts])
        if progress:
            again = (f" (again: process {attempts[-1]['process']} was busy, other processes kept "
                     f"{attempts[-1]['other_cpu_load']:.1f} CPUs busy)" if attempts else "")
            progress(f"{settings['workload_name']}: process {slot + 1}/{settings['processes']}, "
                     f"{len(settings['variants'])} variants, {repetitions} repetitions{again}")
        outcome = run(index, {**settings, "process": index, "repetitions": repetitions,
                              "iterations_per_repetition": given})
        attempts.append(outcome)
        if busy_load(outcome) is None or len(attempts) > allowed:
            break
    kept = next((o for o in attempts if busy_load(o) is None), None) or min(
        attempts, key=lambda o: busy_load(o)["other_cpu_load"] - busy_load(o)["spare"])
    discarded = [{"process": o["process"], "pid": o.get("pid"), "other_cpu_load": o.get("other_cpu_load"),
                  "usable_cpus": o.get("usable_cpus"), "threads": o.get("threads"),
                  "spare": busy_load(o)["spare"], "replaced_by": kept["process"],
                  "iterations_per_repetition": _largest_k([o])}
                 for o in attempts if o is not kept]
    return kept, discarded


def _largest_k(outcomes: list[dict]) -> dict[str, int]:
    """Per variant the largest iterations per repetition of ``outcomes`` (rejected variants left out)."""
    largest: dict[str, int] = {}
    for outcome in outcomes:
        for name, record in outcome["variants"].items():
            if not record.get("rejected") and record.get("iterations_per_repetition"):
                largest[name] = max(largest.get(name, 0), int(record["iterations_per_repetition"]))
    return largest


def short_repetition_warnings(settings: dict, outcomes: list[dict]) -> list[str]:
    """One warning per variant and process whose repetitions lasted less than
    :data:`SHORT_REPETITION_FRACTION` of ``min_repetition_s`` (their median): a k too small for this machine
    (calibrated while other processes kept the CPUs busy), whose samples timer and scheduling noise decide."""
    warnings = []
    floor = settings["min_repetition_s"] * SHORT_REPETITION_FRACTION
    for outcome in outcomes:
        for name, record in outcome["variants"].items():
            durations = record.get("repetition_s") or []
            if not record.get("rejected") and durations and _median(durations) < floor:
                warnings.append(
                    f"{name}: process {outcome['process']}'s repetitions lasted {_median(durations) * 1e3:.3g} ms "
                    f"(median, {record['iterations_per_repetition']} iterations each), under "
                    f"{SHORT_REPETITION_FRACTION:g} of min_repetition_s ({settings['min_repetition_s']:g} s): "
                    "its samples are timer and scheduling noise; measure again on a quiet machine")
    return warnings


def measure(spec: dict, build: str | Callable[..., Any] = DEFAULT_BUILD, numerics: str | None = DEFAULT_NUMERICS,
            work_dir: Path | None = None, python: str = sys.executable, timeout_s: float | None = None,
            progress: Callable[[str], None] | None = None) -> dict:
    """Measure the variants of one workload (module docstring).

    Args:
        spec: ``workload`` (the workload's config slice, defaults filled from the config schema), ``variants``
            (name -> list of change ids), and optionally ``workload_name``, ``baseline`` (default ``fp32_eager``),
            ``device``, ``mode`` (``infer``), ``threads`` (``torch.set_num_threads`` in each process; None: torch's
            default), ``repetitions`` (in total, split over the processes), ``processes``, ``seed``,
            ``min_repetition_s`` (s), ``warmup`` (``minimum``, ``maximum``, ``window``, ``tolerance``:
            :func:`operator_profiler.capture.harness.warm_up_until_steady`), ``tolerances`` (numerics, per dtype;
            None: the numerics module's defaults), ``fault_threshold`` (faults per iteration), ``confidence``,
            ``resamples``, ``busy_remeasure`` (processes this measurement may run beyond ``processes`` to replace
            busy ones: :func:`busy_load`): :data:`DEFAULTS`.
        build: ``build(model, inputs, changes, device, mode=...) -> Variant`` or its ``"module:function"``.
        numerics: module with ``compare_outputs``, ``variant_dtype``, ``DEFAULT_TOLERANCES``; None: no check.
        work_dir: where specs, results and logs of the processes go (default: a new temporary folder, kept).
        timeout_s: the limit for each process (None: none).
        progress: called with one line per process started.

    Returns:
        ``{"workload", "device", "mode", "threads", "repetitions", "processes", "seed", "baseline",
        "min_repetition_s", "fault_threshold", "confidence", "resamples", "processes_info", "discarded_processes",
        "busy_remeasure", "variants", "warnings", "work_dir"}``. A process during whose repetitions other processes
        kept the CPUs busy (:func:`busy_load`) is run again as a new process, at most ``busy_remeasure`` times per
        measurement: the first quiet one is kept, else the least busy one (with a warning); the others are listed
        in ``discarded_processes`` (``process``, ``pid``, ``other_cpu_load``, ``usable_cpus``, ``threads``,
        ``spare``, ``replaced_by``: the process kept in its place, ``iterations_per_repetition``: its k per
        variant, which the later processes reuse when larger) and their samples are not used.
        ``processes_info`` per kept process ``process``, ``pid``, ``peak_rss_bytes`` (its resident set's
        high-water mark, ``getrusage`` ru_maxrss), ``torch``, ``other_cpu_load`` (CPUs other processes kept busy
        on average during its repetitions, from /proc/stat; null when unreadable or under 1 s), ``usable_cpus`` and
        ``wall_s`` (the process's wall time, s);
        per variant
        ``changes``, ``rejected`` (null or the reason), ``numerics`` (against FP32 eager), ``numerics_in_dtype``
        (a variant that changes the dtype and does more: against the eager model in that dtype, at the tight bound of
        ``numerics.in_dtype_limits``; null otherwise), ``checks``, ``rewrites`` and, unless rejected,
        ``samples_ms`` (each repetition's time per iteration, ms), ``repetitions``, ``processes`` (the processes
        its samples come from), ``iterations_per_repetition``
        (k per process), ``median_repetition_s`` (per process, the median repetition's wall time, s),
        ``seconds`` (per process ``{"build", "warmup", "repetitions"}``: s spent building and compiling it, warming
        it up and checking its numerics, and in its repetitions),
        ``median_ms``, ``ci_ms`` ([low, high] of the median), ``faults_per_iteration``
        (``minor``, ``major``, ``total`` medians over repetitions, ``per_process`` medians of the total),
        ``warmup`` (per process), ``rss_after_warmup_bytes`` (per process: the resident set after this variant's
        warm-up, with every variant built before it) and ``speedup`` (``vs``, ``value`` = median(baseline)/median(variant), ``ci``,
        ``shows_gain`` = ci low > 1; null when either is rejected).

    Raises:
        ConfigError: a bad spec (no variants, unknown baseline, fewer repetitions than processes).
        WorkloadError: a worker process failed; the message names the variant and the process's log.
    """
    settings = _settings(spec)
    settings["build"] = callable_path(build)
    settings["numerics"] = numerics
    check_importable(settings["build"], numerics)
    work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="opprof-timing-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[dict] = []
    discarded: list[dict] = []
    calibrated: dict[str, int] = {}
    next_index = 0

    def run(index: int, process_spec: dict) -> dict:
        return _run_process(index, process_spec, work_dir, python, timeout_s)

    for slot, repetitions in enumerate(_split(settings["repetitions"], settings["processes"])):
        allowed = int(settings["busy_remeasure"]) - len(discarded)
        outcome, thrown = _slot(settings, slot, repetitions, calibrated, next_index, max(0, allowed), run, progress)
        next_index += 1 + len(thrown)
        discarded += thrown
        # the next processes reuse the largest k seen so far per variant (discarded busy processes' included)
        calibrated = _largest_k([{"variants": {n: {"iterations_per_repetition": k} for n, k in calibrated.items()}},
                                 outcome, *({"variants": {n: {"iterations_per_repetition": k} for n, k in
                                                          d["iterations_per_repetition"].items()}} for d in thrown)])
        outcomes.append(outcome)
    merged = _merge(settings, outcomes)
    warnings = merged["warnings"] + short_repetition_warnings(settings, outcomes) + [
        f"process {d['process']}: other processes kept {d['other_cpu_load']:.1f} CPUs busy on average during the "
        f"repetitions ({d['spare']} spare beside its {d['threads']} thread(s)): discarded, its samples "
        f"unused (process {d['replaced_by']} kept in its place)" for d in discarded]
    warnings += [w + f" (kept: the {settings['busy_remeasure']} re-measurement(s) allowed (busy_remeasure) were spent "
                 "without a quiet process)" for w in busy_machine_warnings(outcomes)]
    if settings["repetitions"] < MIN_REPETITIONS or settings["processes"] < MIN_PROCESSES:
        warnings.insert(0, f"{settings['repetitions']} repetitions over {settings['processes']} process(es): below "
                           f"the {MIN_REPETITIONS} over {MIN_PROCESSES} a fair comparison needs; an indication only")
    return {"workload": settings["workload_name"], "device": outcomes[0]["device"], "mode": settings["mode"],
            "threads": outcomes[0]["threads"], "repetitions": settings["repetitions"],
            "processes": settings["processes"], "seed": settings["seed"], "baseline": settings["baseline"],
            "min_repetition_s": settings["min_repetition_s"], "fault_threshold": settings["fault_threshold"],
            "confidence": settings["confidence"], "resamples": settings["resamples"],
            "processes_info": [{k: o.get(k) for k in ("process", "pid", "peak_rss_bytes", "torch", "other_cpu_load",
                                                      "usable_cpus", "wall_s")} for o in outcomes],
            "discarded_processes": discarded, "busy_remeasure": int(settings["busy_remeasure"]),
            "variants": merged["variants"], "warnings": warnings, "work_dir": str(work_dir)}
