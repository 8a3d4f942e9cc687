"""The Nsight Compute metric catalog (``metrics.yaml``) and its aggregation rules.

``load_catalog()`` reads and validates the catalog; ``Catalog.metrics_argument()`` is the value for
``ncu --metrics``; ``Catalog.resolve(columns)`` picks the column to read for each metric;
``aggregate(df, group_columns, catalog)`` merges per-kernel values into one row per group (operator)
by each metric's rule; ``bottleneck(row, catalog)`` labels an aggregated row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pandas as pd

# Not ..config: it imports jsonschema and yaml, which only loading a catalog needs (imported there:
# every analysis job imports this module, few load a catalog; the fixed per-job cost).
from ..errors import ConfigError

ARCHS = ("ampere", "hopper", "blackwell")
RULES = ("sum", "duration_weighted_mean", "max", "ratio")
UNITS = ("ns", "s", "bytes", "bytes/s", "%", "count", "inst", "cycles", "inst/cycle", "threads",
         "registers", "warps", "blocks", "ratio")
LABELS = ("compute-bound", "memory-bound", "latency-bound", "balanced", "unknown")

_NAMES = {"type": "array", "items": {"type": "string", "pattern": r"^[a-z0-9_]+__[A-Za-z0-9_.]+$"}}
_COMPONENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}

SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["metrics", "bottleneck"],
    "additionalProperties": False,
    "properties": {
        "metrics": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "unit", "description", "rule"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": r"^[a-z][a-z0-9_]*$"},
                    "ncu": {
                        "type": "object",
                        "required": ["ampere"],
                        "additionalProperties": False,
                        "properties": {arch: _NAMES for arch in ARCHS},
                    },
                    "labels": {"type": "array", "items": {"type": "string", "minLength": 1}},
                    "unit": {"enum": list(UNITS)},
                    "description": {"type": "string", "minLength": 1},
                    "rule": {"enum": list(RULES)},
                    "numerator": _COMPONENT,
                    "denominator": _COMPONENT,
                    "scale": {"type": "number"},
                },
                "allOf": [
                    {"if": {"properties": {"rule": {"const": "ratio"}}},
                     "then": {"required": ["numerator", "denominator"]},
                     "else": {"required": ["ncu"],
                              "not": {"anyOf": [{"required": ["numerator"]}, {"required": ["denominator"]}]}}},
                ],
            },
        },
        "bottleneck": {
            "type": "object",
            "required": ["compute_metric", "memory_metric", "latency_below_pct", "margin_pct"],
            "additionalProperties": False,
            "properties": {
                "compute_metric": {"type": "string"},
                "memory_metric": {"type": "string"},
                "latency_below_pct": {"type": "number", "minimum": 0, "maximum": 100},
                "margin_pct": {"type": "number", "minimum": 0, "maximum": 100},
            },
        },
    },
}


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    description: str
    rule: str
    ncu: dict[str, tuple[str, ...]] = field(default_factory=dict)  # every arch filled in (inherited)
    labels: tuple[str, ...] = ()
    numerator: tuple[str, ...] = ()
    denominator: tuple[str, ...] = ()
    scale: float = 1.0

    def candidates(self, arch: str | None = None) -> list[str]:
        """ncu names to look for, in order: ``arch``'s names, or every arch's (ampere first)."""
        archs = ARCHS if arch is None else (_check_arch(arch),)
        return list(dict.fromkeys(name for a in archs for name in self.ncu.get(a, ())))


@dataclass(frozen=True)
class Catalog:
    metrics: tuple[Metric, ...]
    bottleneck: dict
    source: str = "metrics.yaml"

    def __getitem__(self, name: str) -> Metric:
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.metrics]

    def replay_metrics(self, arch: str | None = None) -> list[str]:
        """ncu metric names to collect, catalog order, no duplicates.

        With ``arch`` (ampere, hopper, blackwell; see ``arch_for_cc``) only that architecture's names,
        which is what a real ``ncu --metrics`` needs (ncu refuses names the chip does not have);
        without it, the union over all architectures.
        """
        return list(dict.fromkeys(name for m in self.metrics for name in m.candidates(arch)))

    def metrics_argument(self, arch: str | None = None) -> str:
        return ",".join(self.replay_metrics(arch))

    def resolve(self, columns: Iterable[str], arch: str | None = None) -> dict[str, str]:
        """``{our name: column}`` for each metric with a column in ``columns`` (first candidate present
        wins, then its details-page labels). Ratio metrics resolve to their own ncu column, if any."""
        present = set(columns)
        out = {}
        for metric in self.metrics:
            for name in [*metric.candidates(arch), *metric.labels]:
                if name in present:
                    out[metric.name] = name
                    break
        return out


def _check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}: use one of {', '.join(ARCHS)}")
    return arch


def arch_for_cc(cc: str | float) -> str:
    """Catalog architecture for a compute capability: < 9 ampere (incl. Ada 8.9), 9.x hopper, >= 10 blackwell."""
    major = int(float(cc))
    return "ampere" if major < 9 else "hopper" if major == 9 else "blackwell"


def _where(path: Iterable, raw: dict) -> str:
    parts = list(path)
    text = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(parts))
    if len(parts) >= 2 and parts[0] == "metrics" and isinstance(parts[1], int):
        try:
            name = raw["metrics"][parts[1]].get("name")
        except (AttributeError, IndexError, KeyError, TypeError):
            name = None
        if name:
            text += f" (metric {name!r})"
    return text or "(top level)"


def _describe(error: jsonschema.ValidationError, raw: dict) -> str:
    where = _where(error.absolute_path, raw)
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return f"{where}: missing key {', '.join(map(repr, missing))}; add it"
    if error.validator == "enum":
        return f"{where}: {error.instance!r} is not allowed; use one of {', '.join(map(str, error.validator_value))}"
    if error.validator == "additionalProperties":
        allowed = ", ".join(error.schema.get("properties", {}))
        return f"{where}: {error.message}; allowed keys: {allowed}"
    if error.validator == "not" and where.startswith("metrics"):
        return f"{where}: numerator/denominator only go with rule: ratio; remove them or set rule: ratio"
    if error.validator == "pattern":
        return f"{where}: {error.instance!r} does not look like {'an ncu metric name' if '__' in error.validator_value else 'a lowercase key'}"
    return f"{where}: {error.message}"


def _cross_checks(raw: dict) -> list[str]:
    problems = []
    names = [m["name"] for m in raw["metrics"]]
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            problems.append(f"metrics[{i}].name: duplicate metric name {name!r}; rename one")
        seen.add(name)
    for i, m in enumerate(raw["metrics"]):
        if m["rule"] != "ratio":
            if not any(m["ncu"].get(a) for a in ARCHS):
                problems.append(f"metrics[{i}].ncu (metric {m['name']!r}): no ncu metric name for any architecture")
            continue
        for key in ("numerator", "denominator"):
            parts = [m[key]] if isinstance(m[key], str) else m[key]
            for part in parts:
                if part not in seen:
                    problems.append(f"metrics[{i}].{key} (metric {m['name']!r}): unknown metric {part!r}; "
                                    "name a metric of this catalog")
                elif raw["metrics"][names.index(part)]["rule"] == "ratio":
                    problems.append(f"metrics[{i}].{key} (metric {m['name']!r}): {part!r} is itself a ratio; "
                                    "name summed counters")
    for key in ("compute_metric", "memory_metric"):
        if raw["bottleneck"][key] not in seen:
            problems.append(f"bottleneck.{key}: unknown metric {raw['bottleneck'][key]!r}; name a metric of this catalog")
    return problems


def _inherit(ncu: dict) -> dict[str, tuple[str, ...]]:
    out, previous = {}, ()
    for arch in ARCHS:
        previous = tuple(ncu[arch]) if arch in ncu else previous
        out[arch] = previous
    return out


def _names(entry: dict, key: str) -> tuple[str, ...]:
    """A ratio's numerator/denominator: one metric name or a list of them."""
    value = entry.get(key, ())
    return (value,) if isinstance(value, str) else tuple(value)


def validate_catalog(raw, source: str = "metrics.yaml") -> Catalog:
    """Validate a parsed catalog and build the ``Catalog``; ``ConfigError`` names the key and the fix."""
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid metric catalog {source}: the top level must be a mapping with "
                          "'metrics' and 'bottleneck'")
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(raw), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    problems = [_describe(e, raw) for e in errors] if errors else _cross_checks(raw)
    if problems:
        raise ConfigError(f"invalid metric catalog {source}: {'; '.join(problems)}. Fix the entry in {source} "
                          "(rules: sum, duration_weighted_mean, max, ratio with numerator/denominator).")
    metrics = [Metric(name=m["name"], unit=m["unit"], description=m["description"], rule=m["rule"],
                      ncu=_inherit(m.get("ncu", {})), labels=tuple(m.get("labels", ())),
                      numerator=_names(m, "numerator"), denominator=_names(m, "denominator"),
                      scale=float(m.get("scale", 1.0)))
               for m in raw["metrics"]]
    return Catalog(metrics=tuple(metrics), bottleneck=dict(raw["bottleneck"]), source=source)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load and validate a catalog (default: the packaged ``metrics.yaml``)."""
    import yaml

    try:
        if path is None:
            source, text = "metrics.yaml (packaged)", resources.files(__package__).joinpath("metrics.yaml").read_text()
        else:
            source, text = str(path), Path(path).read_text()
        raw = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read metric catalog {path or 'metrics.yaml'}: {exc}") from None
    return validate_catalog(raw, source)


# --------------------------------------------------------------------------------------------------
# Aggregation


def aggregate(df: pd.DataFrame, group_columns: str | list[str], catalog: Catalog,
              duration_column: str = "duration_ns", arch: str | None = None) -> pd.DataFrame:
    """One row per group: each resolved catalog metric combined by its rule.

    ``df`` has one row per kernel with ncu metric columns (names or details-page labels, see
    ``Catalog.resolve``) and, for the weights, ``duration_column`` (timeline durations; when that
    column is absent, the catalog's ``kernel_time`` column). A kernel without a value is left out of
    that metric's numerator and weight. Output columns: the group columns, ``kernels``,
    ``counters_kernels`` (kernels with at least one catalog value), then per metric its value and
    ``<metric>_coverage`` (fraction of the group's kernels that had a value). Metrics with no column
    in ``df`` are omitted.
    """
    groups = [group_columns] if isinstance(group_columns, str) else list(group_columns)
    resolved = catalog.resolve(df.columns, arch)
    values = {name: pd.to_numeric(df[col], errors="coerce").astype("float64") for name, col in resolved.items()}
    if duration_column in df.columns:
        weight = pd.to_numeric(df[duration_column], errors="coerce").astype("float64")
    elif "kernel_time" in values:
        weight = values["kernel_time"]
    else:
        weight = None
    keys = [df[g] for g in groups]

    def grouped(series: pd.Series):
        return series.groupby(keys, sort=False, dropna=False, observed=True)

    out = {"kernels": grouped(pd.Series(1, index=df.index)).sum()}
    any_value = pd.Series(False, index=df.index)
    for metric in catalog.metrics:
        if metric.rule == "ratio" and all(p in values for p in (*metric.numerator, *metric.denominator)):
            num = sum(values[p] for p in metric.numerator)
            den = sum(values[p] for p in metric.denominator)
            valid = num.notna() & den.notna()
            n = grouped(num.where(valid)).sum(min_count=1)
            d = grouped(den.where(valid)).sum(min_count=1)
            value = (n / d.where(d != 0)) * metric.scale
        elif metric.name not in values:
            continue
        elif metric.rule == "sum":
            valid = values[metric.name].notna()
            value = grouped(values[metric.name]).sum(min_count=1)
        elif metric.rule == "max":
            valid = values[metric.name].notna()
            value = grouped(values[metric.name]).max()
        else:  # duration_weighted_mean, or a ratio without its components
            if weight is None:
                raise ValueError(f"cannot weight {metric.name!r}: no {duration_column!r} column and no kernel_time "
                                 "metric in the data")
            v = values[metric.name]
            valid = v.notna() & weight.notna()
            w = weight.where(valid)
            total = grouped(w).sum(min_count=1)
            value = grouped(v.where(valid) * w).sum(min_count=1) / total.where(total != 0)
        any_value |= valid
        out[metric.name] = value
        out[f"{metric.name}_coverage"] = grouped(valid.astype("float64")).mean()
    out["counters_kernels"] = grouped(any_value.astype("int64")).sum()
    result = pd.DataFrame(out)
    ordered = ["kernels", "counters_kernels"] + [c for c in result.columns if c not in ("kernels", "counters_kernels")]
    result = result[ordered].reset_index()
    result.columns = groups + ordered
    return result


def bottleneck(row: Mapping, catalog: Catalog) -> str:
    """compute-bound, memory-bound, latency-bound, balanced or unknown (rule in metrics.yaml)."""
    cfg = catalog.bottleneck
    compute, memory = row.get(cfg["compute_metric"]), row.get(cfg["memory_metric"])
    if compute is None or memory is None or pd.isna(compute) or pd.isna(memory):
        return "unknown"
    compute, memory = float(compute), float(memory)
    if max(compute, memory) < cfg["latency_below_pct"]:
        return "latency-bound"
    if compute - memory >= cfg["margin_pct"]:
        return "compute-bound"
    if memory - compute >= cfg["margin_pct"]:
        return "memory-bound"
    return "balanced"


def label_bottlenecks(table: pd.DataFrame, catalog: Catalog) -> pd.Series:
    """``bottleneck`` for every row of an aggregated table."""
    return pd.Series([bottleneck(row, catalog) for row in table.to_dict("records")], index=table.index,
                     dtype=object, name="bottleneck")


__all__ = [
    "ARCHS",
    "LABELS",
    "RULES",
    "SCHEMA",
    "Catalog",
    "Metric",
    "aggregate",
    "arch_for_cc",
    "bottleneck",
    "label_bottlenecks",
    "load_catalog",
    "validate_catalog",
]
