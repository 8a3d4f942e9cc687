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


def verify(workload_name: str, workload: dict, optimize: dict, device: str, advice: dict, work_dir: Path,
           threads: int | None = None, features: dict | None = None) -> dict:
    """Measure the ablation of ``advice``'s advised changes against the baselines; returns the verification
    record (optimize.ablation.verification) with the advice's evidence per change beside it.

    ``workload``: the workload's config slice (its own compile setting and changes are what the variants
    replace: every variant is built from the eager FP32 model with its own change list). When the recommended
    variant (the kept changes) is not one of the measured change sets, it is measured in a second round with
    FP32 eager, the full advised set and the strong baseline, and recommended only when neither of them is faster
    (optimize.ablation.recommend), so its figures are never quoted unmeasured."""
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
        # the kept changes as a whole (two or more dropped), measured beside FP32 eager, the full advised set (when
        # it verified) and strong_generic, so that neither can be faster than what is recommended
        again = {"fp32_eager": [], recommended["name"]: recommended["changes"]}
        full = ablation.closure(advised)
        if ablation._verified(result, full) is not None and frozenset(full) != frozenset(recommended["changes"]):
            again[ablation.variant_name(full)] = full
        if frozenset(baselines["strong_generic"]) not in {frozenset(c) for c in again.values()}:
            again["strong_generic"] = baselines["strong_generic"]
        second = timing.measure({**spec, "variants": again}, work_dir=work_dir / "round2")
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
