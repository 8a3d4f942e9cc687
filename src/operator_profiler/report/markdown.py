"""A first readable report (Markdown): what was profiled, coverage, top operators, their work and roofline,
layer classes, modules, and what stayed unattributed and why."""

from __future__ import annotations

import os

import pandas as pd

from ..aggregate import UNATTRIBUTED
from ..results import ReportInputs
from . import advice_view, roofline_view

# The hardware metrics shown per operator (catalog name, label, scale from the catalog's base unit).
KEY_COUNTERS = (("sm_sol", "SM SOL %", 1), ("memory_sol", "memory SOL %", 1), ("dram_bytes", "DRAM MB", 1e-6),
                ("achieved_occupancy", "occupancy %", 1))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith(("ch", "sh", "s", "x")) else "s")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


# A kernel or operator name in a table cell is cut to this many characters (demangled C++ template names run to
# kilobytes; the tables on disk keep them whole, report.html shows them whole on hover).
NAME_CHARS = 120


def middle_cut(name: str, limit: int = NAME_CHARS) -> str:
    """``name`` cut in the middle to ``limit`` characters (head … tail): template names differ at their end."""
    if len(name) <= limit:
        return name
    head = limit // 2
    return name[:head] + "…" + name[len(name) - (limit - head - 1):]


def short_names(names, limit: int = NAME_CHARS) -> list[str]:
    """Each name cut in the middle to at most ``limit`` characters (:func:`middle_cut`), distinct names kept
    distinct where the cut would merge them: long names alike at both ends (``…<float>, std::array…`` and
    ``…<double>, std::array…``) show, after the head, the part where they first differ (then ``…``). Names that
    still collide (alike over that whole window) keep the same text; :func:`report_html.bar_labels` numbers them."""
    names = [str(name) for name in names]
    cuts = [middle_cut(name, limit) for name in names]
    groups: dict[str, set[str]] = {}
    for name, cut in zip(names, cuts):
        groups.setdefault(cut, set()).add(name)
    head, window = limit // 2, limit - limit // 2 - 2
    for i, (name, cut) in enumerate(zip(names, cuts)):
        if len(groups[cut]) < 2:
            continue
        differ = len(os.path.commonprefix(sorted(groups[cut])))  # where the names of this cut first differ
        start = max(head, differ - window // 3)
        rest = name[start:]
        cuts[i] = name[:head] + "…" + (rest if len(rest) <= window + 1 else rest[:window] + "…")
    return cuts


def operator_count(names) -> int:
    """How many of the operators table's names are operators: the ``(unattributed)`` row (kernels no path
    attributed) is not one."""
    return sum(1 for name in names if name != UNATTRIBUTED)


def operators_phrase(n: int) -> str:
    """``58 operators``, ``1 operator``, or ``no operator found``."""
    return _plural(n, "operator") if n else "no operator found"


def _table(df: pd.DataFrame) -> str:
    header = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def compile_scope_text(run: dict) -> str:
    """How the model ran: ``eager``, or the compile scope, mode/options and what layer membership rests on
    (run.json ``compile_scope``; runs recorded before it name ``compile_mode`` regional/whole_model)."""
    if not run.get("compiled"):
        return "eager"
    scope = run.get("compile_scope") or {"regional": "layers", "whole_model": "model"}.get(run.get("compile_mode"))
    settings = (f"options `{run['compile_options']}`" if run.get("compile_options")
                else f"mode `{run['compile_mode']}`" if run.get("compile_scope") and run.get("compile_mode") else "")
    settings = f", {settings}" if settings else ""
    if scope == "model":
        ranges = "" if not run.get("layers") else "; layers of compiled kernels from their FX nodes (no layer ranges)"
        return f"compiled, compile scope **model** (torch.compile of the whole model{settings}; Inductor){ranges}"
    if scope == "layers":
        return (f"compiled, compile scope **layers** (each layer instance's forward compiled on its own{settings}; "
                "Inductor; stem and head eager, no fusion across layers)")
    return "compiled (Inductor)"


def _model_line(run: dict) -> str:
    w = run["workload"]
    model = f"`{w['kind']}`" + (f" (factory `{w['factory']}`)" if w.get("factory") else "")
    notes = "".join(f"; **note**: {n}" for n in run.get("compile_notes") or [])
    line = f"- model: {model}, mode `{run['mode']}`, {compile_scope_text(run)}{notes}"
    step = run.get("train_step")
    if step:
        loss = (f"loss `{step['loss'].removeprefix('loss_fn ')}`" if step["loss"].startswith("loss_fn ")
                else "the default loss (a 0-dim output or a dict's `loss` as is, else the mean square of the "
                     "output's tensors)")
        line += (f"; each iteration is one train step: forward + loss, backward, `{step['optimizer_class']}` "
                 f"(lr {step['lr']:g}) `step()` + `zero_grad()`; {loss}")
    return line


FIRST_SLOWEST = ("the first measured iteration is the slowest, as is usual right after the profiler starts; "
                 "the per-iteration medians are not affected")


def iteration_spread(coverage: dict) -> dict | None:
    """The kernel time per measured iteration (coverage.json ``iteration_time_ns``, keyed by iteration index):
    ``median_ns``, ``min_ns``, ``max_ns``, ``skewed`` (the slowest iteration took over 1.25x the fastest) and
    ``first_slowest`` (the slowest is the first measured iteration, the lowest index: the profiler's start-up,
    which warm-up iterations do not remove); None with fewer than 2 iterations."""
    by_index = {int(i): t for i, t in coverage.get("iteration_time_ns", {}).items()}
    per_iteration = sorted(by_index.values())
    if len(per_iteration) < 2:
        return None
    lo, hi = per_iteration[0], per_iteration[-1]
    median = per_iteration[len(per_iteration) // 2] if len(per_iteration) % 2 else (
        per_iteration[len(per_iteration) // 2 - 1] + per_iteration[len(per_iteration) // 2]) / 2
    return {"median_ns": median, "min_ns": lo, "max_ns": hi, "skewed": bool(lo and hi > 1.25 * lo),
            "first_slowest": by_index[min(by_index)] == hi and hi > lo}


def _iteration_spread(coverage: dict, advice: str = "compare the per-iteration medians below, or add warm-up "
                                                     "iterations", first: str = FIRST_SLOWEST) -> list[str]:
    """The spread line; when skewed, a warning with ``advice`` (bold), or, when the slowest iteration is the
    first measured one (the usual profiler start-up), ``first`` instead (plain: no action helps)."""
    spread = iteration_spread(coverage)
    if spread is None:
        return []
    line = (f"Kernel time per iteration: median {_ms(spread['median_ns'])} ms, min {_ms(spread['min_ns'])}, "
            f"max {_ms(spread['max_ns'])}.")
    ratio = spread["max_ns"] / spread["min_ns"] if spread["min_ns"] else 0.0
    if spread["skewed"] and spread["first_slowest"]:
        line += f" The slowest iteration took {ratio:.1f}x the fastest: {first}."
    elif spread["skewed"]:
        line += (f" **The slowest iteration took {ratio:.1f}x the fastest**: the "
                 f"machine was busy or the model is not in steady state; {advice}.")
    return ["", line]


def _imported_lines(coverage: dict, diagnostics: dict | None) -> list[str]:
    """Header of a report on a trace captured elsewhere (no run.json): what the timeline says."""
    lines = []
    if diagnostics:
        # CUDA devices only: Windows exports also list display adapters (no streaming multiprocessors).
        gpus = ", ".join(sorted({str(d.get("name")) for d in diagnostics.get("devices", [])
                                 if d.get("name") and d.get("smCount", 1)}))
        if diagnostics.get("format") == "kineto":
            lines += [f"- trace: `{diagnostics.get('file')}` (torch.profiler / Kineto, "
                      f"{diagnostics.get('time_base', 'unknown').replace('_', ' ')} timestamps), captured elsewhere"]
        else:
            lines += [f"- trace: `{diagnostics.get('file')}` (Nsight Systems {diagnostics.get('product_version') or 'unknown'}, "
                      f"export schema {diagnostics.get('schema_version') or 'unknown'}), captured elsewhere"]
        lines += [f"- GPU(s): {gpus or 'not recorded'}"]
    else:
        lines += ["- trace captured elsewhere (no run.json): model, device and clocks are not known"]
    measured = len(coverage.get("iteration_time_ns", {}))
    lines += [f"- measured: {_plural(measured, 'iteration range') if measured else 'no iteration ranges: the whole trace'}"
              "; times below are totals over the trace",
              f"- {counters_text(coverage)}",
              "- clocks: unknown (not captured by this workflow)"]
    return lines


def _dedup_lines(matching: dict | None) -> list[str]:
    """Counters per layer class: measured, broadcast by position, missing; and the dedup.verify check."""
    broadcast = (matching or {}).get("broadcast")
    if not broadcast:
        return []
    lines = ["Hardware counters per layer class (measured on the replayed instance, copied by position to the "
             "others; a kernel whose position names another kernel gets none):", "",
             "| layer_class | kernels | measured | copied | without counters | largest difference between two "
             "replayed instances |", "|---|---|---|---|---|---|"]
    for cls, entry in broadcast.items():
        verify = entry.get("verify_max_relative_difference")
        worst = max(verify.items(), key=lambda kv: kv[1]) if verify else None
        check = f"{worst[1] * 100:.1f}% ({worst[0]})" if worst else "not verified"
        lines.append(f"| {cls} | {entry['kernels']} | {entry['measured']} | {entry['filled']} | "
                     f"{entry['without_counters']} | {check} |")
    return lines + [""]


def ncu_versions(replays: list[dict]) -> str:
    """The Nsight Compute version(s) the replays ran (replay.json ``ncu_version``), or ``unknown``."""
    versions = sorted({str(r.get("ncu_version")) for r in replays if r.get("ncu_version")})
    return " / ".join(versions) if versions else "unknown"


def _replay_lines(replays: list[dict] | None) -> list[str]:
    """Measured ncu replay time per layer class against replaying every layer instance (N/K per class)."""
    if not replays:
        return []
    from ..ncu.plan import replay_estimate

    est = replay_estimate(replays)
    lines = [f"ncu replay time (Nsight Compute {ncu_versions(replays)}; wall seconds of the ncu runs, harness "
             "re-run included; the estimate scales each class by its instances / replayed instances):", "",
             "| layer_class | instances | replayed | kernels | ncu runs | measured (s) | every instance (s) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['class']} | {r['instances']} | {r['replayed']} | {r['kernels']} | {r['runs']} | "
              f"{r['wall_s']:.1f} | {r['estimate_all_s']:.1f} |" for r in est["classes"]]
    saved = f" ({est['estimate_all_s'] / est['wall_s']:.1f}x)" if est["wall_s"] else ""
    lines += ["", f"Replaying {est['replayed']} of {est['instances']} instances took {est['wall_s']:.1f} s; replaying "
                  f"every instance would take about {est['estimate_all_s']:.1f} s{saved}.", ""]
    return lines + metric_lines(replays)


def metric_lines(replays: list[dict] | None) -> list[str]:
    """The catalog metrics the replays did not collect, with why (replay.json ``metrics``: names the chip lacks,
    names ncu refused or could not access), and how the compute capability was known; nothing when every name
    was collected."""
    dropped: dict[str, str] = {}
    for r in replays or []:
        m = r.get("metrics") or {}
        for d in m.get("dropped") or []:
            dropped.setdefault(d["name"], d["reason"])
        for name in m.get("not_collected") or []:
            dropped.setdefault(name, "ncu could not access it during the replay")
    lines = []
    query = next(((r.get("metrics") or {}).get("query") for r in replays or [] if (r.get("metrics") or {}).get("query")),
                 None)
    if query and query.get("error"):
        lines.append(f"The chip's metrics could not be queried before the replays ({query['error']}).")
    if dropped:
        lines += [f"**{_plural(len(dropped), 'catalog metric')} not collected** (missing counters, never zeros):", ""]
        lines += [f"- `{name}`: {why}" for name, why in dropped.items()]
    return lines + [""] if lines else []


def _unknown_time_lines(operators: pd.DataFrame) -> list[str]:
    if "kernels_without_time" not in operators or not operators["kernels_without_time"].any():
        return []
    rows = operators[operators["kernels_without_time"] > 0]
    return ["", "Time **unknown** (kernel records with invalid timestamps, counted as 0 ms above): "
            + "; ".join(f"`{r.operator}` {_plural(int(r.kernels_without_time), 'kernel')}" for r in rows.itertuples())
            + "."]


def _outside_iterations(coverage: dict) -> list[str]:
    outside = coverage.get("outside_iterations_time_ns")
    if not outside:
        return []
    return ["", f"**{_ms(outside)} ms of the {_ms(coverage['kernel_time_ns'])} ms kernel time lies outside the "
                "measured iterations** (warm-up or teardown work in the trace window): it counts in the totals "
                "and shares, not in the per-iteration columns."]


def _clocks_text(clocks: dict | None) -> str:
    """The capture's clocks_applied.json in one line: what was locked and what the read-backs during the job
    showed, or that the whole profile ran with clocks not locked (policy none, or a lock that did not hold:
    ``lock_lost``; durations then drift with boost and temperature). A record without read-backs during the
    job (written before they existed) says it was verified before the job only."""
    if not clocks:
        return "unknown (no capture/clocks_applied.json)"
    if not clocks.get("locked"):
        if clocks.get("lock_lost"):
            return (f"**not locked**: the lock was set but did not hold: {clocks['lock_lost']}: durations may drift "
                    "with boost clocks")
        return f"**not locked** ({clocks.get('reason') or 'policy none'}): durations may drift with boost clocks"
    during = clocks.get("readback_during_job")
    want = clocks.get("requested") or clocks.get("applied") or {}
    how = ("locked to the base TDP clock (`nvidia-smi -lgc tdp,tdp`) at" if want.get("sm_lock") == "tdp"
           else "locked at")
    text = (f"{how} SM {want.get('sm_mhz', '?')} MHz, memory {want.get('mem_mhz', '?')} MHz on "
            f"{clocks.get('gpu') or 'the GPU'}")
    if during:
        def span(lo, hi):
            return f"{lo}" if lo == hi else f"{lo}-{hi}"

        text += (f" (read back during the job: SM {span(during.get('sm_mhz_min'), during.get('sm_mhz_max'))} MHz, "
                 f"memory {span(during.get('mem_mhz_min'), during.get('mem_mhz_max'))} MHz, {during.get('samples')} "
                 f"samples over {during.get('job_s', 0):.1f} s)")
    else:  # a clocks_applied.json written before read-backs during the job existed
        text += " (read back before the job only: not verified while it ran)"
    if clocks.get("restored") is False:
        text += "; **not restored afterwards**"
    return text + "".join(f"; warning: {w}" for w in clocks.get("warnings") or [])


def _share(coverage: dict, path: str, key: str) -> str:
    """What a path answered on its own (``path_coverage``), whatever the merge chose."""
    entry = (coverage.get("path_coverage") or {}).get(path)
    return f"{entry[key] * 100:.2f}%" if entry else "-"


def _agreement_lines(coverage: dict) -> list[str]:
    counts = coverage.get("path_agreement_counts") or {}
    if not counts:
        return []
    return ["", "Where two paths both named an operator: "
            + "; ".join(f"{pair} agree on {a['agree']} of {a['both']} kernels ({a['agree'] / a['both'] * 100:.1f}%)"
                        for pair, a in sorted(counts.items())) + "."]


def external_id_lines(coverage: dict) -> list[str]:
    """One line when kernels' Kineto ``External id`` names another op than the launch's (coverage.json
    ``external_id_disagreements``); nothing when none disagrees."""
    found = coverage.get("external_id_disagreements") or {}
    if not found.get("count"):
        return []
    line = (f"**{_plural(found['count'], 'kernel')} ({_ms(found['time_ns'])} ms) carry an `External id` naming "
            f"another op than the one around their launch** (of {found['checked']} checked): their operator is "
            "the launch's (CUPTI correlation); the trace's op ids are not to be trusted.")
    example = (found.get("examples") or [None])[0]
    if example:
        named = (f"names `{example['external_id_op']}`" if example.get("external_id_op")
                 else "names no op in the trace")
        line += (f" E.g. `{middle_cut(example['name'], 60)}` launched in `{example['operator']}`: its External id "
                 f"{example['external_id']} {named}.")
    return ["", line]


def user_annotation_lines(coverage: dict) -> list[str]:
    """One line when kernels were named by a user annotation (path ``user_annotation``), so that a
    region's name is not read as an ATen op."""
    share = (coverage.get("by_path") or {}).get("user_annotation")
    entry = (coverage.get("path_coverage") or {}).get("user_annotation")
    if share is None or not entry:
        return []
    kernels = round(entry["count"] * coverage["kernel_count"])
    return ["", f"{_plural(kernels, 'kernel')} ({share * 100:.2f}% of kernel time) had no operator around their "
                "launch and carry the name of the `record_function` annotation around it instead (path "
                "`user_annotation`, e.g. an optimizer step): a region of the program, not an ATen op."]


def _invalid_time_line(coverage: dict) -> list[str]:
    valid = coverage.get("valid_timed_kernels")
    if valid is None or valid == coverage["kernel_count"]:
        return []
    return ["", f"**{coverage['kernel_count'] - valid} kernel record(s) carry invalid timestamps** (ts 0 or a "
                "negative duration): attributed, but counted with 0 ns."]


def _notes(diagnostics: dict | None) -> list[str]:
    if not diagnostics or not (diagnostics.get("warnings") or diagnostics.get("info")):
        return []
    unknown = diagnostics.get("launches_without_kernel_by_operator") or {}
    return ["", "## Capture notes", "", *[f"- warning: {w}" for w in diagnostics.get("warnings", [])],
            *[f"- device time **unknown** (launch without kernel record) for `{op}`: {_plural(n, 'launch')}"
              for op, n in sorted(unknown.items())],
            *[f"- {i}" for i in diagnostics.get("info", [])]]


def no_kernel_warnings(diagnostics: dict | None) -> list[str]:
    """The timeline reader's warnings that say why a trace has no kernel records (e.g. CUPTI range-profiler mode)."""
    return [w for w in (diagnostics or {}).get("warnings", []) if w.startswith("no kernel events")]


def warmup_iterations(run: dict) -> int:
    """The warm-up iterations the harness ran (run.json ``warmup.iterations``; ``harness.warmup`` for a run.json
    written before warm-up ran until steady)."""
    return int((run.get("warmup") or {}).get("iterations", run["harness"]["warmup"]))


def warmup_text(run: dict) -> str:
    """The warm-up in words: how many iterations and whether they became steady (run.json ``warmup``,
    ``harness.warm_up_until_steady``); the plain count for an older run.json."""
    w = run.get("warmup")
    n = warmup_iterations(run)
    if not w:
        return _plural(n, "warm-up iteration")
    rule = (f"median of the last {w['window']} iteration times within {w['tolerance'] * 100:g}% of the "
            f"{w['window']} before")
    if w["steady"]:
        return f"{_plural(n, 'warm-up iteration')} (until steady: {rule})"
    if w["steady"] is None:
        return (f"{_plural(n, 'warm-up iteration')} (steady state not checked: harness.warmup_max allows fewer than "
                f"2 x harness.steady_window = {2 * w['window']} iterations)")
    drift = "" if w.get("drift") is None else f"; the median still moved {w['drift'] * 100:.0f}%"
    return (f"**{_plural(n, 'warm-up iteration')}, not steady** (stopped at harness.warmup_max{drift}; steady would "
            f"be: {rule}): the machine was busy or the model does not settle, so the per-iteration medians below "
            "are the figures to trust")


def is_cpu_run(run: dict | None) -> bool:
    return run is not None and run["versions"]["device"] == "cpu"


def measured_iterations(run: dict | None, coverage: dict) -> int:
    """The harness's measured iterations; for a trace captured elsewhere, its iteration ranges (at least 1)."""
    if run is None:
        return max(len(coverage.get("iteration_time_ns", {})), 1)
    return run["harness"]["iterations"]


def gpu_activity_lines(diagnostics: dict | None) -> list[str]:
    """One bullet on the memcpy/memset the GPU ran besides kernels (diagnostics.json ``gpu_activities``),
    none when there were none: they are not kernels, so no operator and no kernel total includes them."""
    summary = (diagnostics or {}).get("gpu_activities") or {}
    parts = []
    for kind in ("memcpy", "memset"):
        entry = summary.get(kind)
        if not entry:
            continue
        text = f"{_plural(entry['count'], kind)} ({_ms(entry['time_ns'])} ms, {entry['bytes']:,} bytes"
        kinds = entry.get("by_copy_kind") or {}
        if kinds:
            text += "; " + ", ".join(f"{k} {v['count']}" for k, v in sorted(kinds.items()))
        parts.append(text + ")")
    if not parts:
        return []
    inside = summary.get("in_iterations_time_ns")
    scope = f", {_ms(inside)} ms of it launched in the measured iterations" if inside is not None else ""
    return [f"- besides kernels the GPU ran {' and '.join(parts)}{scope}: not attributed to operators and not "
            "in the kernel totals (trace.json shows them on their streams)"]


def counters_text(coverage: dict, keys: int = 3) -> str:
    """One line on hardware counters: the note when none were collected, else how many kernels got counters,
    how many were refused and why (the largest refusals per kernel name), and how many were not measured:
    ``hardware counters (ncu): 1,234 of 1,300 kernels; 66 refused: 40 count_mismatch on `gemm_a` (timeline 3,
    ncu 2), ...; 0 not measured``."""
    if coverage.get("counters_note"):
        return coverage["counters_note"]
    c = coverage.get("counters")
    if not c:
        return "hardware counters: collected"
    text = f"hardware counters (ncu): {c['with_counters']:,} of {_plural(c['kernels'], 'kernel')}"
    if c.get("from_layer_class"):
        text += f" ({c['measured']:,} measured, {c['from_layer_class']:,} copied from their layer class)"
    if c.get("refused") is None:
        return text
    if c["refused"]:
        names = short_names([e["name"] for e in c["refused_keys"][:keys]], 60)
        shown = [f"{e['refused']:,} {e['reason']} on `{name}` (timeline {e['timeline']}, ncu {e['ncu']})"
                 for name, e in zip(names, c["refused_keys"][:keys])]
        more = len(c["refused_keys"]) - keys
        rows = f" ({c['refused_rows']:,} ncu rows that could not be placed)" if c.get("refused_rows") is not None \
            else ""
        text += f"; {c['refused']:,} refused{rows}: " + ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    else:
        text += "; none refused"
    return text + f"; {c['not_measured']:,} not measured"


def refused_counters_lines(coverage: dict) -> list[str]:
    """The kernels whose ncu counters the matching refused, per kernel name and reason, with what each reason
    means, then the matching's hints (what the input cannot tell apart; Markdown; nothing when neither)."""
    from ..matching import REASONS

    c = coverage.get("counters") or {}
    hints = ["## Matching hints", ""] + [f"- {h}" for h in c.get("hints") or []] + [""] if c.get("hints") else []
    if not c.get("refused"):
        return hints
    rows = c.get("refused_rows")
    behind = (f"{_plural(rows, 'ncu row')} could not be placed with certainty, so {_plural(c['refused'], 'kernel')} "
              "they may belong to have no counters" if rows is not None else
              f"{_plural(c['refused'], 'kernel')} may have an ncu measurement that could not be placed with certainty, "
              "so they have no counters")
    lines = ["## Counters refused", "", behind + " (a wrong counter is never attached):", "",
             "| kernel | reason | refused | launches in the window | ncu rows |", "|---|---|---|---|---|"]
    shown = short_names([e["name"] for e in c["refused_keys"]])
    lines += [f"| `{name}` | {e['reason']} | {e['refused']} | {e['timeline']} | {e['ncu']} |"
              for name, e in zip(shown, c["refused_keys"])]
    lines += [""] + [f"- `{r}`: {REASONS.get(r, r)}" for r in sorted(c["refused_reasons"])] + [""]
    return lines + hints


def determinism_text(run: dict) -> str | None:
    """The determinism the measured iterations ran under, in one line (run.json ``settings``, harness.deterministic):
    ``determinism: off (the model's own settings: production kernels); cudnn.benchmark off`` or ``determinism:
    forced (deterministic algorithms, cuDNN deterministic, cuBLAS workspace :4096:8): kernels may differ from
    production; cudnn.benchmark off``. A run.json from before ``deterministic_requested`` was recorded (the harness
    always forced it then) reads as forced when its flags say so. None without ``settings``."""
    settings = run.get("settings") or {}
    if not settings:
        return None
    on = [name for key, name in (("deterministic_algorithms", "deterministic algorithms"),
                                 ("cudnn_deterministic", "cuDNN deterministic")) if settings.get(key)]
    if settings.get("cublas_workspace_config"):
        on.append(f"cuBLAS workspace {settings['cublas_workspace_config']}")
    cuda = ((run.get("versions") or {}).get("device")) != "cpu"  # (cuDNN and cuBLAS settings mean nothing on CPU)
    benchmark = "cudnn.benchmark " + ("on" if settings.get("cudnn_benchmark") else "off")
    if settings.get("cudnn_benchmark_set_by_model"):
        benchmark += " (the model turned it on; the harness turned it off)"
    benchmark = f"; {benchmark}" if cuda or settings.get("cudnn_benchmark_set_by_model") else ""
    requested = settings.get("deterministic_requested")
    if requested and not settings.get("deterministic_algorithms"):
        return ("determinism: requested (harness.deterministic) but NOT in effect: deterministic algorithms were off "
                f"in the measured iterations{benchmark}")
    if requested or (requested is None and on):
        return f"determinism: forced ({', '.join(on)}): kernels may differ from production{benchmark}"
    if on:
        return (f"determinism: not forced, but the model's or environment's own settings turn on {', '.join(on)} "
                f"(kernels may differ from production){benchmark}")
    return f"determinism: off (the model's own settings: production kernels){benchmark}"


def machine_load_text(run: dict | None) -> str | None:
    """The machine's load during the measured iterations in words (run.json ``machine_load``,
    capture.machine.other_cpu_load), bold when it was busy; None for a run.json without the record."""
    load = (run or {}).get("machine_load")
    if not load:
        return None
    others = load.get("other_cpu_load")
    if others is None:
        return (f"machine load during the measured iterations: not measured (a {load.get('window_s')} s window: "
                f"/proc/stat unreadable, or the window under {load.get('min_window_s', 0.25)} s)")
    where = (f"{load.get('usable_cpus')} usable CPUs, {load.get('threads')} torch thread(s): busy above "
             f"{load.get('threshold'):g}")
    if load.get("busy"):
        return (f"**the machine was busy during the capture**: other processes kept {others:.2f} CPUs busy on "
                f"average during the measured iterations ({where}), so operator times are inflated and their shares "
                "may move (an OpenMP team waits for its descheduled thread at every operator); capture again on a "
                "quiet machine before acting on the times or the advice")
    return f"machine load: other processes kept {others:.2f} CPUs busy on average during the measured iterations " \
           f"({where}): quiet"


def measurement_lines(run: dict | None, coverage: dict, diagnostics: dict | None = None,
                      clocks: dict | None = None, per_iteration_medians: bool = False) -> list[str]:
    """What was profiled and how, as Markdown bullet lines (``- ...``): model, device and versions,
    measured iterations and warm-up, counters, clocks; for a trace captured elsewhere (``run`` None) what its
    timeline says. ``per_iteration_medians``: the tables rank by per-iteration medians (said in the line on
    the measured iterations). The HTML report shows the same lines."""
    if run is None:
        return _imported_lines(coverage, diagnostics) + gpu_activity_lines(diagnostics)
    cpu = is_cpu_run(run)
    v = run["versions"]
    iterations = measured_iterations(run, coverage)
    device = v["device"] + (f" ({v['device_name']})" if v.get("device_name") else "")
    if cpu:
        device += f", {v.get('cpu_threads', '?')} CPU thread(s) for torch"
    lines = [
        _model_line(run),
        f"- device: {device}; torch {v['torch']}, CUDA {v['cuda_runtime'] or 'none'}, driver {v['driver'] or 'n/a'}",
        f"- measured: {_plural(iterations, 'iteration')} after {warmup_text(run)} (seed {run['harness']['seed']}); "
        + ("ranks and shares of operators and modules and the layer figures below come from per-iteration "
           "medians; times are totals over the measured iterations unless marked" if per_iteration_medians else
           "times below are totals over the measured iterations unless marked"),
        f"- {counters_text(coverage)}",
        f"- clocks: {'not locked (CPU run)' if cpu else _clocks_text(clocks)}",
    ]
    load = machine_load_text(run)
    if load:
        lines.append(f"- {load}")
    determinism = determinism_text(run)
    if determinism:
        lines.append(f"- {determinism}")
    if cpu:
        lines += [
            "- CPU kernels are compute calls with their *exclusive* time: an Inductor C++ kernel or an ATen op "
            "minus the ops it calls, so composite ops (`aten::linear`, `aten::matmul`) show only their own "
            "dispatch time and work such as `aten::addmm`'s bias copy appears as `aten::copy_`",
        ]
    return lines + gpu_activity_lines(diagnostics)


def _operators_heading(operators: pd.DataFrame, top: int) -> list[str]:
    """The operator table's heading: ``Top 20 of 58 operators`` (the ``(unattributed)`` row counted apart), or
    that no operator was found; a line on the ``(unattributed)`` row when the table shows it."""
    n = operator_count(operators["operator"])
    shown = operator_count(operators["operator"].head(top))
    has_unattributed = bool((operators["operator"].head(top) == UNATTRIBUTED).any())
    if not n:
        why = (": every kernel is unattributed (the `(unattributed)` row)" if has_unattributed
               else " (no kernels)" if not len(operators) else "")
        return ["## Operators", "", f"No operator found{why}.", ""]
    lines = [f"## Top {shown} of {operators_phrase(n)}", ""]
    if has_unattributed:
        lines += ["`(unattributed)` is not an operator: it sums the kernels no path attributed (see Unattributed "
                  "kernels below).", ""]
    return lines


PHASE_TOP = 10  # operators listed per train-step phase (at most report.top_operators)


def phase_lines(coverage: dict, phases: pd.DataFrame | None, top: int) -> list[str]:
    """The train-step split: time per phase (coverage.json ``phases``) and each phase's top operators
    (``phases.parquet``); nothing for a profile without phase ranges (inference, a foreign trace)."""
    summary = coverage.get("phases")
    if not summary:
        return []
    lines = ["## Time per train-step phase", "",
             "Each measured iteration is one train step: `forward` (the model and the loss), `backward` "
             "(`loss.backward()`), `optimizer` (`step()` and `zero_grad()`). A kernel's phase is the harness's phase "
             "range open at its launch in its process, on any thread, so backward kernels that autograd launches "
             "from its own threads count as `backward`.", "",
             "| phase | ms per iteration (median) | total (ms) | share | kernels |", "|---|---|---|---|---|"]
    lines += [f"| {e['phase']} | {_ms(e['iteration_median_ns'])} | {_ms(e['time_ns'])} | {e['time_share'] * 100:.2f}% | "
              f"{e['kernels']} |" for e in summary]
    if phases is None or not len(phases):
        return lines + [""]
    n = min(top, PHASE_TOP)
    for phase in (e["phase"] for e in summary):
        mine = phases[phases["phase"] == phase].head(n)
        if not len(mine):
            continue
        shown = mine.assign(operator=short_names(mine["operator"]), total_ms=mine["time_ns"].map(_ms),
                            share_of_phase=(mine["phase_share"] * 100).map("{:.2f}%".format))
        columns = ["operator", "calls", "kernels", "total_ms", "share_of_phase"]
        if "iteration_median_ns" in shown:
            shown["ms per iteration (median)"] = shown["iteration_median_ns"].map(_ms)
            columns.insert(4, "ms per iteration (median)")
        lines += ["", f"### Top operators of `{phase}`", "", _table(shown[columns])]
    return lines + [""]


def split_lines(layer_classes: pd.DataFrame) -> list[str]:
    """One line per layer class of a module class that fell into several classes: its ``split_reason`` and
    ``split_detail`` (layer_classes.parquet); nothing when no module class was split."""
    if "split_reason" not in layer_classes:
        return []
    split = layer_classes[layer_classes["split_reason"].notna()]
    if not len(split):
        return []
    lines = ["Identical layers (same module class and parameter shapes) in several classes, and why:", ""]
    lines += [f"- `{r.layer_class}` (`{r.module_class}`): `{r.split_reason}`: {r.split_detail}"
              for r in split.itertuples(index=False)]
    return lines + [""]


RANK_OVERLAP_MARK = "≈"


def rank_labels(table: pd.DataFrame) -> list[str]:
    """Each row's rank (1-based, the table's order), marked :data:`RANK_OVERLAP_MARK` where its per-iteration
    interquartile range overlaps a neighbour's (``rank_overlap``, aggregate.rank_overlaps)."""
    overlap = table["rank_overlap"] if "rank_overlap" in table else [False] * len(table)
    return [f"{i}{' ' + RANK_OVERLAP_MARK if o else ''}" for i, o in enumerate(overlap, start=1)]


def spread_text(row: dict, quartiles: bool = True) -> str:
    """``median [p25-p75] (min-max)`` of one row's per-iteration time, in ms (``median [min-max]`` without
    the quartile columns)."""
    if quartiles:
        return (f"{_ms(row['iteration_median_ns'])} [{_ms(row['iteration_p25_ns'])}-{_ms(row['iteration_p75_ns'])}] "
                f"({_ms(row['iteration_min_ns'])}-{_ms(row['iteration_max_ns'])})")
    return f"{_ms(row['iteration_median_ns'])} [{_ms(row['iteration_min_ns'])}-{_ms(row['iteration_max_ns'])}]"


def ranking_note(operators: pd.DataFrame) -> list[str]:
    """How the operator table is ranked and shared, and what the rank mark means (nothing without per-iteration
    medians: then the table is by total time)."""
    if "iteration_median_ns" not in operators:
        return []
    medians = int(operators["iteration_median_ns"].sum())
    lines = ["", f"Ranked by each operator's median time per measured iteration; share: of the sum of the medians "
                 f"({_ms(medians)} ms), so one slow iteration moves neither. total_ms: over all measured iterations."]
    if "rank_overlap" in operators:
        n = int(operators["rank_overlap"].sum())
        lines[-1] += (f" {RANK_OVERLAP_MARK}: the operator's per-iteration interquartile range [p25-p75] overlaps "
                      f"that of the operator ranked next to it, so the two may swap places in another run "
                      f"({_plural(n, 'operator')} of {len(operators)}).")
    return lines


def modules_lines(modules: pd.DataFrame) -> list[str]:
    """The modules section: ranked by median time per measured iteration when the table has it (identical layers
    then read alike), else by total."""
    table = modules.assign(total_ms=lambda d: d["time_ns"].map(_ms),
                           share=lambda d: (d["time_share"] * 100).map("{:.2f}%".format))
    if "iteration_median_ns" not in modules:
        return ["## Modules (total over the measured iterations)", "",
                _table(table[["module", "kernels", "total_ms", "share"]]), ""]
    label = "ms per iteration: median [p25-p75] (min-max)"
    table[label] = [spread_text(r, "iteration_p25_ns" in modules) for r in modules.to_dict("records")]
    return ["## Modules (by median time per measured iteration)", "",
            "share: of the sum of the modules' per-iteration medians; total_ms: over all measured iterations.", "",
            _table(table[["module", "kernels", label, "total_ms", "share"]]), ""]


def layer_summary(layer_classes: pd.DataFrame, run: dict | None = None) -> str:
    """One sentence: N layer instances form K classes (the ncu replay saving), that the capture found layers but no
    kernel was placed in one (``run``'s ``layers``: a whole-model compile whose FX nodes' modules are unknown),
    or that the model has no layers."""
    if not len(layer_classes):
        return "No kernels, so no layers or layer classes."
    found = (run or {}).get("layers") or 0
    if found and not len(layer_classes[layer_classes["layer_class"] != "rest"]):
        return (f"The capture found {_plural(int(found), 'layer')} (capture/layers.json), but no kernel could be "
                "placed in one, so every kernel is in the class `rest` and ncu replays the whole iteration. In a "
                "whole-model compile a kernel's layer comes from the modules of its FX nodes; here they are "
                "unknown (see the kernels of unknown layer below), e.g. because a graph break splits the model "
                "into frames compiled once for every layer: set `compile_scope: layers`, or remove the graph break.")
    layered = layer_classes[layer_classes["layer_class"] != "rest"]
    if len(layered):
        n, k = int(layered["instances"].sum()), len(layered)
        return (f"{_plural(n, 'layer instance')} (one per call of a layer module in an iteration; a module "
                f"called twice, e.g. with shared weights, gives `path#1`) form {_plural(k, 'class')}: an ncu "
                f"replay needs {k} instead of {n} layer replays ({n / k:.1f}x less).")
    return ("No repeated submodules (layers) were found in this model: every kernel is in the class "
            "`rest`. Layers are children of an `nn.ModuleList`/`nn.Sequential` with the same class "
            "and parameter shapes.")


def layer_membership_lines(coverage: dict, limit: int = 10, layer_classes: pd.DataFrame | None = None) -> list[str]:
    """Markdown lines on how compiled kernels were placed in layer instances (coverage.json
    ``layer_membership``): shown when FX nodes decided a layer, or kernels are cross-layer or unknown; the
    cross-layer kernels (which layer instances each spans) and the unknown ones are listed. With
    ``layer_classes``, module classes whose instances fall into several layer classes are named."""
    info = coverage.get("layer_membership") or {}
    by = info.get("by_membership") or {}
    if not (by.get("fx_nodes") or by.get("cross_layer") or by.get("unknown")):
        return []
    total = coverage.get("kernel_time_ns") or 0

    def part(key: str) -> str:
        entry = by.get(key) or {"kernels": 0, "time_ns": 0}
        share = f", {entry['time_ns'] / total * 100:.2f}% of kernel time" if total else ""
        return f"{_plural(entry['kernels'], 'kernel')}{share}"

    apart = [f"{part('cross_layer')} **cross-layer** (FX nodes of several layer instances, or of one and of code "
             "outside every layer)"] if by.get("cross_layer") else []
    apart += [f"{part('unknown')} of **unknown layer** (not placed on a call site with FX nodes' modules)"] \
        if by.get("unknown") else []
    lines = ["", "Layer membership of compiled kernels (from the FX nodes each was generated from): "
             f"{part('fx_nodes')} in one layer instance each" + (
                 f"; {' and '.join(apart)} belong to no instance (class `rest`; module row "
                 + " and ".join(f"`{row}`" for key, row in (("cross_layer", "(cross-layer)"),
                                                            ("unknown", "(unknown layer)")) if by.get(key))
                 + "), never to one of the layers they touch." if apart else
                 "; no kernel spans two layer instances.")]
    if layer_classes is not None and len(layer_classes) and by.get("fx_nodes"):
        layered = layer_classes[layer_classes["layer_class"] != "rest"]
        split = [(m, sorted(int(k) for k in g["kernels_per_instance"])) for m, g in layered.groupby("module_class")
                 if len(g) > 1]
        if split:
            lines += ["", "Instances of one module class run different kernels here, so they form several layer "
                      "classes: " + "; ".join(f"`{m}`: {len(k)} classes ({', '.join(map(str, k))} kernels per "
                                              "instance)" for m, k in split)
                      + ". A whole-model compile fuses, and recomputes, across layer boundaries (a residual add "
                      "inside the next layer's kernel), so the code Inductor generates differs between instances; "
                      "with `compile_scope: layers` every instance runs the same compiled graph."]
    rows = [(c["name"], " + ".join(f"`{x}`" for x in c["layers_spanned"]), c["count"], c["time_ns"])
            for c in info.get("cross_layer") or []]
    rows += [(u["name"], "unknown (FX nodes' modules not known)", u["count"], u["time_ns"])
             for u in info.get("unknown") or []]
    if rows:
        shown = rows[:limit]
        names = short_names([r[0] for r in shown])
        lines += ["", "| kernel | spans | count | total (ms) |", "|---|---|---|---|",
                  *[f"| `{n}` | {spans} | {count} | {_ms(t)} |" for n, (_, spans, count, t) in zip(names, shown)]]
        if len(rows) > limit:
            lines += ["", f"... and {len(rows) - limit} more (coverage.json `layer_membership`)."]
    return lines


def render_markdown(workload: str, inputs: ReportInputs, top_operators: int) -> str:
    """The report text of ``inputs`` (:class:`operator_profiler.results.ReportInputs`). Times are shown in ms (the
    tables on disk keep integer ns)."""
    run, coverage, operators, modules = inputs.run, inputs.coverage, inputs.operators, inputs.modules
    layer_classes, diagnostics, matching = inputs.layer_classes, inputs.diagnostics, inputs.matching
    replays, clocks, phases = inputs.replays, inputs.clocks, inputs.phases
    iterations = measured_iterations(run, coverage)
    medians = "iteration_median_ns" in operators
    lines = [f"# Operator profile: `{workload}`", "",
             *measurement_lines(run, coverage, diagnostics, clocks, per_iteration_medians=medians)]
    lines += [
        "",
        "## Coverage",
        "",
        f"{coverage['attributed_count']} of {coverage['kernel_count']} kernels attributed, "
        f"{coverage['coverage_time'] * 100:.2f}% of {_ms(coverage['kernel_time_ns'])} ms kernel time.",
        *(["", "**The trace holds no kernels**" + (
            ": see the capture notes below." if no_kernel_warnings(diagnostics)
            else ": nothing ran inside the measured window.")] if not coverage["kernel_count"] else []),
        *_iteration_spread(coverage),
        *_outside_iterations(coverage),
        "",
        "| path | time share (chosen) | kernels it named (any) | time it named (any) |",
        "|---|---|---|---|",
        *[f"| {p} | {s * 100:.2f}% | {_share(coverage, p, 'count')} | {_share(coverage, p, 'time')} |"
          for p, s in sorted(coverage["by_path"].items())],
        *_agreement_lines(coverage),
        *user_annotation_lines(coverage),
        *external_id_lines(coverage),
        *_invalid_time_line(coverage),
        *_notes(diagnostics),
        "",
        *_operators_heading(operators, top_operators),
    ]
    top = operators.head(top_operators).assign(
        operator=lambda d: short_names(d["operator"]),
        total_ms=lambda d: d["time_ns"].map(_ms),
        share=lambda d: (d["time_share"] * 100).map("{:.2f}%".format),
    )
    columns = ["operator", "calls", "kernels", "total_ms", "share"]
    if "iteration_median_ns" in top:
        columns.insert(0, "rank")
        top["rank"] = rank_labels(top)
        quartiles = "iteration_p25_ns" in top
        label = "ms per iteration: median " + ("[p25-p75] (min-max)" if quartiles else "[min-max]")
        top[label] = [spread_text(r, quartiles) for r in top.to_dict("records")]
        columns.append(label)
    columns.append("paths")
    for metric, label, scale in KEY_COUNTERS:
        if metric in top:  # hardware counters were matched (opprof aggregate --counters)
            top[label] = [("" if pd.isna(v) else f"{v * scale:.1f}") for v in top[metric]]
            columns.append(label)
    if (top["bottleneck"] != "not_collected").any():  # without counters the column says nothing
        columns.append("bottleneck")
    lines += [*([_table(top[columns])] if len(top) else []), *ranking_note(operators), *_unknown_time_lines(operators), ""]
    lines += roofline_view.markdown_lines(operators, coverage, run, iterations, top_operators,
                                          short_names(operators["operator"]), replays)
    lines += phase_lines(coverage, phases, top_operators)
    lines += advice_view.markdown_lines(inputs.advice)
    lines += ["## Layer classes", ""]
    if len(layer_classes):
        per_call = "instance_iteration_median_ns" in layer_classes
        per_call_label = ("ms per instance and iteration: median [min-max]" if per_call
                          else "ms_per_instance_and_iteration")
        lc = layer_classes.assign(
            module_class=lambda d: d["module_class"].fillna("(kernels in no layer instance)"),
            total_ms=lambda d: d["time_ns"].map(_ms),
        ).rename(columns={"instances": "instances (layer calls)"})
        lc[per_call_label] = ([f"{_ms(r['instance_iteration_median_ns'])} [{_ms(r['instance_iteration_min_ns'])}-"
                               f"{_ms(r['instance_iteration_max_ns'])}]" for r in layer_classes.to_dict("records")]
                              if per_call else (layer_classes["mean_instance_time_ns"] / max(iterations, 1)).map(_ms))
        lc = lc[["layer_class", "module_class", "instances (layer calls)", "kernels_per_instance", per_call_label,
                 "total_ms", "representative"]]
        lines += [_table(lc), ""]
    lines += [layer_summary(layer_classes, run), *layer_membership_lines(coverage, layer_classes=layer_classes), ""]
    lines += split_lines(layer_classes)
    lines += _dedup_lines(matching)
    lines += refused_counters_lines(coverage)
    lines += _replay_lines(replays)
    lines += modules_lines(modules)
    lines += ["## Unattributed kernels", ""]
    if coverage["unattributed"]:
        lines += ["| kernel | count | total (ms) | reason |", "|---|---|---|---|"]
        names = short_names([u["name"] for u in coverage["unattributed"]])
        lines += [f"| `{name}` | {u['count']} | {_ms(u['time_ns'])} | {u['reason']} |"
                  for name, u in zip(names, coverage["unattributed"])]
    else:
        lines += ["None: every kernel was attributed." if coverage["kernel_count"] else "None (no kernels)."]
    if coverage.get("unattributed_reasons", {}).get("no_operator_range"):
        lines += ["", f"{coverage['unattributed_reasons']['no_operator_range']} kernel(s) lie inside NVTX ranges, but "
                  "none that names an operator: their ranges are in other NVTX domains (see each kernel's evidence "
                  "`tags`) or ignored. To use a domain: `opprof attribute --nvtx-operator-domain NAME`, or "
                  "`nvtx.operator_domains` in the config."]
    return "\n".join(lines) + "\n"
