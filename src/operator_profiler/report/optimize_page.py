"""``results/<workload>/optimize/report.html``: the advice with its evidence, the variants against the baselines
(wall time medians with 95 % intervals, page faults, numerics), the ablation with each change's credit (the loss
when it is removed from the full advised set, beside its step in the advised order) and the recommendation's
decision trail, the rewrites paired with the operators they replace, before/after per operator, and the optimized
profile's coverage.
Self-contained (the report.html page style; no figure, so no plotly.js)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..figures import apart, interval as _interval
from . import html as page
from .html import esc


def _advice_section(advice: dict) -> str:
    from .advice_view import interval_text

    rows = [f"<tr><td><strong>{esc(r['change'])}</strong></td><td>{esc(r['rule'])}</td><td>{esc(r['evidence'])}"
            + (f"; {esc(interval_text(advice, r))}" if interval_text(advice, r) else "")
            + f"</td><td>{esc(r['expect'])}</td></tr>" for r in advice.get("advice", [])]
    offered = ("<table><thead><tr><th>change</th><th>rule</th><th>evidence (the profile)</th><th>expected effect"
               "</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>") if rows else \
        "<p>No rule of the catalog fired on this profile.</p>"
    sources = advice.get("sources") or {}
    implied = [f"<li><strong>{esc(c)}</strong>: {esc(s)}</li>" for c, s in sources.items()
               if not s.startswith("rule ")]
    refused = [f"<li><strong>{esc(r['change'])}</strong> (rule {esc(r['rule'])}): {esc(r['reason'])}. Evidence: "
               f"{esc(r['evidence'])}</li>" for r in advice.get("not_offered", [])]
    diagnoses = [f"<p class=\"diagnosis\"><strong>Diagnosis.</strong> {esc(d)}</p>" for d in advice.get("diagnoses", [])]
    borderline = [f"<li><strong>{esc(r['change'])}</strong> (rule {esc(r['rule'])}): {esc(r['reason'])}</li>"
                  for r in advice.get("borderline", [])]
    warnings = "".join(f'<p class="note"><strong>Warning</strong>: {esc(w)}.</p>' for w in advice.get("warnings") or [])
    advised = " + ".join(advice.get("advised_changes") or []) or "no change"
    return (f'<section id="advice"><h2>Advice</h2>{warnings}<p>Advised variant: <strong>{esc(advised)}</strong> '
            f"(catalog <code>{esc(advice.get('catalog'))}</code>).</p>{offered}"
            + (f"<p>Borderline, not advised (the measure does not clear the rule's threshold across the measured "
               f"iterations):</p><ul>{''.join(borderline)}</ul>" if borderline else "")
            + (f"<p>Also in the variant:</p><ul>{''.join(implied)}</ul>" if implied else "")
            + (f"<p>Not offered (the evidence holds, a precondition does not):</p><ul>{''.join(refused)}</ul>"
               if refused else "")
            + "".join(diagnoses) + "</section>")


def _variant_rows(variants: dict, recommended: str | None) -> list[str]:
    rows = []
    for name, v in variants.items():
        faults = (v.get("faults_per_iteration") or {}).get("total")
        numerics = v.get("numerics") or {}
        speedup = v.get("speedup") or {}
        in_dtype = v.get("numerics_in_dtype") or {}
        status = ("rejected: " + v["rejected"]) if v.get("rejected") else (
            "ok" if numerics.get("ok", True) else f"numerics: {numerics.get('reason')}")
        if not v.get("rejected") and in_dtype.get("limits"):
            status += (f"; against {in_dtype['against']}: max_rel {in_dtype['max_rel']:.2e} within "
                       f"{in_dtype['limits']['max_rel']:.2e}")
        if numerics.get("top1_agreement") is not None:  # logits: the task-level agreement, per variant
            required = numerics.get("min_top1_agreement")
            agreement = numerics["top1_agreement"]
            # the requirement with all its digits (0.995: 99.5 %, not 100 %); the agreement with enough digits
            # that one just below or above it never prints as the requirement
            shown = apart(agreement, required if required is not None else 1.0, 2, 100)
            status += (f"; top-1 agreement {shown}% of {numerics.get('top1_positions')} positions"
                       + (f" (at least {required * 100:g}% required)" if required is not None else ""))
        label = name + (" (recommended)" if name == recommended else "")
        rows.append(
            f"<td>{esc(label)}</td><td>{esc(' + '.join(v.get('changes') or []) or '(none)')}</td>"
            + page._num_cell(v.get("median_ms"), _interval(v.get("median_ms"), v.get("ci_ms"), digits=2))
            + page._num_cell(speedup.get("value"), _interval(speedup.get("value"), speedup.get("ci"), "x"))
            + page._num_cell(faults, "" if faults is None else f"{faults:,.0f}")
            + page._num_cell(numerics.get("max_rel"), "" if numerics.get("max_rel") is None
                             else f"{numerics['max_rel']:.2e}")
            + page._num_cell(numerics.get("cosine"), "" if numerics.get("cosine") is None
                             else f"{numerics['cosine']:.6f}")
            + f"<td>{esc(status)}</td>")
    return rows


def _variants_section(verification: dict) -> str:
    recommended = verification["ablation"]["recommended"]
    headers = [("variant", "text"), ("changes", "text"), ("ms / iteration: median [95% CI]", "num"),
               ("speedup vs fp32_eager [95% CI]", "num"), ("page faults / iteration", "num"),
               ("max rel. error", "num"), ("cosine", "num"), ("status", "text")]
    table = page._table(headers, _variant_rows(verification["variants"], recommended.get("variant")), "variants")
    round2 = verification.get("round2")
    extra = ""
    if round2:
        extra = ("<p>The recommended variant was not among the ablation's change sets: measured in a second round "
                 "with FP32 eager and the strong baseline:</p>"
                 + page._table(headers, _variant_rows(round2, recommended.get("variant")), "variants_round2"))
    threads = verification.get("threads")
    return ('<section id="variants"><h2>Variants and baselines</h2>'
            f"<p>Wall time per iteration, the variants interleaved, {verification.get('repetitions')} repetitions "
            f"over {verification.get('processes')} processes (each builds and warms every variant), "
            f"{'torch default threads' if not threads else f'{threads} thread(s)'}, device "
            f"{esc(verification.get('device'))}. Baselines: {esc(_baselines_text(verification))}. Numerics against "
            "the FP32 eager reference on fixed inputs, at the tolerance of the variant's dtype; a variant that "
            "changes the dtype and does more is also checked against the eager model in that dtype at a tight bound "
            "(twice that eager model's own deviation from FP32), so a compiler bug is not absorbed by the dtype's "
            "tolerance.</p>" + _threads_html(verification) + _int8_html(verification) + table + extra + "</section>")


def _int8_html(verification: dict) -> str:
    """Where int8_dynamic variants were measured: what the int8 precondition was read from (the CPU flags, or
    forced by OPPROF_FORCE_INT8 on a CPU without int8 dot products, said loudly)."""
    measured = [v for group in (verification.get("variants") or {}, verification.get("round2") or {})
                for v in group.values() if "int8_dynamic" in (v.get("changes") or [])]
    source = (verification.get("machine_features") or {}).get("native_int8_source")
    if not measured or not source:
        return ""
    if source.startswith("forced"):
        return (f'<p class="warning"><strong>int8_dynamic was measured where it is not offered: {esc(source)}.'
                "</strong> Its speed here says little about a CPU with int8 dot products.</p>")
    return f"<p>int8_dynamic: int8 dot products from {esc(source)}.</p>"


#: The page's one-word summary of verification.json thread_scaling verdicts (optimize.verify.thread_scaling).
_THREAD_VERDICTS = {"scales": "{n}: the model uses them", "single_thread": "{n}: too small for more than 1",
                    "one_thread": "1", "unknown": "{n}: scaling unknown", "not_measured": "{n}"}


def _threads_kpi(verification: dict) -> list[tuple[str, str]]:
    scaling = verification.get("thread_scaling")
    if not scaling:
        return []
    verdict = _THREAD_VERDICTS.get(scaling.get("verdict"), str(scaling.get("verdict")))
    return [("threads", verdict.format(n=scaling.get("threads")))]


def _threads_html(verification: dict) -> str:
    """The thread count the variants ran with, where it came from, and FP32 eager's scaling from 1 thread to it
    (verification.json ``thread_scaling``, optimize.verify.thread_scaling)."""
    scaling = verification.get("thread_scaling")
    if not scaling:
        return ""
    source = verification.get("threads_source")
    strong = scaling.get("verdict") == "single_thread"
    text = esc(scaling.get("text"))
    return (f'<p id="threads">Threads: {esc(scaling.get("threads"))}'
            + (f" ({esc(source)})" if source else "") + ". "
            + (f"<strong>{text}</strong>" if strong else text) + ".</p>")


def _baselines_text(verification: dict) -> str:
    return "; ".join(f"{name} = {' + '.join(changes) or 'no change'}"
                     for name, changes in (verification.get("baselines") or {}).items())


def _measured_text(measurement: dict | None) -> str:
    """``60 / 60 (4 / 4 processes), 1 more round``: the repetitions and processes of the two variants a decision
    compared (without, with; ``-`` where not measured) and its extra rounds; empty without a measurement."""
    if not measurement:
        return ""
    def pair(values):
        return " / ".join("-" if v is None else str(v) for v in values or [])

    rounds = measurement.get("extra_rounds") or 0
    processes = measurement.get("processes") or []
    return (pair(measurement.get("repetitions"))
            + (f" ({pair(processes)} processes)" if any(v is not None for v in processes) else "")
            + (f", {rounds} more round{'s' if rounds != 1 else ''}" if rounds else ""))


def _guards_text(recommended: dict) -> str:
    """One sentence per guard of the recommendation: the ratio, its outcome and what it rests on."""
    names = {"full_advised": "the full advised set", "strong_generic": "strong_generic",
             "fp32_eager": "FP32 eager (no change)"}
    items = [f"<li>against {esc(names.get(g['against'], g['against']))} ({esc(' vs '.join(g['variants']))}): "
             f"{esc(_interval(g['ratio']['value'], g['ratio']['ci'], 'x'))}, <strong>{esc(g['outcome'])}</strong>; "
             f"repetitions {esc(_measured_text(g))}</li>" for g in recommended.get("guards") or []]
    return ("<p>Guards (the other variant's median over the recommendation's: slower when the whole interval lies "
            "below 1, undecided when only the median does):</p><ul>" + "".join(items) + "</ul>") if items else ""


def _more_section(verification: dict) -> str:
    """What measuring borderline decisions again took: the rounds, the budget, what stayed undecided, and the
    processes discarded because other processes kept the CPUs busy."""
    more = verification.get("measure_more") or {}
    rounds = verification.get("refined") or []
    discarded = verification.get("discarded_processes") or []
    parts = []
    if more:
        parts.append(f"Borderline decisions measured again: {more.get('rounds', 0)} round(s), "
                     f"{more.get('spent_s', 0):.0f} s of the {more.get('budget_s', 0):g} s budget"
                     + (f"; still undecided: {esc(', '.join(more['undecided']))} ({esc(more.get('stopped'))})"
                        if more.get("undecided") else "") + ".")
    if rounds:
        parts.append("Rounds: " + "; ".join(
            f"{r['round']} ({esc(r.get('of', 'refine'))}) for {esc(', '.join(r.get('decisions') or []))}: "
            f"{esc(', '.join(r.get('variants') or []))}, {r.get('seconds', 0):.0f} s" for r in rounds) + ".")
    if discarded:
        parts.append("Processes discarded because other processes kept the CPUs busy: " + "; ".join(
            (f"{esc(d['measurement'])} " if d.get("measurement") else "")
            + f"process {d['process']} ({d['other_cpu_load']:.1f} CPUs busy, {d['spare']} spare; process "
            f"{d['replaced_by']} kept in its place)" for d in discarded) + ".")
    return "".join(f"<p>{p}</p>" for p in parts)


def _ablation_section(verification: dict) -> str:
    ablation = verification["ablation"]
    rows = []
    for step in ablation["steps"]:
        speedup = step.get("speedup") or {}
        loo = step.get("leave_one_out") or {}
        credit = loo.get("speedup") or {}
        without = loo.get("variant") or (" + ".join(loo["without"]) or "fp32 eager" if loo.get("without") is not None
                                         else "")
        rows.append(f"<td>{esc(step['change'])}</td><td>{esc(' + '.join(step['context']) or 'fp32 eager')}</td>"
                    + page._num_cell(speedup.get("value"), _interval(speedup.get("value"), speedup.get("ci"), "x"))
                    + f"<td>{esc(without)}</td>"
                    + page._num_cell(credit.get("value"), _interval(credit.get("value"), credit.get("ci"), "x"))
                    + f"<td>{esc(_measured_text(step.get('measurement')))}</td>"
                    + f"<td>{esc(step['decision'])}</td><td>{esc(step.get('reason'))}"
                    + (f"; <strong>{esc(step['interaction'])}</strong>" if step.get("interaction") else "")
                    + "</td>")
    table = page._table([("change (advised order)", "text"), ("on top of", "text"),
                         ("its step: speedup [95% CI]", "num"), ("the full set without it", "text"),
                         ("loss when removed: the full set's speedup [95% CI]", "num"),
                         ("repetitions: without / with it", "text"), ("decision", "text"),
                         ("why", "text")], rows, "ablation", sortable=False)
    rec = ablation["recommended"]
    strong = rec.get("vs_strong_generic") or {}
    verdict = (f"<p>Recommended: <strong>{esc(' + '.join(rec['changes']) or 'no change')}</strong>"
               + (f", {_interval((rec.get('speedup') or {}).get('value'), (rec.get('speedup') or {}).get('ci'), 'x')}"
                  " over FP32 eager" if rec.get("speedup") else "")
               + (f"; against strong_generic {_interval(strong.get('value'), strong.get('ci'), 'x')}"
                  if strong and rec.get("source") != "strong_generic" else "")
               + (f"; <strong>strong_generic was rejected</strong> ({esc(rec['strong_generic_rejected'])}): the "
                  "recommendation is not compared with it" if rec.get("strong_generic_rejected") else "")
               + (f"; <strong>instead of {esc(' + '.join(rec['instead_of']['changes']) or 'no change')}</strong>: "
                  f"{esc(rec.get('reason'))}" if rec.get("instead_of") else "") + ".</p>")
    trail = rec.get("trail") or []
    trail_html = ("<p>Decision trail:</p><ol>" + "".join(f"<li>{esc(line)}</li>" for line in trail) + "</ol>"
                  if trail else "")
    alone = [(name, v) for name, v in verification["variants"].items()
             if len(v.get("changes") or []) and name not in ("compile_default", "strong_generic")]
    basis = ablation.get("basis", "prefix_step")
    rule = ("Each advised change is credited with the loss when it is removed from the full advised set (the full "
            "set against the set without it, and without the advised changes that need it). It is kept when that "
            "interval lies above 1, kept and called <em>undecided</em> when the interval reaches 1 but the median "
            "is a gain, and dropped only when removing it is not slower; a change whose set without it was not "
            "measured is kept. Its step in the advised order is shown beside it: a change whose credit and step "
            "intervals are disjoint interacts with the others. The recommendation is never slower than the full "
            "advised variant or than strong_generic (slower: the whole interval of the ratio below 1).") \
        if basis == "leave_one_out" else (
            "The full advised set did not verify, so each change is decided by its step in the advised order: the "
            "cumulative variant with it against the one without it. It is kept when the step's interval lies "
            "above 1, kept and called <em>undecided</em> when the interval reaches 1 but the median is a gain, "
            "dropped otherwise (or when the variant with it was rejected).")
    rule += (" A borderline decision (undecided) is measured again, only its two variants, in new processes, round "
             "after round within the decision budget; the repetitions column counts what each decision rests on.")
    return (f'<section id="ablation"><h2>Ablation</h2><p>{rule}</p>' + table + _more_section(verification)
            + verdict + _guards_text(rec) + trail_html
            + f"<p>{len(alone)} variants with changes measured (each change alone, cumulative, and the full set "
              "without each change).</p></section>")


#: What names the profiled operators of a rewrite's new op contain.
_PROFILED_AS = {"aten::scaled_dot_product_attention": "scaled_dot_product", "aten::conv2d": "conv"}


def _stack_ops(evidence) -> list[str]:
    """The operator stack of a kernel's attribution ``evidence`` (JSON: ``correlation.stack``, or ``nvtx.stack``,
    outermost first); [] when it has none."""
    import json

    if not isinstance(evidence, str):
        return []
    try:
        parsed = json.loads(evidence)
    except ValueError:
        return []
    for path in ("correlation", "nvtx"):
        stack = (parsed.get(path) or {}).get("stack") if isinstance(parsed, dict) else None
        if isinstance(stack, list):
            return [str(s) for s in stack]
    return []


def _in_replaced_calls(kernels: pd.DataFrame, replaced: set[str]) -> pd.Series:
    """Which kernels ran inside a call of one of the ``replaced`` operators: a kernel whose operator is one (or a
    fused kernel computing one) or whose operator stack (its attribution evidence) holds one, so an aten::linear's
    call counts the aten::addmm it runs."""
    own = kernels["operator"].astype(str).map(lambda o: bool(set(o.split("+")) & replaced))
    if "evidence" not in kernels or not replaced:
        return own
    evidence = kernels["evidence"].astype(object)
    # parse only the texts that name a replaced operator at all (a profile has millions of kernels)
    named = evidence.map(lambda e: isinstance(e, str) and any(f'"{op}"' in e for op in replaced))
    cache: dict[str, bool] = {}

    def nested(text: str) -> bool:
        if text not in cache:
            cache[text] = bool(set(_stack_ops(text)) & replaced)
        return cache[text]

    stacked = pd.Series(False, index=kernels.index)
    stacked[named] = evidence[named].map(nested).astype(bool)
    return own | stacked


def _from_replaced_nodes(kernels: pd.DataFrame, nodes: set[tuple[str, str]]) -> pd.Series:
    """Which kernels of a compiled profile compute an FX node a rewrite replaced or erased: a kernel whose
    ``source_nodes`` (its fusion-map FX nodes) hold a node name of ``nodes`` (``(module_path, name)`` of the rewrite
    records) recorded in a module that is the kernel's own, inside it or around it (the kernel's ``module`` may be a
    coarser region, a layer instance). So the ``aten::bmm`` Inductor lowers a replaced ``matmul`` to counts, which
    names no replaced operator. FX node names come from Dynamo's graph of the same model code, in the base profile
    and in the rewritten variant alike."""
    if not nodes or "source_nodes" not in kernels:
        return pd.Series(False, index=kernels.index)
    paths_of: dict[str, list[str]] = {}
    for path, name in nodes:
        paths_of.setdefault(name, []).append(path)

    def computes_one(module, source) -> bool:
        if not isinstance(source, (list, tuple, np.ndarray)) or not len(source):  # (None, NaN: no FX nodes)
            return False
        m = None if module is None or pd.isna(module) else str(module)
        return any(m is None or p == "" or m == p or m.startswith(p + ".") or p.startswith(m + ".")
                   for name in source for p in paths_of.get(str(name), ()))

    return pd.Series([computes_one(m, s) for m, s in zip(kernels["module"].astype(object), kernels["source_nodes"])],
                     index=kernels.index, dtype=bool)


def _before(kernels: pd.DataFrame, replaced: set[str], paths: list, iterations: int,
            nodes: set[tuple[str, str]] = frozenset()) -> tuple[float | None, str]:
    """The base profile's kernel time per measured iteration (ms) of the ``replaced`` operators' calls
    (:func:`_in_replaced_calls`; in a compiled profile also the kernels computing the rewrite's replaced or erased FX
    ``nodes``, :func:`_from_replaced_nodes`) in the modules at ``paths`` (the rewrite records' ``module_path``: ""
    is the whole model, None unknown), and a note saying what it counts; None (the note says why) when the profile
    cannot tell.

    A kernel's ``module`` is the smallest region the profile attributes it to: the module path of its FX nodes
    (compiled), else the layer instance around it, else none (outside every layer range). A kernel counts when
    that region is a rewritten module or inside one; when it is a layer instance enclosing a rewritten module, or
    no module while a rewritten module lies outside every layer instance, the kernel counts too and the note names
    that region (the profile cannot tell the rewritten module's calls from the rest of it)."""
    by_nodes = _from_replaced_nodes(kernels, set(nodes))
    calls = kernels[_in_replaced_calls(kernels, replaced) | by_nodes]
    ops = ", ".join(sorted(replaced))
    if by_nodes.any():  # (what the notes below call "calls of" them: their compiled kernels too)
        ops += " (with the compiled kernels of their FX nodes)"
    if calls.empty:
        return None, f"n/a: no kernel of {ops} in the base profile"
    if any(p is None for p in paths):
        total = float(calls["duration_ns"].sum()) / iterations / 1e6
        return None, (f"n/a: a rewrite record names no module, so which calls it replaced is unknown ({ops}: "
                      f"{total:.3f} ms / it. in the whole model)")
    module = calls["module"].astype(object)
    module = module.where(module.notna(), None)
    known = {str(m) for m in kernels["module"].dropna().astype(str)}
    outside_layers = [p for p in paths if p != "" and not any(p == k or p.startswith(k + ".") for k in known)]
    coarse: set[str] = set()
    region: dict = {}  # module (None: no module) -> whether its kernels count
    for m in set(module):
        if any(p == "" or (m is not None and (m == p or m.startswith(p + "."))) for p in paths):
            region[m] = True
            continue
        enclosing = ({m} if m is not None and any(p.startswith(m + ".") for p in paths) else set()) | (
            {"(no module)"} if m is None and outside_layers else set())
        coarse |= enclosing
        region[m] = bool(enclosing)
    chosen = module.map(region).astype(bool)
    if not chosen.any():
        return None, f"n/a: the base profile's kernels of {ops} all ran outside the rewritten modules"
    before = float(calls.loc[chosen, "duration_ns"].sum()) / iterations / 1e6
    if not coarse:
        return before, "their calls in the rewritten modules"
    layers = sorted(coarse - {"(no module)"})
    where = []
    if layers:
        where.append(f"in {', '.join(layers[:4])}{' ...' if len(layers) > 4 else ''} (the layer instances around "
                     "the rewritten modules)")
    if "(no module)" in coarse:
        where.append("outside the layer ranges (the profile gives kernels there no module)")
    return before, (f"every call of {ops} {' and '.join(where)}: the profile does not tell the rewritten modules' "
                    "calls from others there")


def rewritten_layers(variant_run: dict | None, base_kernels: pd.DataFrame) -> list[str] | None:
    """The layer instances a variant's rewrite records are relative to (:func:`rewrite_pairs`' ``layer_instances``):
    the base profile's layer instances when the variant (its run.json) was compiled layer by layer, else None."""
    if (variant_run or {}).get("compile_scope") != "layers":
        return None
    if "layer" not in base_kernels:
        return []
    return sorted(map(str, base_kernels["layer"].dropna().unique()))


def rewrite_pairs(rewrites: list[dict], base_kernels: pd.DataFrame | None, iterations: int,
                  variant_operators: pd.DataFrame, variant_iterations: int,
                  layer_instances: list[str] | None = None) -> pd.DataFrame:
    """One row per (pass, new operator): ``before_ms``, the base profile's kernel time per measured iteration in
    the calls of the operators the rewrite replaced (the operators they run included: an aten::linear's
    aten::addmm; in a compiled profile, the kernels computing the FX nodes it replaced or erased) in the modules it
    rewrote (:func:`_before`; kernels outside the measured iterations left out),
    ``before_note`` saying what that counts, or why ``before_ms`` is None (n/a: the profile cannot tell, or has no
    kernel of them); ``after_ms``, the variant's time in the new operator (ms per iteration; None when the
    variant's profile has none).

    ``layer_instances``: given when the variant was compiled layer by layer (``compile_scope: layers``): its records'
    module paths are then relative to the compiled layer (one record serves every instance, whose compiled code they
    share), and each is read in every layer instance named (``transformer.h.0`` + ``attn``); an empty list: the
    base profile names no layer instance, so "before" is n/a."""
    rows = []
    groups: dict[tuple, dict] = {}
    for r in rewrites or []:
        if r.get("skipped") or not r.get("new_op"):
            continue
        key = (r["pass"], r["new_op"])
        g = groups.setdefault(key, {"replaced": set(), "modules": set(), "paths": [], "count": 0, "nodes": set()})
        g["replaced"].update(r.get("replaced_ops") or [])
        path = r.get("module_path")
        if path is None:
            paths = [None]
        elif layer_instances is None:
            paths = [str(path)]
        else:  # (relative to each compiled layer)
            paths = [f"{layer}.{path}" if path else str(layer) for layer in layer_instances] or [None]
        for full in paths:
            if full is not None:  # (the nodes the rewrite replaced or erased, where a compiled profile names them)
                g["nodes"].update((full, str(n)) for n in [*(r.get("replaced_nodes") or []),
                                                           *(r.get("removed_nodes") or [])])
            g["paths"].append(full)
            if full:
                g["modules"].add(full)
        g["count"] += 1
    kernels = base_kernels
    if kernels is not None and "iteration" in kernels and kernels["iteration"].notna().any():
        kernels = kernels[kernels["iteration"].notna()]
    for (name, new_op), g in groups.items():
        if kernels is None or not len(kernels):
            before, note = None, "n/a: the base profile has no kernels"
        else:
            before, note = _before(kernels, g["replaced"], g["paths"], iterations, g["nodes"])
        # the op a rewrite inserts dispatches to the kernel-level op the profile names (on CPU
        # aten::scaled_dot_product_attention runs aten::_scaled_dot_product_flash_attention_for_cpu)
        short = _PROFILED_AS.get(new_op, new_op.split("::")[-1])
        after_rows = variant_operators[variant_operators["operator"].astype(str).str.contains(short, regex=False)]
        after = float(after_rows["time_ns"].sum()) / variant_iterations / 1e6 if len(after_rows) else None
        rows.append({"pass": name, "new_op": new_op, "rewrites": g["count"], "replaced_ops": sorted(g["replaced"]),
                     "modules": sorted(g["modules"]), "before_ms": before, "before_note": note, "after_ms": after,
                     "after_operators": sorted(after_rows["operator"].astype(str))})
    return pd.DataFrame(rows)


def node_groups(base_kernels: pd.DataFrame, variant_kernels: pd.DataFrame, iterations_a: int,
                iterations_b: int) -> pd.DataFrame:
    """Before/after by FX node provenance: kernels of both profiles that carry FX source nodes (compiled graphs),
    grouped per module into the smallest sets of nodes no kernel of either profile crosses (a fused kernel joins
    the nodes it computes), so an operator Inductor replaced (aten::addmm -> mkl::_mkl_linear under freezing)
    is paired with the one it replaces. Columns: module, nodes, before_ms, after_ms (per iteration),
    before_ops, after_ops; empty when either profile has no FX nodes (an eager profile)."""
    sides = []
    for kernels in (base_kernels, variant_kernels):
        if kernels is None or "source_nodes" not in kernels:
            return pd.DataFrame()
        rows = kernels[kernels["source_nodes"].map(lambda n: n is not None and len(n) > 0)]
        if rows.empty:
            return pd.DataFrame()
        sides.append(rows)
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for rows in sides:
        for module, nodes in zip(rows["module"].astype(object).where(rows["module"].notna(), ""), rows["source_nodes"]):
            keys = [(module, str(n)) for n in nodes]
            for k in keys[1:]:
                parent[find(k)] = find(keys[0])
    groups: dict = {}
    for side, (rows, iterations) in enumerate(zip(sides, (iterations_a, iterations_b))):
        for module, nodes, op, ns in zip(rows["module"].astype(object).where(rows["module"].notna(), ""),
                                         rows["source_nodes"], rows["operator"].astype(str), rows["duration_ns"]):
            root = find((module, str(list(nodes)[0])))
            g = groups.setdefault(root, {"module": module, "nodes": set(), "ms": [0.0, 0.0], "ops": [set(), set()]})
            g["nodes"].update(map(str, nodes))
            g["ms"][side] += float(ns) / iterations / 1e6
            g["ops"][side].add(op)
    table = pd.DataFrame([{"module": g["module"], "nodes": sorted(g["nodes"]), "before_ms": g["ms"][0],
                           "after_ms": g["ms"][1], "before_ops": sorted(g["ops"][0]), "after_ops": sorted(g["ops"][1])}
                          for g in groups.values()])
    return table.sort_values("before_ms", ascending=False).reset_index(drop=True)


def _nodes_html(nodes: pd.DataFrame) -> str:
    if nodes is None or nodes.empty:
        return ""
    changed = nodes[nodes["before_ops"].map(tuple) != nodes["after_ops"].map(tuple)]
    rows = [f"<td>{esc(r['module'])}</td><td>{esc(', '.join(r['nodes'][:6]))}"
            + (" ..." if len(r["nodes"]) > 6 else "") + f"</td><td>{esc(' | '.join(r['before_ops']))}</td>"
            f"<td>{esc(' | '.join(r['after_ops']))}</td>"
            + page._num_cell(r["before_ms"], page._fmt(r["before_ms"], 3))
            + page._num_cell(r["after_ms"], page._fmt(r["after_ms"], 3))
            for r in changed.to_dict("records")]
    if not rows:
        return "<p>Every FX node group ran the same operators before and after.</p>"
    return ("<h3>Operators that changed, paired by FX node (compiled graphs: the nodes each kernel computes)</h3>"
            + page._table([("module", "text"), ("FX nodes", "text"), ("before: operators", "text"),
                           ("after: operators", "text"), ("before ms / it.", "num"), ("after ms / it.", "num")],
                          rows, "fx_pairs", scroll=True))


def _operators_section(compare: pd.DataFrame, pairs: pd.DataFrame, base_name: str, variant_name: str,
                       nodes: pd.DataFrame | None = None) -> str:
    rows = [f"{page._name_cell(r['operator'], r['operator'][:80])}<td>{esc(r['side'])}</td>"
            + page._num_cell(r["a_ms"], page._fmt(r["a_ms"], 3)) + page._num_cell(r["b_ms"], page._fmt(r["b_ms"], 3))
            + page._num_cell(r["delta_ms"], page._fmt(r["delta_ms"], 3)) + f"<td>{esc(r['change'])}</td>"
            for r in compare.to_dict("records")]
    table = page._table([("operator", "text"), ("in", "text"), ("before ms / it.", "num"), ("after ms / it.", "num"),
                         ("delta ms", "num"), ("change", "text")], rows, "operators", scroll=True)
    pair_html = ""
    if len(pairs):
        prow = [f"<td>{esc(p['pass'])}</td><td>{esc(p['new_op'])} ({p['rewrites']}x)</td>"
                f"<td>{esc(', '.join(p['replaced_ops']))} in {esc(', '.join(p['modules'][:4]))}"
                + (" ..." if len(p["modules"]) > 4 else "") + "</td>"
                + (page._num_cell(p["before_ms"], page._fmt(p["before_ms"], 3)) if p["before_ms"] is not None
                   and not pd.isna(p["before_ms"]) else '<td class="num" data-v="">n/a</td>')
                + page._num_cell(p["after_ms"], page._fmt(p["after_ms"], 3))
                + f"<td>{esc(p.get('before_note') or '')}</td>"
                + f"<td>{esc(', '.join(p['after_operators']) or 'not found in the profile')}</td>"
                for p in pairs.to_dict("records")]
        pair_html = ("<h3>Rewrites: each new operator and the operators it replaces (FX node provenance)</h3>"
                     "<p>Before: the base profile's kernel time in the replaced operators' calls, the operators "
                     "they run included (an aten::linear's aten::addmm), in the rewritten modules; where the "
                     "profile attributes kernels only to a larger region (a layer instance, or none outside the "
                     "layer ranges), the column before: what it counts says so; n/a where the profile cannot tell.</p>"
                     + page._table([("pass", "text"), ("new operator", "text"), ("replaces", "text"),
                                    ("before ms / it.", "num"), ("after ms / it.", "num"),
                                    ("before: what it counts", "text"), ("after: profiled as", "text")], prow,
                                   "rewrites", sortable=False))
    return (f'<section id="operators"><h2>Before and after, per operator</h2><p>Kernel time per measured iteration '
            f"of each operator in the profile of <code>{esc(base_name)}</code> (before) and of "
            f"<code>{esc(variant_name)}</code> (after); <a href=\"compare.html\">compare.html</a> has the full "
            "comparison page.</p>" + pair_html + _nodes_html(nodes) + table + "</section>")


def _coverage_section(coverage: dict, variant_name: str) -> str:
    share = coverage.get("coverage_time")
    paths = ", ".join(f"{p} {s:.1%}" for p, s in sorted((coverage.get("by_path") or {}).items()))
    flag = "" if share is None or share >= 0.95 else (
        ' <strong class="warn">below 0.95: kernels of the optimized model went unattributed</strong>')
    return (f'<section id="coverage"><h2>Coverage of the optimized profile</h2><p><code>{esc(variant_name)}</code>: '
            f"{coverage.get('attributed_count')} of {coverage.get('kernel_count')} kernels attributed, "
            f"{'' if share is None else f'{share:.2%}'} of kernel time{flag}; by path: {esc(paths)}.</p></section>")


def render_optimize(workload: str, advice: dict, verification: dict, compare: pd.DataFrame, pairs: pd.DataFrame,
                    variant_name: str, variant_coverage: dict, nodes: pd.DataFrame | None = None) -> str:
    """The page (module docstring)."""
    warnings = verification.get("warnings") or []
    rec = verification["ablation"]["recommended"]
    speedup = rec.get("speedup") or {}
    kpis = page._kpis([
        ("advised", " + ".join(advice.get("advised_changes") or []) or "no change"),
        ("recommended", " + ".join(rec.get("changes") or []) or "no change"),
        ("speedup (wall, vs FP32 eager)", _interval(speedup.get("value"), speedup.get("ci"), "x") or "n/a"),
        ("optimized coverage", "" if variant_coverage.get("coverage_time") is None
         else f"{variant_coverage['coverage_time']:.1%}"),
    ] + _threads_kpi(verification))
    warn_html = ("<section id=\"warnings\"><h2>Warnings</h2><ul>" + "".join(f"<li>{esc(w)}</li>" for w in warnings)
                 + "</ul></section>") if warnings else ""
    body = (kpis + _advice_section(advice) + _variants_section(verification) + _ablation_section(verification)
            + _operators_section(compare, pairs, workload, variant_name, nodes) + _coverage_section(variant_coverage,
                                                                                             variant_name) + warn_html)
    nav = [("advice", "Advice"), ("variants", "Variants"), ("ablation", "Ablation"), ("operators", "Operators"),
           ("coverage", "Coverage")] + ([("warnings", "Warnings")] if warnings else [])
    return page._page(f"Optimization: {workload}", esc(f"device {verification.get('device')}"), nav, body)
