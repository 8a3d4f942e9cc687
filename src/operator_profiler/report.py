"""A first readable report (Markdown): what was profiled, coverage, top operators, layer classes,
modules, and what stayed unattributed and why."""

from __future__ import annotations

import pandas as pd


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _table(df: pd.DataFrame) -> str:
    header = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def render_markdown(
    workload: str,
    run: dict,
    coverage: dict,
    operators: pd.DataFrame,
    modules: pd.DataFrame,
    layer_classes: pd.DataFrame,
    top_operators: int,
) -> str:
    """The report text. Times are shown in ms (the tables on disk keep integer ns)."""
    v = run["versions"]
    iterations = run["harness"]["iterations"]
    lines = [
        f"# Operator profile: `{workload}`",
        "",
        f"- model: `{run['workload']['kind']}`, mode `{run['mode']}`, "
        f"{'compiled (' + run['compile_mode'] + ' torch.compile, Inductor)' if run['compiled'] else 'eager'}",
        f"- device: {v['device']}{' (' + v['device_name'] + ')' if v.get('device_name') else ''}, "
        f"torch {v['torch']}, CUDA {v['cuda_runtime'] or 'none'}, driver {v['driver'] or 'n/a'}",
        f"- measured: {iterations} iterations after {run['harness']['warmup']} warm-up iterations "
        f"(seed {run['harness']['seed']})",
        f"- {coverage['counters_note'] or 'hardware counters: collected'}",
        f"- clocks: {'not locked (CPU run)' if v['device'] == 'cpu' else 'see clocks_applied.json'}",
        "",
        "## Coverage",
        "",
        f"{coverage['attributed_count']} of {coverage['kernel_count']} kernels attributed, "
        f"{coverage['coverage_time'] * 100:.2f}% of {_ms(coverage['kernel_time_ns'])} ms kernel time.",
        "",
        "| path | time share |",
        "|---|---|",
        *[f"| {p} | {s * 100:.2f}% |" for p, s in sorted(coverage["by_path"].items())],
        "",
        f"## Top operators (of {len(operators)})",
        "",
    ]
    top = operators.head(top_operators).assign(
        time_ms=lambda d: d["time_ns"].map(_ms),
        share=lambda d: (d["time_share"] * 100).map("{:.2f}%".format),
        per_iteration_ms=lambda d: d["time_per_iteration_ns"].map(_ms),
    )[["operator", "calls", "kernels", "time_ms", "share", "per_iteration_ms", "paths", "bottleneck"]]
    lines += [_table(top), "", "## Layer classes", ""]
    if len(layer_classes):
        lc = layer_classes.assign(time_ms=lambda d: d["time_ns"].map(_ms),
                                  module_class=lambda d: d["module_class"].fillna("(kernels outside layers)"))[
            ["layer_class", "module_class", "instances", "kernels_per_instance", "time_ms", "representative"]
        ]
        lines += [_table(lc), ""]
        layered = layer_classes[layer_classes["layer_class"] != "rest"]
        if len(layered):
            n, k = int(layered["instances"].sum()), len(layered)
            lines += [f"{n} layer instances form {k} class(es): an ncu replay needs {k} instead of {n} "
                      f"layer replays ({n / k:.1f}x less).", ""]
    else:
        lines += ["No kernels.", ""]
    lines += ["## Modules", ""]
    lines += [_table(modules.assign(time_ms=lambda d: d["time_ns"].map(_ms),
                                    share=lambda d: (d["time_share"] * 100).map("{:.2f}%".format))[
        ["module", "kernels", "time_ms", "share"]]), ""]
    lines += ["## Unattributed kernels", ""]
    if coverage["unattributed"]:
        lines += ["| kernel | count | time (ms) | reason |", "|---|---|---|---|"]
        lines += [f"| `{u['name']}` | {u['count']} | {_ms(u['time_ns'])} | {u['reason']} |" for u in coverage["unattributed"]]
    else:
        lines += ["None: every kernel was attributed."]
    return "\n".join(lines) + "\n"
