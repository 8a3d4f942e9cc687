"""The verify_variants job: the advised variant's ablation measured on the device (optimize.timing: interleaved
wall time, >= 20 repetitions over >= 2 processes, page faults, numerics against FP32 eager), decided
(optimize.ablation) and written to ``optimize/verification.json`` (fields: docs/optimize.md, "Verification")."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..files import read_json_file, write_json
from . import ablation, stats, timing
from .vocabulary import MODES



def tolerances(configured: dict | None) -> dict:
    """The numerics tolerances per dtype: the defaults (optimize.numerics) with the config's keys over them."""
    from .numerics import DEFAULT_TOLERANCES

    merged = {dtype: dict(values) for dtype, values in DEFAULT_TOLERANCES.items()}
    for dtype, values in (configured or {}).items():
        merged.setdefault(dtype, {}).update(values)
    return merged


#: A dropped step is borderline when its point estimate shows a gain and its interval still reaches 1: such steps
#: are measured again (more repetitions, new processes) this many times at most before the decision stands.
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
    """Measure the borderline steps of the ablation again until they decide (their interval leaves 1) or
    ``rounds`` are spent: each round times the two variants of every borderline step (and FP32 eager) interleaved
    in ``spec``'s processes, and pools the new repetitions into ``result``. A step that stays borderline is
    dropped (the rule stands: a change is kept only on an interval above 1). ``measure_kwargs`` go to
    :func:`timing.measure` (build, numerics). Returns one record per round."""
    done = []
    for index in range(rounds):
        record = ablation.verification(result, advised)
        names = set()
        for step in record["ablation"]["steps"]:
            speedup = step.get("speedup") or {}
            if step["decision"] != "dropped" or not speedup or speedup["value"] <= 1 or speedup["ci"][0] > 1:
                continue
            for changes in (step["context"], step["with"]):
                found = ablation._find(result, changes)
                if found is not None:
                    names.add(found[0])
        if not names:
            break
        names.add(result.get("baseline") or "fp32_eager")
        variants = {name: result["variants"][name]["changes"] for name in sorted(names)}
        if progress:
            progress(f"borderline steps: measuring {', '.join(sorted(names))} again (round {index + 1})")
        extra = timing.measure({**spec, "variants": variants}, work_dir=Path(work_dir) / f"refine{index + 1}",
                               **measure_kwargs)
        for name, entry in extra["variants"].items():
            if not entry.get("rejected"):
                _refresh(result, name, entry["samples_ms"])
        _speedups(result)
        result["warnings"] = list(result.get("warnings", [])) + list(extra.get("warnings", []))
        done.append({"round": index + 1, "variants": sorted(names)})
    return done


def verify(workload_name: str, workload: dict, optimize: dict, device: str, advice: dict, work_dir: Path,
           threads: int | None = None, features: dict | None = None) -> dict:
    """Measure the ablation of ``advice``'s advised changes against the baselines; returns the verification
    record (optimize.ablation.verification) with the advice's evidence per change beside it.

    ``workload``: the workload's config slice (its own compile setting and changes are what the variants
    replace: every variant is built from the eager FP32 model with its own change list). When the recommended
    variant (the kept changes) is not one of the measured change sets, it is measured in a second round with
    FP32 eager and the strong baseline, so its figures are never quoted unmeasured."""
    from .vocabulary import machine_features

    features = features or machine_features(device)
    mode = MODES.get(workload.get("mode", "inference"), "infer")
    advised = list(advice["advised_changes"])
    # The model as FP32 eager builds it: the variants carry their own compile settings (whole-model
    # torch.compile through optimize.changes; a workload's compile_scope/compile_mode/compile_options are the
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
    result = timing.measure({**spec, "variants": variants}, work_dir=work_dir / "round1")
    refined = refine_borderline(spec, result, advised, work_dir)
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
        again = {"fp32_eager": [], recommended["name"]: recommended["changes"],
                 "strong_generic": baselines["strong_generic"]}
        second = timing.measure({**spec, "variants": again}, work_dir=work_dir / "round2")
        entry = second["variants"][recommended["name"]]
        recommended.update(measured=not entry.get("rejected"), round=2, variant=recommended["name"],
                           median_ms=entry.get("median_ms"), ci_ms=entry.get("ci_ms"), speedup=entry.get("speedup"),
                           rejected=entry.get("rejected"))
        record["round2"] = {name: {k: v.get(k) for k in ("changes", "rejected", "median_ms", "ci_ms", "speedup",
                                                         "faults_per_iteration", "numerics")}
                            for name, v in second["variants"].items()}
        record["warnings"] = [w for w in record["warnings"] if "was not measured as a whole" not in w]
        record["warnings"] += second.get("warnings", [])
    record["advice"] = {r["change"]: {"rule": r["rule"], "evidence": r["evidence"], "expect": r["expect"]}
                        for r in advice.get("advice", [])}
    record["sources"] = advice.get("sources", {})
    record["baselines"] = baselines
    record["machine_features"] = {k: v for k, v in features.items() if k != "cpu_flags"}
    return record


def verify_variants_job(workload_name: str, workload_json: str, optimize_json: str, device: str, advice_path: str,
                        out_path: str) -> None:
    """The rule's work: read advice.json, measure, write verification.json (atomically; the processes' specs and
    logs go beside it in ``timing/``)."""
    from ..capture.harness import resolve_device

    device = resolve_device(device)
    advice = read_json_file(Path(advice_path), "advice.json", "run the advise rule first")
    out = Path(out_path)
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or None
    record = verify(workload_name, json.loads(workload_json), json.loads(optimize_json), device, advice,
                    out.parent / "timing", threads)
    write_json(out, record)
