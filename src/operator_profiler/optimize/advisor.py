"""The advisor: the rule catalog (``optimize/catalog.yaml``) evaluated over one attributed profile.

Each rule reads one evidence measure (optimize/evidence.py); when its value is within the rule's bounds across
the measured iterations (the measure's interquartile range over them, and the profile's figure, all inside the
bounds) and the run matches the rule's ``when``, the rule's change is *offered* if the change's preconditions hold
on this machine (transforms/changes.py), else listed as *not offered* with the reason. A measure whose interval
straddles a bound makes its rule *borderline*: listed, never advised (one figure must not decide what a busier
minute of the machine would not). A capture on a busy machine (run.json ``machine_load``) is a warning. The advised variant is the offered changes in
catalog order, plus the changes they need (``compile`` for freezing) and the workload's own compile setting.
Errors: :class:`ConfigError` for a catalog that does not parse or names an unknown change/measure/key (file, rule
and key named); :class:`InputError` (via results.read) for a missing profile file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from .. import results
from ..errors import ConfigError
from . import evidence

CATALOG = Path(__file__).with_name("catalog.yaml")
RULE_KEYS = {"change", "measure", "min", "max", "when", "order", "expect", "enabled"}
WHEN_KEYS = {"compiled": bool, "device": str, "mode": str}
WHEN_VALUES = {"device": ("cpu", "cuda"), "mode": ("inference", "train")}


@dataclass(frozen=True)
class Rule:
    id: str
    change: str
    measure: str
    min: float | None
    max: float | None
    when: dict
    order: int
    expect: str
    enabled: bool


def load_catalog(path: Path = CATALOG) -> list[Rule]:
    """The catalog's rules in advised order (``order``, then id). Raises ConfigError naming the file, rule, key."""
    from ..transforms.vocabulary import CHANGES

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the rule catalog ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: the rule catalog is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: the rule catalog must be a mapping of rule ids to rules")
    rules = []
    for rule_id, spec in data.items():
        where = f"{path}: rule {rule_id!r}"
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: must be a mapping with keys {sorted(RULE_KEYS)}")
        unknown = set(spec) - RULE_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(RULE_KEYS)}")
        for key in ("change", "measure", "order"):
            if key not in spec:
                raise ConfigError(f"{where}: '{key}' is required")
        if spec["change"] not in CHANGES:
            raise ConfigError(f"{where}: change {spec['change']!r} is not a known change (known: "
                              f"{', '.join(CHANGES)}); only changes that keep what the model computes exist")
        if spec["measure"] not in evidence.MEASURES:
            raise ConfigError(f"{where}: measure {spec['measure']!r} is not known (known: "
                              f"{', '.join(evidence.MEASURES)})")
        for key in ("min", "max"):
            if key in spec and (isinstance(spec[key], bool) or not isinstance(spec[key], (int, float))):
                raise ConfigError(f"{where}: '{key}' must be a number, got {spec[key]!r}")
        if isinstance(spec["order"], bool) or not isinstance(spec["order"], int):
            raise ConfigError(f"{where}: 'order' must be an integer, got {spec['order']!r}")
        when = spec.get("when") or {}
        if not isinstance(when, dict):
            raise ConfigError(f"{where}: 'when' must be a mapping of {sorted(WHEN_KEYS)}")
        for key, value in when.items():
            if key not in WHEN_KEYS or not isinstance(value, WHEN_KEYS[key]):
                raise ConfigError(f"{where}: when.{key}: expected one of {sorted(WHEN_KEYS)} with a "
                                  f"{'boolean' if WHEN_KEYS.get(key) is bool else 'string'} value, got {value!r}")
            if key in WHEN_VALUES and value not in WHEN_VALUES[key]:
                raise ConfigError(f"{where}: when.{key}: {value!r} is not one of {', '.join(WHEN_VALUES[key])} (a rule "
                                  "whose condition no run has never fires)")
        low, high = spec.get("min"), spec.get("max")
        if any(isinstance(v, float) and v != v for v in (low, high)) or (
                low is not None and high is not None and low > high):
            raise ConfigError(f"{where}: min {low!r} and max {high!r} leave no value: the rule could never fire")
        enabled = spec.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{where}: 'enabled' must be true or false, got {enabled!r}")
        rules.append(Rule(str(rule_id), spec["change"], spec["measure"], spec.get("min"), spec.get("max"), when,
                          spec["order"], str(spec.get("expect", "")), enabled))
    return sorted(rules, key=lambda r: (r.order, r.id))


def load_profile(folder: Path, shapes_trace: Path | None = None) -> evidence.Profile:
    """A results folder's operators, attribution, run.json and coverage (+ conv input layouts from the shapes
    iteration when given)."""
    folder = Path(folder)
    profile = evidence.Profile(
        operators=results.read(results.OPERATORS, folder / results.OPERATORS.path),
        kernels=results.read(results.ATTRIBUTION, folder / results.ATTRIBUTION.path),
        run=results.read(results.RUN, folder / results.RUN.path),
        coverage=results.read(results.COVERAGE, folder / results.COVERAGE.path),
    )
    if shapes_trace is not None and Path(shapes_trace).is_file():
        from ..timeline import kineto

        profile.conv_layouts = evidence.conv_layouts(kineto.read_kineto(Path(shapes_trace)).ranges)
    else:
        profile.shapes_note = "no shapes iteration was recorded for this profile"
    return profile


def _when_problem(rule: Rule, profile: evidence.Profile) -> str | None:
    facts = {"compiled": profile.compiled, "device": profile.device, "mode": profile.mode}
    for key, want in rule.when.items():
        if facts[key] != want:
            return f"the run's {key} is {facts[key]!r}, the rule needs {want!r}"
    return None


def _in_bounds(rule: Rule, value: float) -> bool:
    return (rule.min is None or value >= rule.min) and (rule.max is None or value <= rule.max)


def _verdict(rule: Rule, m: evidence.Measure) -> str:
    """``fires`` (the figure and the whole interval within the bounds), ``outside`` (the figure and the whole
    interval outside them) or ``borderline`` (the interval straddles a bound, or the figure and the interval
    disagree). Without an interval the figure alone decides (``fires``/``outside``)."""
    if m.interval is None:
        return "fires" if _in_bounds(rule, m.value) else "outside"
    low, high = m.interval["low"], m.interval["high"]
    if _in_bounds(rule, m.value) and _in_bounds(rule, low) and _in_bounds(rule, high):
        return "fires"
    disjoint = (rule.min is not None and high < rule.min) or (rule.max is not None and low > rule.max)
    return "outside" if disjoint and not _in_bounds(rule, m.value) else "borderline"


def load_warning(run: dict) -> str | None:
    """The warning for a capture on a busy machine (run.json ``machine_load.busy``), else None."""
    load = run.get("machine_load") or {}
    if not load.get("busy"):
        return None
    return (f"the machine was busy during the capture: other processes kept {load['other_cpu_load']:.2f} CPUs busy "
            f"on average during the measured iterations (busy above {load['threshold']:g}: {load.get('usable_cpus')} "
            f"usable CPUs, {load.get('threads')} torch thread(s)); operator times were inflated and the shares the "
            "rules read may have moved (a quiet and a busy capture of one model read its attention share as 15.7% "
            "and 6.5%): capture again on a quiet machine before acting on this advice")


def _bounds(rule: Rule) -> str:
    return " and ".join(part for part in (f">= {rule.min:g}" if rule.min is not None else "",
                                          f"<= {rule.max:g}" if rule.max is not None else "") if part)


def diagnoses(profile: evidence.Profile, measures: dict[str, evidence.Measure]) -> list[str]:
    """Findings in words that no change of the catalog fixes by itself (the LSTM's recurrence)."""
    found = []
    rnn = measures.get("rnn_share")
    if rnn is not None and rnn.value and rnn.value >= 0.3:
        layer_ops = [i for i in rnn.items if i["operator"] in ("aten::mkldnn_rnn_layer", "aten::_cudnn_rnn")]
        top = layer_ops[0] if layer_ops else rnn.items[0]
        library = "cuDNN" if profile.device == "cuda" else "oneDNN"
        found.append(
            f"The time is the recurrent layers': {rnn.value:.0%} of kernel time in library RNN operators "
            f"({top['text']}). {top['operator']} is {library}'s whole-layer RNN kernel: one call runs a layer's "
            "recurrence, sequence_length dependent steps of small GEMMs (the hidden state feeds the next step), so "
            "it cannot fuse with its neighbours or parallelise over time. The structural fix is to keep it that "
            "way: compile the rest of the model but not the RNN (keep_rnn_library; an unrolled recurrence is "
            "sequence_length x layers small kernels), and make each step's GEMM cheaper (TF32/bf16 where the "
            "hardware computes them natively); a larger batch would amortise the steps but changes the workload.")
    spills = measures.get("spill_share")
    if spills is not None and spills.value and spills.value >= 0.1:
        found.append(f"{spills.value:.0%} of kernel time is in operators whose kernels spill registers to local "
                     f"memory ({spills.items[0]['text']}): a compiler or library choice, not a model change; "
                     "max_autotune may pick a kernel that does not spill.")
    return found


def advise(profile: evidence.Profile, rules: list[Rule], features: dict, workload: str,
           catalog: Path = CATALOG) -> dict:
    """advice.json's content for one profile: offered, not offered, borderline and not triggered rules (each with
    its measure's figure and per-iteration interval), the advised changes (ordered) with each one's source, the
    measures quoted, the diagnoses, the capture's machine load and the warnings (a busy capture)."""
    from ..transforms.vocabulary import CHANGES, MODES, precondition_problems

    measures = {name: fn(profile) for name, fn in evidence.MEASURES.items()}
    per_iteration = evidence.iteration_profiles(profile)
    read = {rule.measure for rule in rules if rule.enabled and _when_problem(rule, profile) is None}
    for name in read:  # only the measures a rule reads: each costs one evaluation per iteration
        evidence.iteration_interval(measures[name], evidence.MEASURES[name], per_iteration)
    warnings = [w for w in [load_warning(profile.run)] if w]
    offered, not_offered, not_triggered, borderline = [], [], [], []
    for rule in rules:
        m = measures[rule.measure]
        record = {"rule": rule.id, "change": rule.change, "measure": rule.measure, "value": m.value,
                  "interval": m.interval and {k: m.interval[k] for k in ("low", "high", "median", "iterations")},
                  "bounds": _bounds(rule)}
        if not rule.enabled:
            not_triggered.append({**record, "reason": "disabled in the catalog"})
            continue
        problem = _when_problem(rule, profile)
        if problem is None and m.value is None:
            problem = f"{rule.measure} is unknown: {m.note}"
        verdict = _verdict(rule, m) if problem is None else None
        if verdict == "outside":
            problem = f"{m.quote()}, {m.interval_text()}; the rule needs {_bounds(rule)}"
        if problem is not None:
            not_triggered.append({**record, "reason": problem})
            continue
        if verdict == "borderline":
            borderline.append({**record, "evidence": m.quote(), "reason": (
                f"borderline: {rule.measure} {m.interval_text()} against the rule's {_bounds(rule)} (the profile's "
                f"figure {evidence._fmt(m.value, m.unit)}): the measure does not clear the threshold across the "
                "iterations, so the change is not advised; capture again (more iterations, a quiet machine) to "
                "decide")})
            continue
        if m.interval is None:
            record["interval_note"] = (f"decided on the profile's single figure: {m.interval_note}")
        record.update(evidence=m.quote(), items=m.items[:evidence.QUOTED_ITEMS], expect=rule.expect,
                      operators=[i["operator"] for i in m.items if "operator" in i])
        # a change that needs torch.compile brings it along (the advised variant adds it)
        needed = [rule.change] + (["compile"] if "compile" in CHANGES[rule.change].needs else [])
        problems = precondition_problems(needed, profile.device, MODES.get(profile.mode, profile.mode), features)
        if problems:
            not_offered.append({**record, "reason": "; ".join(problems)})
        else:
            offered.append(record)

    sources: dict[str, str] = {}
    if profile.compiled:
        sources["compile"] = "the workload's own setting (compile: true)"
    for record in offered:
        sources.setdefault(record["change"], f"rule {record['rule']}")
    for record in offered:
        if "compile" in CHANGES[record["change"]].needs and "compile" not in sources:
            sources["compile"] = f"needed by {record['change']} (rule {record['rule']})"
    order = {rule.change: rule.order for rule in rules}
    order.setdefault("compile", 30)
    advised = sorted(sources, key=lambda c: (order.get(c, 1000), list(CHANGES).index(c)))
    return {
        "workload": workload,
        "device": profile.device, "mode": profile.mode, "compiled": profile.compiled,
        "catalog": str(catalog), "catalog_sha256": hashlib.sha256(Path(catalog).read_bytes()).hexdigest(),
        # what the preconditions read (the full CPU flag list is /proc/cpuinfo's)
        "machine_features": {k: (sorted(v) if isinstance(v, (set, frozenset)) else v)
                             for k, v in features.items() if k != "cpu_flags"},
        "measures": {name: m.to_json() for name, m in measures.items()},
        "advice": offered, "not_offered": not_offered, "not_triggered": not_triggered, "borderline": borderline,
        "advised_changes": advised, "sources": sources,
        "diagnoses": diagnoses(profile, measures),
        "machine_load": profile.run.get("machine_load"), "warnings": warnings,
    }
