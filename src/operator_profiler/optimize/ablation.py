"""The ablation of an advised change list: which variants to measure (:func:`plan`), which changes earn their
place (:func:`decide`) and the ``verification`` record that joins both with the timing result
(:func:`verification`; fields in docs/optimize.md#verification).

A change gets credit only for its own measured effect in the context it is applied: the step from the
cumulative prefix without it to the prefix with it (advised order). A step whose speedup interval does not
lie above 1 drops the change from the recommended variant and earns it nothing.
"""

from __future__ import annotations

from typing import Any, Iterable

from . import stats
from .vocabulary import CHANGES

#: The change ids in their canonical order (a variant's changes are listed in this order).
CATALOG_ORDER = tuple(CHANGES)
BASELINE_NAMES = ("fp32_eager", "compile_default", "strong_generic")


def requirements(change: str) -> tuple[str, ...]:
    """The changes ``change`` needs to make sense: the change ids among its ``needs`` (optimize.vocabulary; its
    other needs, e.g. inference or native bf16, are preconditions, not changes); () for an unknown id."""
    entry = CHANGES.get(change)
    return () if entry is None else tuple(c for c in CHANGES if c in entry.needs)


def closure(changes: Iterable[str]) -> list[str]:
    """``changes`` with everything they require, in catalog order (unknown ids last, in given order)."""
    found: list[str] = []
    pending = list(changes)
    while pending:
        change = pending.pop(0)
        if change not in found:
            found.append(change)
            pending.extend(requirements(change))
    rank = {c: i for i, c in enumerate(CATALOG_ORDER)}
    return sorted(found, key=lambda c: (rank.get(c, len(rank)), found.index(c)))


def variant_name(changes: Iterable[str]) -> str:
    """``fp32_eager`` for no change, else the changes joined by ``+`` in catalog order (``compile+freezing``)."""
    ordered = closure(changes)
    return "+".join(ordered) if ordered else "fp32_eager"


def default_baselines(native_bf16: bool, mode: str = "infer") -> dict[str, list[str]]:
    """The baselines named in every result: FP32 eager, ``torch.compile`` default, and the strong
    generic one: compile + max-autotune + freezing (inference only) + bf16 autocast (only where the device
    computes bf16 natively: avx512_bf16/AMX on a CPU, capability >= 8.0 on a GPU)."""
    strong = ["compile", "max_autotune"] + (["freezing"] if mode == "infer" else []) + (
        ["bf16_autocast"] if native_bf16 else [])
    return {"fp32_eager": [], "compile_default": ["compile"], "strong_generic": closure(strong)}


def plan(advised: list[str], baselines: dict[str, list[str]]) -> dict[str, list[str]]:
    """The variants an ablation of ``advised`` measures: name -> changes.

    The ``baselines`` under their own names; each advised change **alone**, i.e. on top of FP32 eager together
    with only what it requires to make sense (:func:`requirements`: freezing alone = compile + freezing); and
    the **cumulative** prefixes ``advised[:1]``, ``advised[:2]``, ... (each closed under requirements). A change
    set measured once: a variant equal to a baseline or to another entry is not repeated (:func:`decide` finds
    variants by their change set, not by name). Other names are :func:`variant_name`.
    """
    variants: dict[str, list[str]] = {}
    seen: set[frozenset[str]] = set()

    def add(name: str, changes: list[str]) -> None:
        key = frozenset(changes)
        if key not in seen:
            seen.add(key)
            variants[name] = changes

    for name, changes in baselines.items():
        add(name, closure(changes))
    for change in advised:
        add(variant_name([change]), closure([change]))
    for end in range(1, len(advised) + 1):
        add(variant_name(advised[:end]), closure(advised[:end]))
    return variants


def _find(result: dict, changes: Iterable[str]) -> tuple[str, dict] | None:
    key = frozenset(closure(changes))
    return next(((name, entry) for name, entry in result["variants"].items() if frozenset(entry["changes"]) == key),
                None)


def _ratio(result: dict, before: dict, after: dict) -> dict:
    settings = {k: result[k] for k in ("confidence", "resamples", "seed") if k in result}
    ratio = stats.speedup_interval(before["samples_ms"], after["samples_ms"], **settings)
    return {"value": ratio["speedup"], "ci": [ratio["low"], ratio["high"]], "shows_gain": ratio["shows_gain"]}


def decide(result: dict, advised: list[str]) -> dict:
    """Walk the cumulative prefixes of ``advised`` in ``result`` (:func:`operator_profiler.optimize.timing.measure`).

    Step i compares the prefix with ``advised[i]`` against the context before it (the previous prefix that was
    not rejected; FP32 eager first): the change is **kept** when the step's speedup interval lies above 1, else
    **dropped** with the figure (also when the prefix with it was rejected or not measured). A change an earlier
    one already required is decided with it (``implied``). A kept change's ``credit`` is its step's speedup;
    a dropped one earns nothing (null). ``recommended``: the kept changes with what they require (a dropped change
    a kept one requires is added back, ``required_by``), with its figures when that change set was measured,
    and whether it is slower than ``strong_generic`` (point estimate below 1; ``significant`` when the whole
    interval is); a rejected ``strong_generic`` (its numerics failed: a miscompile) is never compared against:
    ``vs_strong_generic`` null and ``strong_generic_rejected`` its reason.

    Returns ``{"advised", "steps", "kept", "dropped", "recommended"}`` (docs/optimize.md#verification).
    """
    steps: list[dict] = []
    context = _find(result, [])
    context_changes: list[str] = []
    kept: list[str] = []
    dropped: list[dict] = []
    for end, change in enumerate(advised, 1):
        with_changes = closure(advised[:end])
        step: dict[str, Any] = {"change": change, "context": closure(context_changes), "with": with_changes,
                                "speedup": None, "decision": None, "credit": None, "reason": None}
        steps.append(step)
        if set(with_changes) == set(closure(context_changes)) and context is not None:
            step.update(decision="implied", reason="already required by an earlier change")
            continue
        found = _find(result, with_changes)
        if context is None or context[1].get("rejected"):
            step.update(decision="dropped", reason="its context was not measured or was rejected")
        elif found is None:
            step.update(decision="dropped", reason=f"variant {variant_name(with_changes)} was not measured")
        elif found[1].get("rejected"):
            step.update(decision="dropped", reason=f"rejected: {found[1]['rejected']}")
        else:
            step["speedup"] = _ratio(result, context[1], found[1])
            figure = f"{step['speedup']['value']:.3f}x [{step['speedup']['ci'][0]:.3f}, {step['speedup']['ci'][1]:.3f}]"
            if step["speedup"]["shows_gain"]:
                step.update(decision="kept", credit=step["speedup"], reason=f"step {figure}")
            else:
                step.update(decision="dropped", reason=f"step {figure}: the interval does not lie above 1")
        if step["decision"] == "kept":
            kept.append(change)
        else:
            dropped.append({"change": change, "reason": step["reason"], "speedup": step["speedup"]})
        if found is not None and not found[1].get("rejected"):
            context, context_changes = found, with_changes
    for step in steps:  # an implied change stands or falls with the change that required it
        if step["decision"] == "implied":
            keep = any(step["change"] in closure([k]) for k in kept)
            step["decision"] = "kept" if keep else "dropped"
            if keep:
                kept.append(step["change"])
            else:
                step["reason"] = "required only by changes that were dropped"
                dropped.append({"change": step["change"], "reason": step["reason"], "speedup": None})
    recommended_changes = closure(kept)
    required_by = {c: [k for k in kept if c in closure([k]) and c != k] for c in recommended_changes if c not in kept}
    recommended: dict[str, Any] = {"changes": recommended_changes, "name": variant_name(recommended_changes),
                                   "required_by": required_by, "measured": False}
    found = _find(result, recommended_changes)
    if found is not None and not found[1].get("rejected"):
        entry = found[1]
        recommended.update(measured=True, variant=found[0], median_ms=entry.get("median_ms"), ci_ms=entry.get("ci_ms"),
                           speedup=entry.get("speedup"))
        strong = result["variants"].get("strong_generic")
        if strong is not None and strong.get("rejected"):  # a rejected baseline is never compared against
            recommended.update(vs_strong_generic=None, strong_generic_rejected=strong["rejected"])
        elif strong is not None:
            versus = _ratio(result, strong, entry)
            recommended.update(vs_strong_generic=versus, slower_than_strong_generic=versus["value"] < 1,
                               slower_significant=versus["ci"][1] < 1)
    return {"advised": list(advised), "steps": steps, "kept": kept, "dropped": dropped, "recommended": recommended}


def verification(result: dict, advised: list[str]) -> dict:
    """The JSON-able ``verification`` record of one workload: the timing result per variant (without the raw
    samples), the ablation (:func:`decide`) and every warning (docs/optimize.md#verification)."""
    fields = ("changes", "rejected", "median_ms", "ci_ms", "speedup", "faults_per_iteration", "numerics",
              "numerics_in_dtype", "repetitions", "iterations_per_repetition", "rss_after_warmup_bytes", "checks",
              "rewrites")
    ablation = decide(result, advised)
    warnings = list(result.get("warnings", []))
    rejected_baselines = {name: result["variants"][name]["rejected"] for name in BASELINE_NAMES
                          if name in result["variants"] and result["variants"][name].get("rejected")}
    for name, reason in rejected_baselines.items():
        if any(w.startswith(f"baseline {name} was rejected") for w in warnings):
            continue  # the timing result's own warning (its speedup baseline) says it already
        warnings.append(f"baseline {name} was rejected ({reason}): it is reported as rejected and nothing is "
                        "compared with it")
    recommended = ablation["recommended"]
    if not recommended["measured"]:
        warnings.append(f"the recommended variant {recommended['name']} was not measured as a whole (a change between "
                        "kept ones was dropped): measure it before quoting its speed")
    if recommended.get("slower_than_strong_generic"):
        v = recommended["vs_strong_generic"]
        warnings.append(f"the recommended variant {recommended['name']} is slower than strong_generic: "
                        f"{v['value']:.3f}x [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]")
    return {"workload": result.get("workload"), "device": result.get("device"), "threads": result.get("threads"),
            "repetitions": result.get("repetitions"), "processes": result.get("processes"),
            "baseline": result.get("baseline"), "rejected_baselines": rejected_baselines,
            "variants": {name: {k: entry.get(k) for k in fields} for name, entry in result["variants"].items()},
            "ablation": ablation, "warnings": warnings}
