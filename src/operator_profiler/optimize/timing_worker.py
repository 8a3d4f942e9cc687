"""One timing process: ``python -m operator_profiler.optimize.timing_worker SPEC.json OUT.json``.

Builds the workload, the FP32 eager reference output and every variant of the spec (each from its own copy of
the model, so one variant's rewrites or prepacked weights never reach another), warms each up until steady,
checks its numerics, calibrates its iterations per repetition, then runs the repetitions interleaved: every
repetition runs each variant once, in an order shuffled per repetition with the process's seed. A repetition
is the wall time of k consecutive iterations (``time.perf_counter``, after a device synchronize on CUDA)
divided by k, with the minor and major page faults of those k iterations (``getrusage(RUSAGE_SELF)`` deltas)
divided by k. The spec and OUT.json are described in :mod:`operator_profiler.optimize.timing`.

A variant whose build or first warm-up call raises :class:`~operator_profiler.errors.WorkloadError` (an unmet
precondition, freezing not applied) or whose numerics fail is recorded as rejected with the reason; any other
exception ends the process with exit status 1 and OUT.json ``{"error", "variant", "phase", "traceback"}``.
Progress lines ``opprof.timing: variant NAME: PHASE`` go to stderr, so a log names the variant a crash hit.

The worker dies with its parent (:func:`die_with_parent`): a parent stopped by SIGTERM or SIGKILL (a benchmark
stopped by hand, a job cancelled) never leaves a worker running that would write into a later run's folder.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import math
import os
import random
import resource
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

PROGRESS_PREFIX = "opprof.timing: variant "
#: Repetitions shorter than this in all give no load figure (as before the captures measured theirs: 1 s).
MIN_LOAD_WINDOW_S = 1.0
#: The environment variable through which the parent passes its pid (:func:`die_with_parent`).
PARENT_ENV = "OPPROF_TIMING_PARENT"
#: How often the portable fallback of :func:`die_with_parent` looks at the parent (s).
PARENT_POLL_S = 0.5


def _say(variant: str, phase: str) -> None:
    print(f"{PROGRESS_PREFIX}{variant}: {phase}", file=sys.stderr, flush=True)


def _parent_gone(parent: int | None) -> bool:
    """Whether the process that started this one has ended (this process was re-parented: ``getppid`` is no
    longer ``parent``); False when the parent is not known."""
    return parent is not None and os.getppid() != parent


def die_with_parent(parent: int | None) -> str:
    """End this process when its parent ends, however the parent ends (SIGTERM, SIGKILL, a crash).

    On Linux the kernel sends SIGKILL when the parent's thread that started this process exits (``prctl``
    ``PR_SET_PDEATHSIG``, via ctypes); elsewhere (or where prctl fails) a daemon thread checks ``getppid`` every
    :data:`PARENT_POLL_S` s and ends the process at once when it changed. ``parent``: the parent's pid as it gave
    it (:data:`PARENT_ENV`); a parent that ended before the death signal was set (a race prctl cannot see) ends
    this process here, with exit status 3. Returns the mechanism used: ``"prctl"``, ``"poll"``, or ``"none"``
    (no parent given and no prctl: nothing watches)."""
    if _parent_gone(parent):
        print("opprof.timing: the parent process ended before this worker started; exiting", file=sys.stderr,
              flush=True)
        os._exit(3)
    mechanism = "none"
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL)) == 0:  # PR_SET_PDEATHSIG
                mechanism = "prctl"
        except (OSError, AttributeError):
            pass
    if mechanism == "prctl":
        if _parent_gone(parent):  # it ended between the check above and prctl: no signal will come
            os._exit(3)
        return mechanism
    if parent is None:
        return mechanism

    def watch() -> None:
        while not _parent_gone(parent):
            time.sleep(PARENT_POLL_S)
        os._exit(3)

    threading.Thread(target=watch, name="opprof-parent-watch", daemon=True).start()
    return "poll"


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the callable.

    Raises:
        ValueError: malformed ``spec``, or no such callable (the parent checks this before starting a process).
        ImportError: the module cannot be imported.
    """
    import importlib

    module_name, _, attr = spec.partition(":")
    target = importlib.import_module(module_name) if module_name and attr else None
    for part in attr.split(".") if target is not None else ():
        target = getattr(target, part, None)
    if not callable(target):
        raise ValueError(f"{what} {spec!r} is not a callable 'package.module:function'")
    return target


def _jsonable(value: Any) -> Any:
    """A JSON-able copy of a variant's ``checks``/``rewrites`` (dataclasses and objects by their fields)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "_asdict"):
        return _jsonable(value._asdict())
    return str(value)


def _numerics_record(result: Any) -> dict:
    """``NumericsResult`` -> ``{"max_abs", "max_rel", "cosine", "ok", "reason", "dtype"}``, with
    ``top1_agreement``, ``top1_positions`` and ``min_top1_agreement`` when the result has them (logits)."""
    record = {field: _jsonable(getattr(result, field, None))
              for field in ("max_abs", "max_rel", "cosine", "ok", "reason", "dtype")}
    if getattr(result, "top1_agreement", None) is not None:
        record.update({field: _jsonable(getattr(result, field)) for field in
                       ("top1_agreement", "top1_positions", "min_top1_agreement")})
    return record


def _process_settings() -> dict:
    """Process-wide switches a variant's build could leave set (they would then apply to every variant timed
    after it in this process): TF32 for matmul and cuDNN, the float32 matmul precision, Inductor freezing."""
    import torch

    settings = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
                "float32_matmul_precision": torch.get_float32_matmul_precision()}
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        settings["inductor.freezing"] = inductor.freezing
    return settings


def _faults() -> tuple[int, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_majflt


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux (bytes on macOS); getrusage(2)
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def _rss_bytes() -> int | None:
    """The resident set size now (``/proc/self/statm`` field 2, in pages; proc(5)); None where unreadable."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _eager_in_dtype(build: Callable[..., Any], model: Any, inputs: tuple, key: tuple[str, ...], device: str,
                    mode: str, reference: Any, numerics: Any, dtype: str, tolerances: dict | None,
                    sync: Callable[[], None]) -> dict:
    """The eager model in the dtype the changes ``key`` set (built with those changes only, from its own copy of
    the model), run once: ``{"changes", "output", "vs_fp32" (its NumericsResult against FP32 eager), "error"}``;
    ``error`` the reason when it cannot be built (then no variant of that dtype can be judged in it)."""
    from ..errors import WorkloadError

    _say("+".join(key), "building the eager reference in its dtype")
    try:
        eager = build(copy.deepcopy(model), inputs, list(key), device, mode=mode)
        output = eager.run()
        sync()
    except WorkloadError as exc:
        return {"changes": list(key), "output": None, "vs_fp32": None, "error": f"build: {exc}"}
    del eager
    return {"changes": list(key), "output": output, "error": None,
            "vs_fp32": numerics.compare_outputs(reference, output, dtype, tolerances)}


def _check_in_dtype(numerics: Any, record: dict, changes: list[str], dtype: str, output: Any,
                    cache: dict, make: Callable[[tuple[str, ...]], dict], tolerances: dict | None) -> str | None:
    """A variant that changes the dtype and does more checked against the eager model in its dtype
    (``numerics.compare_in_dtype``; numerics modules without it skip the check): ``record["numerics_in_dtype"]``
    gets ``{"against", "max_abs", "max_rel", "cosine", "ok", "reason", "dtype", "eager_vs_fp32", "limits"}``.
    Returns the rejection (``numerics: against eager ...``) or None."""
    if not hasattr(numerics, "dtype_changes") or not hasattr(numerics, "compare_in_dtype"):
        return None
    key = tuple(numerics.dtype_changes(list(changes)))
    if not key or set(key) == set(changes):  # float32, or the eager model in the dtype itself
        return None
    if key not in cache:
        cache[key] = make(key)
    eager = cache[key]
    against = f"eager {dtype} ({' + '.join(key)}, no other change)"
    if eager["error"] is not None:
        record["numerics_in_dtype"] = {"against": against, "ok": False, "reason": eager["error"]}
        return f"numerics: against {against}: cannot be judged, its {eager['error']}"
    try:
        check = numerics.compare_in_dtype(eager["output"], output, dtype, eager["vs_fp32"], tolerances)
        limits = numerics.in_dtype_limits(eager["vs_fp32"], dtype, tolerances)
    except ValueError as exc:
        record["numerics_in_dtype"] = {"against": against, "ok": False, "reason": str(exc)}
        return f"numerics: against {against}: {exc}"
    record["numerics_in_dtype"] = {"against": against, **_numerics_record(check),
                                   "eager_vs_fp32": _numerics_record(eager["vs_fp32"]), "limits": limits}
    return None if check.ok else f"numerics: against {against}: {check.reason}"


def calibrate(times_s: list[float], window: int, min_repetition_s: float, given: int | None = None) -> dict:
    """Iterations per repetition (k) so that a repetition lasts at least ``min_repetition_s``, from the warm-up's
    iteration times: the fastest of the last ``window`` (another process's load only ever slows an iteration, so
    the fastest is the least disturbed; their median, under load, was inflated 100-fold and gave k = 3 for a
    0.2 ms model: 1 ms repetitions). ``given`` (the k of an earlier process) is kept unless it is smaller than
    this process's own k, i.e. would make a repetition shorter than the minimum here: then this process's k is used.

    Returns ``{"k", "own", "given", "per_iteration_s"}``."""
    last = [t for t in times_s[-window:] if t > 0]
    fastest = min(last) if last else 0.0
    own = max(1, math.ceil(min_repetition_s / max(fastest, 1e-9)))
    k = max(int(given), own) if given else own
    return {"k": k, "own": own, "given": int(given) if given else None, "per_iteration_s": fastest}


def run(spec: dict, state: dict) -> dict:
    """Measure the spec's variants in this process (module docstring); ``state`` tracks the variant and phase
    for the error record. Returns OUT.json's content."""
    import torch

    from ..capture import harness, workloads
    from ..errors import WorkloadError

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    device = harness.resolve_device(spec.get("device", "cpu"))
    mode = spec.get("mode", "infer")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    build = load_callable(spec["build"], "build")
    numerics = None
    if spec.get("numerics"):
        import importlib

        numerics = importlib.import_module(spec["numerics"])
    tolerances = spec.get("tolerances") or (getattr(numerics, "DEFAULT_TOLERANCES", None) if numerics else None)
    warm = spec["warmup"]

    state["phase"] = "building the workload"
    random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])  # the same weights and inputs in every process
    model, inputs = workloads.build_workload(spec["workload"], torch.device(device))
    model.train(mode != "infer")
    grad = contextlib.nullcontext() if mode != "infer" else torch.no_grad()
    with grad:
        reference = model(*inputs) if numerics is not None else None
    # logits (an LM or classification head) are also judged by their top-1 agreement with the reference
    logits = {"logits": True} if numerics is not None and hasattr(numerics, "output_is_logits") and \
        numerics.output_is_logits(spec["workload"], reference) else {}

    variants: dict[str, Any] = {}
    records: dict[str, dict] = {}
    in_dtype: dict[tuple[str, ...], dict] = {}  # dtype changes -> the eager model's output in that dtype
    given_k = spec.get("iterations_per_repetition") or {}
    for name, changes in spec["variants"].items():
        state["variant"] = name
        record = records[name] = {"changes": list(changes), "rejected": None}
        settings_before = _process_settings()
        variant_started = time.perf_counter()
        try:
            state["phase"] = "building"
            _say(name, "building")
            with grad:
                variant = build(copy.deepcopy(model), inputs, list(changes), device, mode=mode)
                if hasattr(variant, "warm_up"):
                    state["phase"] = "first warm-up"
                    _say(name, "first warm-up (compiles here)")
                    variant.warm_up(1)
        except WorkloadError as exc:
            record["rejected"] = f"build: {exc}"
            _say(name, f"rejected ({exc})")
            continue
        build_s = time.perf_counter() - variant_started
        changed = {k: [settings_before.get(k), v] for k, v in _process_settings().items()
                   if settings_before.get(k, v) != v}
        if changed:  # the parent warns: the variants timed after it in this process ran with these switches
            record["process_settings_changed"] = changed

        def timed_step(variant=variant) -> float:
            sync()
            start = time.perf_counter()
            variant.run()
            sync()
            return time.perf_counter() - start

        state["phase"] = "warm-up"
        _say(name, "warm-up until steady")
        with grad:
            warmup = harness.warm_up_until_steady(timed_step, warm["minimum"], warm["maximum"], warm["window"],
                                                  warm["tolerance"])
            if numerics is not None:
                state["phase"] = "numerics"
                output = variant.run()
                sync()
                dtype = numerics.variant_dtype(list(changes))
                check = numerics.compare_outputs(reference, output, dtype, tolerances, **logits)
                record["numerics"] = _numerics_record(check)
                if record["numerics"]["ok"]:
                    rejected = _check_in_dtype(
                        numerics, record, changes, dtype, output, cache=in_dtype, tolerances=tolerances,
                        make=lambda key: _eager_in_dtype(build, model, inputs, key, device, mode, reference,
                                                         numerics, dtype, tolerances, sync))
                else:
                    rejected = f"numerics: {record['numerics']['reason']}"
                del output
                if rejected:
                    record["rejected"] = rejected
                    _say(name, f"rejected ({record['rejected']})")
                    del variant
                    gc.collect()
                    continue
        record["checks"] = _jsonable(getattr(variant, "checks", None))  # filled by its first runs
        record["rewrites"] = _jsonable(getattr(variant, "rewrites", None))
        times = warmup.pop("times_s")
        warmup["last_s"] = times[-1] if times else None
        record["warmup"] = warmup
        record["rss_after_warmup_bytes"] = _rss_bytes()  # every variant built so far is resident too
        record["peak_rss_after_warmup_bytes"] = _peak_rss_bytes()
        calibration = calibrate(times, warm["window"], spec["min_repetition_s"], given_k.get(name))
        k = calibration["k"]
        record.update(iterations_per_repetition=k, calibration=calibration, samples_ms=[], minor_faults=[],
                      major_faults=[], repetition_s=[],
                      seconds={"build": round(build_s, 6),
                               "warmup": round(time.perf_counter() - variant_started - build_s, 6)})
        variants[name] = variant

    state["phase"] = "interleaved repetitions"
    from ..capture import machine

    load_start = machine.load_window_start()
    rng = random.Random(spec["seed"] * 1009 + spec.get("process", 0))
    order = list(variants)
    with grad:
        for _ in range(spec["repetitions"]):
            rng.shuffle(order)
            for name in order:
                state["variant"] = name
                variant, record = variants[name], records[name]
                k = record["iterations_per_repetition"]
                gc.collect()
                gc.disable()  # a collection inside the window would be charged to whichever variant hit it
                try:
                    sync()
                    minor0, major0 = _faults()
                    start = time.perf_counter()
                    for _ in range(k):
                        variant.run()
                    sync()
                    elapsed = time.perf_counter() - start
                    minor1, major1 = _faults()
                finally:
                    gc.enable()
                record["samples_ms"].append(elapsed / k * 1e3)
                record["repetition_s"].append(elapsed)
                record["minor_faults"].append((minor1 - minor0) / k)
                record["major_faults"].append((major1 - major0) / k)
    state["variant"] = None
    for record in records.values():
        if "repetition_s" in record:
            record["seconds"]["repetitions"] = round(sum(record["repetition_s"]), 6)
    # CPUs other processes kept busy on average during the repetitions (/proc/stat less this process and its parent)
    load = machine.other_cpu_load(load_start, torch.get_num_threads(), min_window_s=MIN_LOAD_WINDOW_S)
    return {"process": spec.get("process", 0), "pid": os.getpid(), "device": device,
            "other_cpu_load": load["other_cpu_load"], "usable_cpus": load["usable_cpus"],
            "threads": torch.get_num_threads(), "torch": torch.__version__, "peak_rss_bytes": _peak_rss_bytes(),
            "variants": records}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m operator_profiler.optimize.timing_worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec_path, out_path = Path(args[0]), Path(args[1])
    parent = int(os.environ[PARENT_ENV]) if os.environ.get(PARENT_ENV, "").isdigit() else None
    watched = die_with_parent(parent)
    print(f"opprof.timing: worker pid {os.getpid()}, parent {parent} (dies with it: {watched})", file=sys.stderr,
          flush=True)
    state: dict = {"variant": None, "phase": "reading the spec"}
    try:
        outcome = run(json.loads(spec_path.read_text()), state)
        status = 0
    except Exception as exc:  # the parent reports it with the variant and this process's log
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        outcome = {"error": f"{type(exc).__name__}: {exc}", "variant": state["variant"], "phase": state["phase"],
                   "traceback": text}
        status = 1
    if _parent_gone(parent):  # nobody reads it, and the folder may already be a later run's
        return 3
    tmp = out_path.with_name(out_path.name + ".partial")
    tmp.write_text(json.dumps(outcome) + "\n")
    os.replace(tmp, out_path)
    return status


if __name__ == "__main__":
    sys.exit(main())
