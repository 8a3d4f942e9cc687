"""The ablation of an advised change list: which variants to measure (:func:`plan`), which changes earn their
place (:func:`decide`), what is recommended (:func:`recommend`) and the ``verification`` record that joins them
with the timing result (:func:`verification`; fields in docs/optimize.md#verification).

A change's credit is what is lost when it is removed from the full advised set (leave-one-out): the full set
against the set without it. A change is dropped only when removing it is not slower; a change whose interval
reaches 1 while its median is a gain is kept and called undecided (:func:`borderline` names such comparisons, the
guards' too, for :func:`operator_profiler.optimize.verify.measure_more` to measure again within a time budget;
each decision reports the repetitions and processes it rests on); one whose leave-one-out variant was not
measured is kept (the conservative choice). The cumulative prefix steps (advised order) are measured and
reported beside it: a change whose leave-one-out credit differs from its prefix step (disjoint intervals)
interacts with the others. The recommendation is never slower than the full advised variant or than
``strong_generic`` when those verify, nor than FP32 eager (doing nothing); "slower" means the ratio's whole
interval lies below 1.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from . import stats
from ..figures import interval
from ..transforms.vocabulary import CHANGES

#: The change ids in their canonical order (a variant's changes are listed in this order).
CATALOG_ORDER = tuple(CHANGES)
BASELINE_NAMES = ("fp32_eager", "compile_default", "strong_generic")
#: The ``source`` of a recommendation a guard put in place of the decided set (:func:`recommend`).
REPLACING_SOURCES = ("full_advised", "strong_generic", "faster_variant", "fp32_eager")


def requirements(change: str) -> tuple[str, ...]:
    """The changes ``change`` needs to make sense: the change ids among its ``needs`` (transforms.vocabulary; its
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


def leave_one_out(advised: list[str], change: str) -> tuple[list[str], list[str]]:
    """``(without, removes)``: the full advised set without ``change`` (closed under requirements) and the advised
    changes that go with it (``change`` and every advised change that requires it: freezing goes with compile)."""
    removes = [a for a in advised if change in closure([a])]
    return closure([a for a in advised if a not in removes]), removes


def plan(advised: list[str], baselines: dict[str, list[str]]) -> dict[str, list[str]]:
    """The variants an ablation of ``advised`` measures: name -> changes.

    The ``baselines`` under their own names; each advised change **alone**, i.e. on top of FP32 eager together
    with only what it requires to make sense (:func:`requirements`: freezing alone = compile + freezing); the
    **cumulative** prefixes ``advised[:1]``, ``advised[:2]``, ... (each closed under requirements); and the full
    advised set **without each change** (:func:`leave_one_out`: at most one more variant per advised change; the
    one without the last change is the previous prefix). A change set is measured once: a variant equal to a
    baseline or to another entry is not repeated (:func:`decide` finds variants by their change set, not by
    name). Other names are :func:`variant_name`.
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
    for change in advised:
        without, _ = leave_one_out(advised, change)
        add(variant_name(without), without)
    return variants


def _find(result: dict, changes: Iterable[str]) -> tuple[str, dict] | None:
    key = frozenset(closure(changes))
    return next(((name, entry) for name, entry in result["variants"].items() if frozenset(entry["changes"]) == key),
                None)


def _verified(result: dict, changes: Iterable[str]) -> tuple[str, dict] | None:
    """The measured, not rejected variant with ``changes``; None otherwise."""
    found = _find(result, changes)
    return found if found is not None and not found[1].get("rejected") and found[1].get("samples_ms") else None


def _ratio(result: dict, before: dict, after: dict) -> dict:
    settings = {k: result[k] for k in ("confidence", "resamples", "seed") if k in result}
    ratio = stats.speedup_interval(before["samples_ms"], after["samples_ms"], **settings)
    return {"value": ratio["speedup"], "ci": [ratio["low"], ratio["high"]], "shows_gain": ratio["shows_gain"]}


def _measurement(result: dict, found: list[tuple[str, dict] | None], key: str) -> dict:
    """What a decision's comparison rests on, per compared variant (``found``: (name, entry) or None):
    ``variants`` (names, null where not measured), ``repetitions`` and ``processes`` (the samples pooled in the
    comparison and the worker processes they come from; null where rejected or not measured) and ``extra_rounds``
    (the rounds of :func:`operator_profiler.optimize.verify.measure_more` run for the decision ``key``)."""
    def count(entry: tuple[str, dict] | None, field: str) -> int | None:
        if entry is None or entry[1].get("rejected") or not entry[1].get("samples_ms"):
            return None
        value = entry[1].get(field)
        return len(entry[1]["samples_ms"]) if field == "repetitions" and value is None else value

    return {"variants": [f[0] if f else None for f in found], "repetitions": [count(f, "repetitions") for f in found],
            "processes": [count(f, "processes") for f in found],
            "extra_rounds": sum(1 for r in result.get("refined") or [] if key in r.get("decisions", ()))}


def _more_text(result: dict, measurement: dict, decision: str) -> str:
    """What measuring more did for one decision (empty when no extra round ran and none was owed)."""
    more = result.get("measure_more") or {}
    counts = (f"{' and '.join(str(n) for n in measurement['repetitions'] if n is not None)} repetitions over "
              f"{' and '.join(str(n) for n in measurement['processes'] if n is not None)} processes")
    rounds = measurement["extra_rounds"]
    if decision != "undecided":
        return f" (decided after {rounds} more round(s) of measurement: {counts})" if rounds else ""
    why = {"budget": f"the decision budget ({more.get('budget_s', 0):g} s, {more.get('spent_s', 0):.0f} s spent) "
                     "allows no further round" + (f" (the next would take about {more['next_estimate_s']:.0f} s)"
                                                  if more.get("next_estimate_s") else ""),
           "rounds": f"the {more.get('max_rounds')} rounds allowed were run",
           "rejected": "a compared variant was rejected when measured again"}.get(more.get("stopped"))
    if not more:
        return ""
    return (f"; still undecided after {rounds} more round(s) ({counts})" + (f": {why}" if why else "")
            if rounds else (f"; not measured more: {why}" if why else ""))


def figure(ratio: dict | None) -> str:
    """``1.234x [1.100, 1.300]`` (more digits for a figure within rounding of 1: figures.interval); ``-`` for
    None."""
    if not ratio:
        return "-"
    return interval(ratio["value"], ratio["ci"], "x")


def _judge(ratio: dict) -> str:
    """kept (the interval lies above 1), undecided (it reaches 1, the median is a gain) or dropped."""
    if ratio["ci"][0] > 1:
        return "kept"
    return "undecided" if ratio["value"] > 1 else "dropped"


def _prefix_steps(result: dict, advised: list[str]) -> list[dict]:
    """Step i: the prefix with ``advised[i]`` against the context before it (the previous prefix that was not
    rejected; FP32 eager first); ``speedup`` its ratio, ``problem`` why there is none, ``implied`` when an
    earlier change already required it."""
    steps: list[dict] = []
    context = _find(result, [])
    context_changes: list[str] = []
    for end, change in enumerate(advised, 1):
        with_changes = closure(advised[:end])
        step: dict[str, Any] = {"change": change, "context": closure(context_changes), "with": with_changes,
                                "speedup": None, "problem": None, "implied": False}
        steps.append(step)
        if set(with_changes) == set(closure(context_changes)) and context is not None:
            step["implied"] = True
            continue
        found = _find(result, with_changes)
        if context is None or context[1].get("rejected"):
            step["problem"] = "its context was not measured or was rejected"
        elif found is None:
            step["problem"] = f"variant {variant_name(with_changes)} was not measured"
        elif found[1].get("rejected"):
            step["problem"] = f"rejected: {found[1]['rejected']}"
        else:
            step["speedup"] = _ratio(result, context[1], found[1])
        if found is not None and not found[1].get("rejected"):
            context, context_changes = found, with_changes
    return steps


def _interaction(step_ratio: dict | None, credit: dict | None, others: list[str] = ()) -> str | None:
    """A sentence when the leave-one-out credit and the prefix step differ (disjoint intervals); None otherwise.
    ``others``: the advised changes removed with it (they need it), named in the sentence."""
    if not step_ratio or not credit:
        return None
    also = f"; removing it removes {', '.join(others)} too" if others else ""
    if credit["ci"][0] > step_ratio["ci"][1]:
        return (f"interacts: its credit in the full set {figure(credit)} exceeds its step in the advised order "
                f"{figure(step_ratio)} (it pays together with other changes{also})")
    if credit["ci"][1] < step_ratio["ci"][0]:
        return (f"interacts: its credit in the full set {figure(credit)} is below its step in the advised order "
                f"{figure(step_ratio)} (other changes take over part of its gain{also})")
    return None


def decide(result: dict, advised: list[str]) -> dict:
    """Decide every change of ``advised`` in ``result`` (:func:`operator_profiler.optimize.timing.measure`).

    When the full advised set verified (measured, not rejected), each change is decided by **leave-one-out**: its
    ``credit`` is the full set's speedup over the full set without it (:func:`leave_one_out`). The change is
    ``kept`` when that interval lies above 1, ``undecided`` (and kept) when the interval reaches 1 but the median
    is a gain, ``dropped`` when the median is not a gain (removing it is not slower); kept, with the reason, when
    the set without it was not measured (the conservative choice) or was rejected (the change is needed). When the
    full set did not verify, the cumulative prefix steps decide by the same rule (a rejected or unmeasured step
    drops its change; a change an earlier one already required stands or falls with it).

    Every step also carries the prefix step (``context``, ``with``, ``speedup``: the prefix with the change
    against the previous prefix not rejected, advised order), ``basis`` (leave_one_out, prefix_step,
    not_measured, rejected_without_it, implied), ``compared`` ([without, with] change sets the decision compared),
    ``measurement`` (:func:`_measurement`: per compared set its variant, repetitions and processes, and the extra
    rounds measured for this decision; the reason says when they decided it or when it stayed undecided and why),
    ``leave_one_out`` (``without``, ``removes``, ``variant``, ``speedup``, ``rejected``; null on the prefix basis)
    and ``interaction`` (a sentence when the credit and the step's intervals are disjoint, else null).

    Returns ``{"advised", "basis", "steps", "kept", "undecided", "dropped", "interactions", "recommended"}``
    (``kept`` includes the undecided ones; ``recommended``: :func:`recommend`; docs/optimize.md#verification).
    """
    full = closure(advised)
    full_found = _verified(result, full)
    prefix = _prefix_steps(result, advised)
    basis = "leave_one_out" if full_found is not None else "prefix_step"
    trail: list[str] = []
    if advised and full_found is not None:
        trail.append(f"the full advised set {variant_name(full)} verified"
                     + (f" ({figure(full_found[1]['speedup'])} over FP32 eager)" if full_found[1].get("speedup")
                        else "") + ": each change is decided by removing it from the full set")
    elif advised:
        why = "was rejected" if _find(result, full) is not None else "was not measured"
        trail.append(f"the full advised set {variant_name(full)} {why}: each change is decided by its step in the "
                     "advised order")
    steps: list[dict] = []
    for p in prefix:
        step: dict[str, Any] = {"change": p["change"], "context": p["context"], "with": p["with"],
                                "speedup": p["speedup"], "decision": None, "credit": None, "reason": None,
                                "basis": basis, "compared": None, "measurement": None, "leave_one_out": None,
                                "interaction": None}
        steps.append(step)
        if basis == "leave_one_out":
            without, removes = leave_one_out(advised, p["change"])
            found = _find(result, without)
            loo: dict[str, Any] = {"without": without, "removes": removes,
                                   "variant": found[0] if found else None, "speedup": None,
                                   "rejected": found[1].get("rejected") if found else None}
            step.update(leave_one_out=loo, compared=[without, full],
                        measurement=_measurement(result, [found, full_found], p["change"]))
            others = [r for r in removes if r != p["change"]]
            also = f" (with {', '.join(others)}, which need{'s' if len(others) == 1 else ''} it)" if others else ""
            if found is None:
                step.update(decision="kept", basis="not_measured",
                            reason=f"the full set without it{also} ({variant_name(without)}) was not measured: kept, "
                                   "the conservative choice")
            elif found[1].get("rejected"):
                step.update(decision="kept", basis="rejected_without_it",
                            reason=f"the full set without it{also} was rejected ({found[1]['rejected']}): kept")
            else:
                credit = loo["speedup"] = _ratio(result, found[1], full_found[1])
                step["decision"] = _judge(credit)
                step["reason"] = {
                    "kept": f"removing it{also} is slower: the full set is {figure(credit)} over {found[0]}",
                    "undecided": f"removing it{also}: the full set is {figure(credit)} over {found[0]}; the interval "
                                 "reaches 1 but the median is a gain: kept, undecided",
                    "dropped": f"removing it{also} is not slower: the full set is {figure(credit)} over {found[0]}",
                }[step["decision"]] + _more_text(result, step["measurement"], step["decision"])
                if step["decision"] != "dropped":
                    step["credit"] = credit
                step["interaction"] = _interaction(p["speedup"], credit, others)
        else:
            step["compared"] = [p["context"], p["with"]]
            step["measurement"] = _measurement(result, [_find(result, p["context"]), _find(result, p["with"])],
                                               p["change"])
            if p["implied"]:
                step.update(basis="implied", reason="already required by an earlier change")
            elif p["speedup"] is None:
                step.update(decision="dropped", reason=p["problem"])
            else:
                step["decision"] = _judge(p["speedup"])
                step["reason"] = {"kept": f"step {figure(p['speedup'])}",
                                  "undecided": f"step {figure(p['speedup'])}: the interval reaches 1 but the median "
                                               "is a gain: kept, undecided",
                                  "dropped": f"step {figure(p['speedup'])}: its median is no gain"}[step["decision"]]
                step["reason"] += _more_text(result, step["measurement"], step["decision"])
                if step["decision"] != "dropped":
                    step["credit"] = p["speedup"]
    in_set = [s["change"] for s in steps if s["decision"] in ("kept", "undecided")]
    for step in steps:  # an implied change stands or falls with the change that required it
        if step["basis"] == "implied":
            keep = any(step["change"] in closure([k]) for k in in_set)
            step["decision"] = "kept" if keep else "dropped"
            if not keep:
                step["reason"] = "required only by changes that were dropped"
    kept = [s["change"] for s in steps if s["decision"] in ("kept", "undecided")]
    dropped = [{"change": s["change"], "reason": s["reason"],
                "speedup": (s["leave_one_out"] or {}).get("speedup") if s["leave_one_out"] else s["speedup"]}
               for s in steps if s["decision"] == "dropped"]
    trail += [f"{s['change']}: {s['decision']}: {s['reason']}" for s in steps]
    candidate = closure(kept)
    required_by = {c: [k for k in kept if c in closure([k]) and c != k] for c in candidate if c not in kept}
    for change, by in required_by.items():
        trail.append(f"{change} is back in: {', '.join(by)} require(s) it")
    recommended = recommend(result, candidate, advised, required_by, trail)
    return {"advised": list(advised), "basis": basis, "steps": steps, "kept": kept,
            "undecided": [s["change"] for s in steps if s["decision"] == "undecided"], "dropped": dropped,
            "interactions": [{"change": s["change"], "step": s["speedup"], "credit": s["credit"] or
                              (s["leave_one_out"] or {}).get("speedup"), "note": s["interaction"]}
                             for s in steps if s["interaction"]],
            "recommended": recommended}


def _guard(result: dict, against: str, other: tuple[str, dict], candidate: tuple[str, dict], versus: dict) -> dict:
    """One guard's comparison of the recommendation (``candidate``) with ``other`` (the full advised set or
    strong_generic): ``{"against", "ratio", "outcome", **measurement}``; ``ratio`` is median(other) /
    median(candidate); ``outcome`` ``slower`` (its whole interval below 1: the guard replaces the candidate),
    ``undecided`` (the median says slower, the interval reaches 1: the candidate stays, measured more when the
    budget allows) or ``not slower``."""
    outcome = "slower" if versus["ci"][1] < 1 else ("undecided" if versus["value"] < 1 else "not slower")
    return {"against": against, "ratio": versus, "outcome": outcome,
            **_measurement(result, [other, candidate], f"guard:{against}")}


def _guard_text(result: dict, guard: dict) -> str:
    """The end of a guard's trail line that did not replace the candidate."""
    if guard["outcome"] != "undecided":
        return "not slower" + _more_text(result, guard, "kept")
    return "the median says slower but the interval reaches 1: not replaced, undecided" + _more_text(
        result, guard, "undecided")


def borderline(decision: dict) -> dict[str, list[str]]:
    """The undecided comparisons of a :func:`decide` record that more repetitions could decide: the key of each
    (an advised change for its step, ``guard:full_advised`` / ``guard:strong_generic`` for a guard whose median
    says the recommendation is slower while its interval reaches 1) -> the names of the two variants it compared.
    Implied steps and comparisons with a variant that was not measured or was rejected are left out."""
    pending: dict[str, list[str]] = {}
    for step in decision.get("steps") or []:
        names = (step.get("measurement") or {}).get("variants") or []
        counted = (step.get("measurement") or {}).get("repetitions") or []
        if step["decision"] == "undecided" and step["basis"] != "implied" and len(names) == 2 \
                and None not in names and None not in counted:
            pending[step["change"]] = list(names)
    for guard in (decision.get("recommended") or {}).get("guards") or []:
        if guard["outcome"] == "undecided" and None not in guard["variants"]:
            pending[f"guard:{guard['against']}"] = list(guard["variants"])
    return pending


def recommend(result: dict, candidate: list[str], advised: list[str], required_by: dict | None = None,
              trail: list[str] | None = None, final: bool = False) -> dict:
    """The recommendation from the decided ``candidate`` change set, with its figures when it was measured in
    ``result`` and never slower than what was measured beside it: when the full advised set verified and the
    candidate is slower than it (the ratio's whole interval below 1), the full advised set is recommended; when
    ``strong_generic`` verified and is faster than the recommendation (the ratio's whole interval above 1), its
    set is recommended instead, saying why; when FP32 eager verified and the recommendation is slower than it
    (its speedup interval wholly below 1), the fastest verified variant faster than FP32 eager, else FP32 eager
    itself (no change) is recommended (:func:`_eager_guard`). A rejected ``strong_generic`` (a miscompile) is never
    compared against: ``vs_strong_generic`` null and ``strong_generic_rejected`` its reason. ``final``: an unmeasured
    candidate (no second round to measure it) gives way to the full advised set when that verified.

    Returns ``{"changes", "name", "required_by", "measured", "source", "reason", "trail"}`` (``source``: advised,
    advised_without_dropped, full_advised, strong_generic, faster_variant or fp32_eager) and, when measured,
    ``variant``, ``median_ms``,
    ``ci_ms``, ``speedup``, ``vs_advised`` (against the full advised set, when it differs), ``vs_strong_generic``,
    ``slower_than_strong_generic`` and ``slower_significant`` (both: the whole interval below 1), ``instead_of``
    (the set it replaced, with the comparison, when a guard replaced one), ``guards`` (each guard's comparison:
    :func:`_guard`).
    """
    full = closure(advised)
    trail = list(trail or [])
    source = "advised" if frozenset(candidate) == frozenset(full) else "advised_without_dropped"
    rec: dict[str, Any] = {"changes": list(candidate), "name": variant_name(candidate),
                           "required_by": dict(required_by or {}), "measured": False, "source": source,
                           "reason": None, "trail": trail}
    full_found = _verified(result, full)
    found = _verified(result, candidate)
    if found is None and final and full_found is not None and frozenset(candidate) != frozenset(full):
        trail.append(f"{variant_name(candidate)} could not be measured: recommending the full advised set "
                     f"{variant_name(full)}, which was")
        rec.update(changes=list(full), name=variant_name(full), required_by={}, source="full_advised",
                   reason=f"{variant_name(candidate)} was not measured", instead_of={"changes": list(candidate)})
        found = full_found
    if found is None:
        trail.append(f"recommended {variant_name(candidate)}, not measured as a whole")
        return rec

    def use(entry: tuple[str, dict]) -> None:
        rec.update(measured=True, variant=entry[0], median_ms=entry[1].get("median_ms"),
                   ci_ms=entry[1].get("ci_ms"), speedup=entry[1].get("speedup"))

    use(found)
    rec["guards"] = guards = []
    if full_found is not None and frozenset(rec["changes"]) != frozenset(full):
        versus = rec["vs_advised"] = _ratio(result, full_found[1], found[1])
        guards.append(_guard(result, "full_advised", full_found, found, versus))
        if versus["ci"][1] < 1:
            reason = (f"{found[0]} is slower than the full advised set {full_found[0]}: {figure(versus)}, the whole "
                      "interval below 1")
            trail.append(reason + ": recommending the full advised set")
            rec.update(changes=list(full), name=variant_name(full), required_by={}, source="full_advised",
                       reason=reason, vs_advised=None,
                       instead_of={"changes": list(candidate), "variant": found[0], "vs_advised": versus})
            found = full_found
            use(found)
        else:
            trail.append(f"{found[0]} against the full advised set {full_found[0]}: {figure(versus)}, "
                         + _guard_text(result, guards[-1]))
    strong = result["variants"].get("strong_generic")
    if strong is not None and strong.get("rejected"):  # a rejected baseline is never compared against
        rec.update(vs_strong_generic=None, strong_generic_rejected=strong["rejected"])
        trail.append(f"strong_generic was rejected ({strong['rejected']}): not compared with it")
    elif strong is not None and strong.get("samples_ms"):
        versus = _ratio(result, strong, found[1])
        if frozenset(strong["changes"]) != frozenset(rec["changes"]):
            guards.append(_guard(result, "strong_generic", ("strong_generic", strong), found, versus))
        if versus["ci"][1] < 1 and frozenset(strong["changes"]) != frozenset(rec["changes"]):
            reason = (f"strong_generic is faster than {found[0]}: {found[0]} is {figure(versus)} of it, the whole "
                      "interval below 1")
            trail.append(reason + f": recommending strong_generic's changes ({' + '.join(strong['changes'])})")
            rec.update(changes=list(strong["changes"]), name=variant_name(strong["changes"]), required_by={},
                       reason=reason, instead_of={"changes": list(rec["changes"]), "variant": found[0],
                                                  "source": rec["source"], "vs_strong_generic": versus},
                       source="strong_generic")
            rec.pop("vs_advised", None)
            use(("strong_generic", strong))
            versus = _ratio(result, strong, strong)
        else:
            trail.append(f"{found[0]} against strong_generic: {figure(versus)}, "
                         + ("the same set" if frozenset(strong["changes"]) == frozenset(rec["changes"]) else
                            _guard_text(result, guards[-1])))
        slower = versus["ci"][1] < 1
        rec.update(vs_strong_generic=versus, slower_than_strong_generic=slower, slower_significant=slower)
    found = _eager_guard(result, rec, found, guards, trail, use)
    trail.append(f"recommended: {rec['name']}"
                 + (f", {figure(rec['speedup'])} over FP32 eager" if rec.get("speedup") else ""))
    return rec


def _eager_guard(result: dict, rec: dict, found: tuple[str, dict], guards: list[dict], trail: list[str],
                 use: Callable[[tuple[str, dict]], None]) -> tuple[str, dict]:
    """The last guard of :func:`recommend`: a recommendation (with changes) whose speedup over FP32 eager lies
    wholly below 1 is slower than doing nothing and is never recommended; the fastest other verified variant whose
    speedup over FP32 eager lies wholly above 1 replaces it (``source`` ``faster_variant``), else FP32 eager, no
    change (``source`` ``fp32_eager``). Its median below 1 with the interval reaching 1: ``undecided``, not
    replaced, measured more (:func:`borderline`). Returns the (name, entry) recommended."""
    eager = _verified(result, [])
    if eager is None or not rec["changes"] or found[0] == eager[0]:
        return found
    versus = _ratio(result, eager[1], found[1])
    guards.append(_guard(result, "fp32_eager", eager, found, versus))
    if versus["ci"][1] >= 1:
        trail.append(f"{found[0]} against FP32 eager ({eager[0]}): {figure(versus)}, "
                     + _guard_text(result, guards[-1]))
        return found
    faster = []
    for name, entry in result["variants"].items():
        if name == eager[0] or name == found[0] or entry.get("rejected") or not entry.get("samples_ms"):
            continue
        ratio = _ratio(result, eager[1], entry)
        if ratio["ci"][0] > 1:
            faster.append((ratio["value"], name, entry, ratio))
    reason = (f"{found[0]} is slower than FP32 eager ({eager[0]}, no change): {figure(versus)}, the whole interval "
              "below 1")
    instead = {"changes": list(rec["changes"]), "variant": found[0], "source": rec["source"], "vs_fp32_eager": versus}
    if faster:
        _, name, entry, ratio = max(faster, key=lambda f: f[0])
        trail.append(reason + f": recommending the fastest verified variant faster than FP32 eager, {name} "
                     f"({figure(ratio)} over FP32 eager)")
        rec.update(changes=list(entry["changes"]), name=variant_name(entry["changes"]), required_by={},
                   source="faster_variant", reason=reason, instead_of=instead)
        chosen = (name, entry)
    else:
        trail.append(reason + ": no verified variant is faster than FP32 eager; recommending FP32 eager (no change)")
        rec.update(changes=[], name=variant_name([]), required_by={}, source="fp32_eager", reason=reason,
                   instead_of=instead)
        chosen = eager
    rec.pop("vs_advised", None)
    use(chosen)
    strong = result["variants"].get("strong_generic")
    if rec.get("vs_strong_generic") is not None and strong is not None and strong.get("samples_ms"):
        versus = _ratio(result, strong, chosen[1])  # the comparison of what is recommended now
        slower = versus["ci"][1] < 1
        rec.update(vs_strong_generic=versus, slower_than_strong_generic=slower, slower_significant=slower)
    return chosen


def verification(result: dict, advised: list[str]) -> dict:
    """The JSON-able ``verification`` record of one workload: the timing result per variant (without the raw
    samples), the processes discarded as busy (the first measurement's and the extra rounds'), the extra rounds of
    borderline decisions (``refined``, ``measure_more``: :func:`operator_profiler.optimize.verify.measure_more`),
    the ablation (:func:`decide`) and every warning (docs/optimize.md#verification)."""
    fields = ("changes", "rejected", "median_ms", "ci_ms", "speedup", "faults_per_iteration", "numerics",
              "numerics_in_dtype", "repetitions", "processes", "iterations_per_repetition", "median_repetition_s",
              "seconds", "rss_after_warmup_bytes", "checks", "rewrites")
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
                        f"{figure(v)}")
    if recommended.get("source") in REPLACING_SOURCES:
        warnings.append(f"the recommendation is {recommended['name']} ({recommended['source']}) instead of "
                        f"{variant_name(recommended['instead_of']['changes'])}: {recommended['reason']}")
    return {"workload": result.get("workload"), "device": result.get("device"), "threads": result.get("threads"),
            "repetitions": result.get("repetitions"), "processes": result.get("processes"),
            "baseline": result.get("baseline"), "rejected_baselines": rejected_baselines,
            "variants": {name: {k: entry.get(k) for k in fields} for name, entry in result["variants"].items()},
            "discarded_processes": [{**d, "measurement": "first"} for d in result.get("discarded_processes") or []]
            + [{**d, "measurement": f"{r.get('of', 'refine')}{r['round']}"} for r in result.get("refined") or []
               for d in r.get("discarded_processes") or []],
            "refined": list(result.get("refined") or []), "measure_more": result.get("measure_more"),
            "ablation": ablation, "warnings": warnings}
