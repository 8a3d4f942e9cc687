"""The verify_variants job: the advised variant's ablation measured on the device (optimize.timing: interleaved
wall time, >= 20 repetitions over >= 2 processes, page faults, numerics against FP32 eager), decided
(optimize.ablation) and written to ``optimize/verification.json`` (fields: docs/optimize.md, "Verification")."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..files import read_json_file, write_json
from . import ablation, stats, timing
from ..transforms.vocabulary import MODES



def tolerances(configured: dict | None) -> dict:
    """The numerics tolerances per dtype: the defaults (optimize.numerics) with the config's keys over them."""
    from .numerics import DEFAULT_TOLERANCES

    merged = {dtype: dict(values) for dtype, values in DEFAULT_TOLERANCES.items()}
    for dtype, values in (configured or {}).items():
        merged.setdefault(dtype, {}).update(values)
    return merged


#: A decision is borderline (undecided) when its interval reaches 1 while its median is a gain: such decisions are
#: measured again (more repetitions, new processes) this many times at most; a change still undecided then is kept
#: and called undecided (optimize.ablation).
REFINE_ROUNDS = 2


def _refresh(result: dict, name: str, samples: list[float]) -> None:
    """Pool ``samples`` into variant ``name`` of a timing result: its median, interval and speedup again."""
    entry = result["variants"][name]
    entry["samples_ms"] = list(entry["samples_ms"]) + list(samples)
    entry["repetitions"] = len(entry["samples_ms"])
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


def refine_borderline(spec: dict, result: dict, advised: list[str], work_dir: Path, rounds: int = REFINE_ROUNDS,
                      progress=None, **measure_kwargs) -> list[dict]:
    """Measure the undecided changes of the ablation again until they decide (their interval leaves 1) or
    ``rounds`` are spent: each round times the two change sets every undecided decision compared (the full advised
    set and the set without the change; on the prefix basis the step's two prefixes) and FP32 eager, interleaved
    in ``spec``'s processes, and pools the new repetitions into ``result``. A change that stays undecided is kept
    and called undecided (its median is a gain: it is never dropped silently). ``measure_kwargs`` go to
    :func:`timing.measure` (build, numerics). Returns one record per round."""
    done = []
    for index in range(rounds):
        record = ablation.verification(result, advised)
        names = set()
        for step in record["ablation"]["steps"]:
            if step["decision"] != "undecided" or not step.get("compared"):
                continue
            for changes in step["compared"]:
                found = ablation._find(result, changes)
                if found is not None:
                    names.add(found[0])
        if not names:
            break
        names.add(result.get("baseline") or "fp32_eager")
        variants = {name: result["variants"][name]["changes"] for name in sorted(names)}
        if progress:
            progress(f"undecided changes: measuring {', '.join(sorted(names))} again (round {index + 1})")
        extra = timing.measure({**spec, "variants": variants}, work_dir=Path(work_dir) / f"refine{index + 1}",
                               **measure_kwargs)
        for name, entry in extra["variants"].items():
            if not entry.get("rejected"):
                _refresh(result, name, entry["samples_ms"])
        _speedups(result)
        result["warnings"] = list(result.get("warnings", [])) + list(extra.get("warnings", []))
        done.append({"round": index + 1, "variants": sorted(names)})
    return done


def _busy(timed: dict | None) -> bool:
    """Whether other processes kept more CPUs busy than the spare ones beside the threads (plus the margin) in
    any process of a timing result (timing.busy_machine_warnings's rule)."""
    from ..capture.machine import BUSY_MARGIN_CPUS

    threads = (timed or {}).get("threads") or 1
    for info in (timed or {}).get("processes_info") or []:
        others = info.get("other_cpu_load")
        if others is not None and others > max(0, (info.get("usable_cpus") or threads) - threads) + BUSY_MARGIN_CPUS:
            return True
    return False


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
    ``progress``: called with one line per timing process started."""
    from ..transforms.vocabulary import machine_features

    features = features or machine_features(device)
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
    result = timing.measure({**spec, "variants": variants}, work_dir=work_dir / "round1", progress=progress)
    refined = refine_borderline(spec, result, advised, work_dir, progress=progress)
    record = ablation.verification(result, advised)
    record["refined"] = refined
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
        second = timing.measure({**spec, "variants": again}, work_dir=work_dir / "round2", progress=progress)
        entry = second["variants"][recommended["name"]]
        trail = list(recommended.get("trail") or [])
        if trail and trail[-1].startswith("recommended "):
            trail[-1] = f"{recommended['name']} was measured in a second round with " + ", ".join(
                n for n in again if n != recommended["name"])
        chosen = ablation.recommend(second, recommended["changes"], advised, recommended.get("required_by"), trail,
                                    final=True)
        chosen.update(round=2, rejected=entry.get("rejected"))
        record["ablation"]["recommended"] = recommended = chosen
        record["round2"] = {name: {k: v.get(k) for k in ("changes", "rejected", "median_ms", "ci_ms", "speedup",
                                                         "faults_per_iteration", "numerics")}
                            for name, v in second["variants"].items()}
        record["warnings"] = [w for w in record["warnings"] if "was not measured as a whole" not in w]
        if recommended.get("source") in ("strong_generic", "full_advised"):
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
                    out.parent / "timing", count, threads_source=threads_source if threads else source,
                    progress=progress)
    write_json(out, record)
    return record
