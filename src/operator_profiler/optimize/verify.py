"""The verify_variants job: the advised variant's ablation measured on the device (optimize.timing: interleaved
wall time, >= 20 repetitions over >= 2 processes, page faults, numerics against FP32 eager), decided
(optimize.ablation) and written to ``optimize/verification.json`` (fields: docs/optimize.md, "Verification")."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from ..files import read_json_file, write_json
from . import ablation, stats, timing
from ..errors import WorkloadError
from ..transforms.vocabulary import MODES



def tolerances(configured: dict | None) -> dict:
    """The numerics tolerances per dtype: the defaults (optimize.numerics) with the config's keys over them."""
    from .numerics import DEFAULT_TOLERANCES

    merged = {dtype: dict(values) for dtype, values in DEFAULT_TOLERANCES.items()}
    for dtype, values in (configured or {}).items():
        merged.setdefault(dtype, {}).update(values)
    return merged


#: Seconds a workload's verification may spend measuring borderline decisions again (config
#: ``optimize.decision_budget_s``): a round starts only when the rounds so far plus its estimate (what the variants
#: it measures cost in their last measurement: :func:`variant_costs`) fit in it; 0 measures nothing again.
DECISION_BUDGET_S = 120.0
#: Extra rounds at most, whatever the budget (a fast workload's rounds take seconds).
MAX_ROUNDS = 8


def _refresh(result: dict, name: str, extra: dict) -> None:
    """Pool the samples of ``extra`` (the same variant measured in new processes) into variant ``name`` of a timing
    result: its repetitions, processes, k per process, median and interval again."""
    entry = result["variants"][name]
    entry["samples_ms"] = list(entry["samples_ms"]) + list(extra["samples_ms"])
    entry["repetitions"] = len(entry["samples_ms"])
    entry["processes"] = (entry.get("processes") or len(entry.get("iterations_per_repetition") or [])) + (
        extra.get("processes") or len(extra.get("iterations_per_repetition") or []))
    entry["iterations_per_repetition"] = list(entry.get("iterations_per_repetition") or []) + list(
        extra.get("iterations_per_repetition") or [])
    interval = stats.median_interval(entry["samples_ms"], result.get("confidence", stats.CONFIDENCE),
                                     result.get("resamples", stats.RESAMPLES), result.get("seed", 0))
    entry["median_ms"], entry["ci_ms"] = interval["median"], [interval["low"], interval["high"]]


def _speedups(result: dict) -> None:
    base = result["variants"].get(result.get("baseline") or "fp32_eager")
    if base is None or base.get("rejected"):
        return
    for entry in result["variants"].values():
        if entry.get("rejected"):
            continue
        ratio = stats.speedup_interval(base["samples_ms"], entry["samples_ms"],
                                       result.get("confidence", stats.CONFIDENCE),
                                       result.get("resamples", stats.RESAMPLES), result.get("seed", 0))
        entry["speedup"] = {**(entry.get("speedup") or {}), "value": ratio["speedup"],
                            "ci": [ratio["low"], ratio["high"]], "shows_gain": ratio["shows_gain"]}


def variant_costs(measured: dict) -> tuple[dict[str, float], float | None]:
    """What one more process of each variant of a timing result (:func:`timing.measure`) would cost, from what its
    processes recorded: per variant the mean over its processes of the seconds the worker spent building and
    compiling it, warming it up (numerics included) and in its repetitions (``seconds``), and the seconds a process
    spends besides its variants (``processes_info`` ``wall_s`` less every variant's seconds in it: starting,
    importing torch, building the workload, the rejected variants), their mean; None when not recorded. Variants
    that recorded no ``seconds`` are left out."""
    costs: dict[str, float] = {}
    per_process: dict[int, float] = {}
    for name, entry in (measured.get("variants") or {}).items():
        seconds = [s for s in entry.get("seconds") or [] if s]
        if entry.get("rejected") or not seconds:
            continue
        totals = [sum(s.get(k) or 0.0 for k in ("build", "warmup", "repetitions")) for s in seconds]
        costs[name] = sum(totals) / len(totals)
        for i, total in enumerate(totals):
            per_process[i] = per_process.get(i, 0.0) + total
    walls = [(i, info.get("wall_s")) for i, info in enumerate(measured.get("processes_info") or [])]
    overhead = [max(0.0, wall - per_process.get(i, 0.0)) for i, wall in walls if wall is not None]
    return costs, (sum(overhead) / len(overhead) if overhead else None)


def measure_more(spec: dict, result: dict, pending: Callable[[dict], dict[str, list[str]]], work_dir: Path,
                 budget_s: float = DECISION_BUDGET_S, progress: Callable[[str], None] | None = None,
                 label: str = "refine", max_rounds: int = MAX_ROUNDS, clock: Callable[[], float] = time.monotonic,
                 seconds_per_variant: float | None = None, **measure_kwargs) -> dict:
    """Measure the variants of undecided comparisons again, one round after another, until none is left, the
    budget is spent or ``max_rounds`` rounds ran.

    ``pending(result)`` gives the undecided comparisons (key -> the two variant names, e.g.
    :func:`operator_profiler.optimize.ablation.borderline`). Each round measures only the variants they compare
    (:func:`timing.measure` with ``spec``'s processes and repetitions, in ``work_dir/<label>N``: new processes, one
    after another, busy ones measured again there) and pools the new repetitions into ``result`` (medians,
    intervals and speedups again; page faults stay the first measurement's). A round starts only when the rounds
    so far plus its estimate fit in ``budget_s`` (s, wall time; 0: none): the estimate is what its variants
    cost in the latest measurement of each (:func:`variant_costs`: the worker's seconds per variant for building,
    warming up and its repetitions, plus a process's own start), times the processes of ``spec``; where a variant
    recorded no seconds, its variants times the seconds per variant of the last round, or of
    ``seconds_per_variant`` (the measurement before, s) for the first (none given: 0, the first round starts
    whenever the budget is above 0). An estimate can be short (a busy process measured again), so a round may
    still end past the budget. ``measure_kwargs`` go to
    :func:`timing.measure` (build, numerics).

    Appends one record per round to ``result["refined"]`` (``round``, ``of`` = ``label``, ``decisions`` (the keys
    it was run for), ``variants``, ``estimate_s``, ``seconds``, ``repetitions`` and ``processes`` per variant
    measured, ``discarded_processes``) and returns ``result["measure_more"]``: ``{"budget_s", "spent_s", "rounds",
    "max_rounds", "stopped", "undecided", "next_estimate_s"}`` (``stopped``: ``decided``, ``budget``, ``rounds``
    or ``rejected`` (a compared variant was rejected when measured again); ``undecided``: the keys still pending;
    ``next_estimate_s``: the estimate of the round that did not fit, when the budget stopped it, else null).

    Raises:
        ConfigError: a negative budget.
        WorkloadError: a worker process failed (:func:`timing.measure`).
    """
    from ..errors import ConfigError

    if budget_s < 0:
        raise ConfigError(f"the decision budget must be 0 s or more, got {budget_s}")
    rounds = result.setdefault("refined", [])
    started, spent, ran, stopped = clock(), 0.0, 0, "decided"
    per_variant, estimate = seconds_per_variant or 0.0, None
    costs, overhead = variant_costs(result)
    processes = int(spec.get("processes") or timing.DEFAULTS["processes"])
    todo = pending(result)
    while todo:
        names = sorted({name for pair in todo.values() for name in pair})
        if all(name in costs for name in names):  # what these variants cost, not the measurement's average
            estimate = processes * ((overhead or 0.0) + sum(costs[name] for name in names))
        else:
            estimate = per_variant * len(names)
        if spent >= budget_s or spent + estimate > budget_s:
            stopped = "budget"
            break
        if ran >= max_rounds:
            stopped = "rounds"
            break
        variants = {name: result["variants"][name]["changes"] for name in names}
        ran += 1
        if progress:
            progress(f"undecided: {', '.join(sorted(todo))}: measuring {', '.join(names)} again (round {ran}, "
                     f"{spent:.0f} of {budget_s:g} s spent)")
        round_started = clock()
        base = {k: v for k, v in spec.items() if k != "baseline"}  # the baseline may not be among them
        extra = timing.measure({**base, "variants": variants}, work_dir=Path(work_dir) / f"{label}{ran}",
                               **measure_kwargs)
        pooled = [name for name, entry in extra["variants"].items()
                  if not entry.get("rejected") and entry.get("samples_ms")]
        for name in pooled:
            _refresh(result, name, extra["variants"][name])
        _speedups(result)
        result["warnings"] = list(result.get("warnings", [])) + list(extra.get("warnings", []))
        spent = clock() - started
        rounds.append({"round": ran, "of": label, "decisions": sorted(todo), "variants": names,
                       "estimate_s": round(estimate, 3), "seconds": round(clock() - round_started, 3),
                       "repetitions": {n: extra["variants"][n].get("repetitions") for n in pooled},
                       "processes": {n: extra["variants"][n].get("processes") for n in pooled},
                       "discarded_processes": list(extra.get("discarded_processes") or [])})
        per_variant = (clock() - round_started) / len(names)
        extra_costs, extra_overhead = variant_costs(extra)
        costs.update(extra_costs)
        overhead = extra_overhead if extra_overhead is not None else overhead
        if len(pooled) < len(names):
            stopped = "rejected"
            todo = pending(result)
            break
        todo = pending(result)
    result["measure_more"] = {"budget_s": budget_s, "spent_s": round(spent, 3), "rounds": ran,
                              "max_rounds": max_rounds, "stopped": stopped if todo else "decided",
                              "undecided": sorted(todo),
                              "next_estimate_s": round(estimate, 3) if todo and stopped == "budget" else None}
    return result["measure_more"]


def refine_borderline(spec: dict, result: dict, advised: list[str], work_dir: Path,
                      budget_s: float = DECISION_BUDGET_S, progress: Callable[[str], None] | None = None,
                      **kwargs) -> list[dict]:
    """Measure the ablation's undecided decisions again (:func:`measure_more` with
    :func:`operator_profiler.optimize.ablation.borderline`): a leave-one-out credit (or a prefix step) whose
    interval reaches 1 while its median is a gain, and a guard whose median says the recommendation is slower
    while its interval reaches 1. Each round measures only the two variants of each such comparison. A change
    still undecided when the budget is spent is kept and called undecided (its median is a gain: it is never
    dropped silently), and its reason says so. Returns ``result["refined"]`` (one record per round)."""
    measure_more(spec, result, lambda current: ablation.borderline(ablation.decide(current, advised)), work_dir,
                 budget_s, progress, **kwargs)
    return result["refined"]


def _busy(timed: dict | None) -> bool:
    """Whether other processes kept more CPUs busy than the spare ones beside the threads (plus the margin) in
    any process of a timing result (:func:`timing.busy_load`, the rule the measurement itself applies)."""
    threads = (timed or {}).get("threads") or 1
    return any(timing.busy_load({**info, "threads": threads}) is not None
               for info in (timed or {}).get("processes_info") or [])


def thread_scaling(one: dict | None, many: dict | None, threads: int, confidence: float = stats.CONFIDENCE,
                   resamples: int = stats.RESAMPLES, seed: int = 0, busy: bool = False) -> dict:
    """How FP32 eager scales from 1 thread to ``threads``: ``one`` and ``many`` are its timing entries at 1 and at
    ``threads`` threads (``samples_ms``). Returns verification.json's ``thread_scaling``: ``threads``,
    ``one_thread_ms``/``threads_ms`` (medians), ``speedup`` (median at 1 / median at ``threads``) with its ``ci``,
    ``per_thread`` (speedup / threads), ``verdict`` (``scales``: the interval lies above 1; ``single_thread``: the
    interval reaches 1 or lies below it, so the model is too small to use more than one thread; ``one_thread``: only
    one thread was used; ``unknown``: a side was rejected), ``busy`` (other processes kept CPUs busy while either
    side was timed: ``text`` then says the verdict needs a quiet machine) and ``text``, the sentence the optimize
    page shows."""
    if threads <= 1:
        return {"threads": threads, "verdict": "one_thread",
                "text": "measured with 1 thread (harness.threads or the usable CPUs): no scaling to compare"}
    if not one or not many or one.get("rejected") or many.get("rejected") or not one.get("samples_ms") \
            or not many.get("samples_ms"):
        return {"threads": threads, "verdict": "unknown",
                "text": f"FP32 eager could not be timed at 1 and at {threads} threads: its thread scaling is unknown"}
    ratio = stats.speedup_interval(one["samples_ms"], many["samples_ms"], confidence, resamples, seed)
    speedup, low, high = ratio["speedup"], ratio["low"], ratio["high"]
    record = {"threads": threads, "one_thread_ms": one.get("median_ms"), "threads_ms": many.get("median_ms"),
              "speedup": speedup, "ci": [low, high], "per_thread": speedup / threads, "busy": busy}
    figures = (f"FP32 eager took {one.get('median_ms'):.3g} ms per iteration at 1 thread and "
               f"{many.get('median_ms'):.3g} ms at {threads} (speedup {speedup:.3g}x, {confidence:.0%} CI "
               f"{low:.3g}-{high:.3g})")
    if ratio["shows_gain"]:
        record.update(verdict="scales", text=f"{figures}: the model uses the {threads} threads "
                                             f"({speedup / threads:.0%} of a linear speedup)")
    else:
        slower = f", and is slower with {threads}" if high < 1 else ""
        record.update(verdict="single_thread", text=(
            f"{figures}: the model is too small to use more than one thread{slower} (its operators' work does not "
            "pay for the threads' start and join at every operator); run it with torch.set_num_threads(1) and use "
            "the other cores for other requests (one process per core), or set harness.threads: 1"))
    if busy:
        record["text"] += ("; other processes kept CPUs busy while it was timed, which slows the threaded run most "
                           "(its threads wait for a descheduled one at every operator): measure again on a quiet "
                           "machine before trusting this")
    return record


def verify(workload_name: str, workload: dict, optimize: dict, device: str, advice: dict, work_dir: Path,
           threads: int | None = None, features: dict | None = None, threads_source: str | None = None,
           progress=None) -> dict:
    """Measure the ablation of ``advice``'s advised changes against the baselines; returns the verification
    record (optimize.ablation.verification) with the advice's evidence per change beside it.

    ``workload``: the workload's config slice (its own compile setting and changes are what the variants
    replace: every variant is built from the eager FP32 model with its own change list). When the recommended
    variant (the kept changes) is not one of the measured change sets, it is measured in a second round with
    FP32 eager, the full advised set and the strong baseline, and recommended only when neither of them is faster
    (optimize.ablation.recommend), so its figures are never quoted unmeasured.

    ``threads``: every timing process's torch threads (None: torch's default); with more than one on CPU, FP32
    eager is also timed at 1 thread (its own round, after the ablation's) and :func:`thread_scaling` says whether
    the model uses the threads (on CUDA: ``verdict`` ``not_measured``). ``threads_source`` says where the count came from (``harness.threads``, ``usable CPUs``).
    ``progress``: called with one line per timing process started.

    Borderline decisions are measured more (:func:`refine_borderline`, then the second round's guards with
    :func:`measure_more`) within ``optimize["decision_budget_s"]`` (s, default :data:`DECISION_BUDGET_S`) in
    all; the record's ``refined`` lists the extra rounds and ``measure_more`` the budget's use.

    Raises:
        ConfigError: a negative decision budget.
        WorkloadError: a worker process failed (:func:`timing.measure`); the advice was made with int8 forced
            (OPPROF_FORCE_INT8) and the verification runs without, or the other way round."""
    from ..transforms.vocabulary import FORCE_INT8_ENV, machine_features

    features = features or machine_features(device)
    advised_on = (advice.get("machine_features") or {}).get("native_int8_source")
    if advised_on is not None and features.get("native_int8_source") is not None and \
            advised_on.startswith("forced") != features["native_int8_source"].startswith("forced"):
        # OPPROF_FORCE_INT8 set for one and not the other: what the advice offers is not what would be measured
        raise WorkloadError(f"{workload_name}: the advice was made with int8 {advised_on!r}, the verification "
                            f"runs with {features['native_int8_source']!r}: advise again with {FORCE_INT8_ENV} as "
                            "it is now (snakemake --forcerun advise, or delete advice.json)")
    mode = MODES.get(workload.get("mode", "inference"), "infer")
    advised = list(advice["advised_changes"])
    # The model as FP32 eager builds it: the variants carry their own compile settings (whole-model
    # torch.compile through transforms.changes; a workload's compile_scope/compile_mode/compile_options are the
    # profile's, not the measurement's).
    base = {k: v for k, v in workload.items()
            if k not in ("changes", "compile_scope", "compile_mode", "compile_options")}
    base["compile"] = False
    spec = {"workload": base, "workload_name": workload_name, "device": device, "mode": mode, "threads": threads,
            "repetitions": optimize["repetitions"], "processes": optimize["processes"],
            "tolerances": tolerances(optimize.get("tolerances"))}
    baselines = ablation.default_baselines(bool(features.get("native_bf16")), mode)
    variants = ablation.plan(advised, baselines)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    result = timing.measure({**spec, "variants": variants}, work_dir=work_dir / "round1", progress=progress)
    budget = float(optimize.get("decision_budget_s", DECISION_BUDGET_S))
    refine_borderline(spec, result, advised, work_dir, budget, progress=progress,
                      seconds_per_variant=(time.monotonic() - started) / max(1, len(variants)))
    record = ablation.verification(result, advised)
    record["load"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2),
                      "cpus": os.cpu_count()}
    busy = max(load_before, os.getloadavg()[0])
    spare = (os.cpu_count() or 1) - (threads or os.cpu_count() or 1)
    if busy > spare + (threads or 1) + 0.5:
        record["warnings"].insert(0, (
            f"the machine was busy while the variants were timed (1-minute load {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after, {os.cpu_count()} CPUs, {threads or 'default'} threads per variant): "
            "other processes shared the cores, so the wall times and their intervals are not the model's; measure "
            "again on a quiet machine before trusting a speedup"))
    recommended = record["ablation"]["recommended"]
    if not recommended["measured"] and recommended["changes"]:
        # the kept changes as a whole (two or more dropped), measured beside FP32 eager, the full advised set (when
        # it verified) and strong_generic, so that neither can be faster than what is recommended
        again = {"fp32_eager": [], recommended["name"]: recommended["changes"]}
        full = ablation.closure(advised)
        if ablation._verified(result, full) is not None and frozenset(full) != frozenset(recommended["changes"]):
            again[ablation.variant_name(full)] = full
        if frozenset(baselines["strong_generic"]) not in {frozenset(c) for c in again.values()}:
            again["strong_generic"] = baselines["strong_generic"]
        started = time.monotonic()
        second = timing.measure({**spec, "variants": again}, work_dir=work_dir / "round2", progress=progress)
        second_s = time.monotonic() - started
        entry = second["variants"][recommended["name"]]
        trail = list(recommended.get("trail") or [])
        if trail and trail[-1].startswith("recommended "):
            trail[-1] = f"{recommended['name']} was measured in a second round with " + ", ".join(
                n for n in again if n != recommended["name"])

        def choose(current: dict) -> dict:
            return ablation.recommend(current, recommended["changes"], advised, recommended.get("required_by"),
                                      trail, final=True)

        # an undecided guard of the second round is measured more with what is left of the budget
        first_more = result["measure_more"]
        more = measure_more(spec, second, lambda current: ablation.borderline({"recommended": choose(current)}),
                            work_dir, max(0.0, budget - first_more["spent_s"]), label="round2-refine",
                            max_rounds=max(0, MAX_ROUNDS - first_more["rounds"]),
                            seconds_per_variant=second_s / max(1, len(again)), progress=progress)
        record["refined"] = record["refined"] + second["refined"]
        record["discarded_processes"] += [{**d, "measurement": "round2"}
                                          for d in second.get("discarded_processes") or []]
        record["discarded_processes"] += [{**d, "measurement": f"{r['of']}{r['round']}"} for r in second["refined"]
                                          for d in r.get("discarded_processes") or []]
        record["measure_more"] = {**first_more, "spent_s": round(first_more["spent_s"] + more["spent_s"], 3),
                                  "rounds": first_more["rounds"] + more["rounds"],
                                  "round2": more}
        chosen = choose(second)
        chosen.update(round=2, rejected=entry.get("rejected"))
        record["ablation"]["recommended"] = recommended = chosen
        record["round2"] = {name: {k: v.get(k) for k in ("changes", "rejected", "median_ms", "ci_ms", "speedup",
                                                         "faults_per_iteration", "numerics", "repetitions",
                                                         "processes")}
                            for name, v in second["variants"].items()}
        record["warnings"] = [w for w in record["warnings"] if "was not measured as a whole" not in w]
        if recommended.get("source") in ablation.REPLACING_SOURCES:
            record["warnings"].append(
                f"the recommendation is {recommended['name']} ({recommended['source']}) instead of "
                f"{ablation.variant_name(recommended['instead_of']['changes'])}: {recommended['reason']}")
        record["warnings"] += second.get("warnings", [])
    scaling_round = None
    if threads and threads > 1 and device == "cpu":
        scaling_round = timing.measure({**spec, "threads": 1, "variants": {"fp32_eager": []}},
                                       work_dir=work_dir / "one_thread", progress=progress)
        record["warnings"] += [f"1-thread round: {w}" for w in scaling_round.get("warnings", [])]
    record["threads_source"] = threads_source
    busy = _busy(result) or _busy(scaling_round)
    record["thread_scaling"] = thread_scaling(
        (scaling_round or {}).get("variants", {}).get("fp32_eager"), result["variants"].get("fp32_eager"),
        int(threads or result.get("threads") or 1), result.get("confidence", stats.CONFIDENCE),
        result.get("resamples", stats.RESAMPLES), result.get("seed", 0), busy=busy) if device == "cpu" else {
        "threads": threads, "verdict": "not_measured",
        "text": f"on {device} the operators run on the GPU: the CPU threads' scaling is not measured"}
    record["advice"] = {r["change"]: {"rule": r["rule"], "evidence": r["evidence"], "expect": r["expect"]}
                        for r in advice.get("advice", [])}
    record["sources"] = advice.get("sources", {})
    record["baselines"] = baselines
    record["machine_features"] = {k: v for k, v in features.items() if k != "cpu_flags"}
    return record


def verification_threads(configured: int | None) -> tuple[int, str]:
    """The verification's thread count and where it came from: ``harness.threads`` when set, else every usable CPU
    of this process (its affinity). Raises ConfigError for a count this machine cannot run (below 1, above the
    usable CPUs)."""
    from ..config import resolved_threads

    return resolved_threads(configured), "harness.threads" if configured else "usable CPUs"


def verify_variants_job(workload_name: str, workload_json: str, optimize_json: str, device: str, advice_path: str,
                        out_path: str, threads: int | None = None, progress=None,
                        threads_source: str | None = None) -> dict:
    """The rule's work (and ``opprof optimize``'s): read advice.json, measure with ``threads`` (harness.threads;
    None: every usable CPU, :func:`verification_threads`), write verification.json (atomically; the processes' specs
    and logs go beside it in ``timing/``; ``threads_source``: where a given count came from, default
    ``harness.threads``). Returns the record."""
    from ..capture.harness import resolve_device

    device = resolve_device(device)
    advice = read_json_file(Path(advice_path), "advice.json", "run the advise rule first")
    out = Path(out_path)
    count, source = verification_threads(threads)
    record = verify(workload_name, json.loads(workload_json), json.loads(optimize_json), device, advice,
                    out.parent / "timing", count, threads_source=(threads_source or source) if threads else source,
                    progress=progress)
    write_json(out, record)
    return record
