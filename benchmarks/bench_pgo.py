"""The profile-guided optimization benchmark: wall time per iteration of each case-study workload under
the baselines, the advised variant and the best combination of the catalog's settings found by exhaustive
search, with medians, speedups over FP32 eager and their 95 % bootstrap intervals, page faults per iteration
and numerics against the FP32 eager reference.

    python benchmarks/bench_pgo.py --advised compile,freezing [--workloads gpt2,sdpa_attention]
        [--advice 'results/{workload}/advice.json'] [--repetitions 20] [--processes 2] [--threads N]
        [--group-size 5] [--no-search] [--quick] [--device cpu|cuda|auto] [--out bench_pgo.json] [--force-int8]
        [--build module:function]

Goal sizes: GPT-2 small (12 layers, width 768, 12 heads, vocab 50257, n_positions 1024, batch 1, sequence 128,
explicit attention: the ``gpt2`` kind) and the 4-block SDPA stack (width 512, 8 heads, batch 4, sequence 256:
the ``sdpa_attention`` kind); ``--quick`` runs tiny sizes (a smoke run, minutes). Each measurement is
:func:`operator_profiler.optimize.timing.measure`: variants interleaved, repetitions split over worker processes
run one after another. The advised change list comes from ``--advice`` (a path, ``{workload}`` replaced by the
workload's name: the ``advise`` rule's ``advice.json``, key ``advised_changes``) or ``--advised`` (ids, comma-
separated, for every workload). The first measurement of a workload is the ablation plan (baselines, each
advised change alone, the cumulative prefixes, the full set without each change: optimize.ablation.plan); the
exhaustive search measures every valid combination of {compile, max_autotune, freezing, bf16_autocast,
sdpa_rewrite, int8_dynamic} not measured yet, in groups of ``--group-size`` that each include fp32_eager (20 variants of a 124M-parameter model do not fit in memory at
once; each group's speedups are against its own fp32_eager). Combinations whose preconditions fail on this
machine (bf16 without native bf16, int8 without VNNI/AMX) are listed as skipped with the reason; when int8 is
skipped so, the benchmark says why it is not advised here, with the figures measured on a CPU without VNNI
(``--force-int8`` measures its combinations anyway, :data:`operator_profiler.transforms.vocabulary.FORCE_INT8_ENV`
set for the workers, to state whether it pays on this CPU). Numerics of a workload whose output is logits include
the top-1 agreement. The estimated run time is printed before anything is measured.

Stopped with SIGTERM or Ctrl-C, it kills the timing worker it is waiting for, prints one line and exits with 143
(130); a worker also dies by itself when this process is killed outright (timing_worker.die_with_parent).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import signal
import sys
import time
from pathlib import Path

from operator_profiler.errors import UserError
from operator_profiler.optimize import ablation, timing, verify

GOAL = {
    "gpt2": {"kind": "gpt2", "compile": False, "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
             "n_positions": 1024, "batch_size": 1, "seq_len": 128},
    "sdpa_attention": {"kind": "sdpa_attention", "compile": False, "d_model": 512, "n_head": 8, "n_block": 4,
                       "batch_size": 4, "seq_len": 256},
}
QUICK = {
    "gpt2": {"kind": "gpt2", "compile": False, "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512,
             "n_positions": 128, "batch_size": 1, "seq_len": 32},
    "sdpa_attention": {"kind": "sdpa_attention", "compile": False, "d_model": 64, "n_head": 4, "n_block": 2,
                       "batch_size": 2, "seq_len": 32},
}
#: The catalog's settings the exhaustive search combines.
SEARCH = ("compile", "max_autotune", "freezing", "bf16_autocast", "sdpa_rewrite", "int8_dynamic")


def advised_changes(args, workload: str) -> list[str]:
    """The advised change ids of ``workload`` (``--advised`` wins over ``--advice``).

    Raises:
        SystemExit: neither given, or the advice file unreadable or without ``advised_changes``.
    """
    if args.advised is not None:
        return [c for c in args.advised.split(",") if c]
    if not args.advice:
        sys.exit("bench_pgo: give --advised compile,freezing or --advice 'results/{workload}/advice.json'")
    path = Path(args.advice.replace("{workload}", workload))
    try:
        advised = json.loads(path.read_text())["advised_changes"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"bench_pgo: cannot read advised_changes from {path} ({type(exc).__name__}: {exc}); run the "
                 "advise rule for this workload first, or pass --advised")
    if not isinstance(advised, list) or not all(isinstance(c, str) for c in advised):
        sys.exit(f"bench_pgo: {path}: advised_changes must be a list of change ids")
    return advised


def preconditions(device: str):
    """``(features, problems(changes) -> list[str], source)`` from transforms.changes; without it the preconditions
    are not checked (every combination is measured and a failing build is rejected by the worker)."""
    try:
        from operator_profiler.transforms.changes import machine_features, precondition_problems
    except ImportError as exc:
        from operator_profiler.capture import machine

        native = bool(machine.native_bf16(machine.cpu_info().get("flags") or [])) if device == "cpu" else False
        return ({"native_bf16": native}, lambda changes, mode: [],
                f"preconditions not checked: operator_profiler.transforms.changes is not importable ({exc})")
    features = machine_features(device)
    return (features, lambda changes, mode: precondition_problems(changes, device, mode, features),
            f"preconditions from operator_profiler.transforms.changes ({features.get('native_bf16_source')}; int8: "
            f"{features.get('native_int8_source')})")


def search_space(problems, mode: str) -> tuple[list[list[str]], list[dict]]:
    """Every distinct combination of :data:`SEARCH` (closed under requirements), split into the valid ones and
    the skipped ones (``{"changes", "reason"}``)."""
    seen, valid, skipped = set(), [], []
    for size in range(len(SEARCH) + 1):
        for combination in itertools.combinations(SEARCH, size):
            changes = ablation.closure(combination)
            if frozenset(changes) in seen:
                continue
            seen.add(frozenset(changes))
            reasons = problems(changes, mode)
            (skipped.append({"changes": changes, "reason": "; ".join(reasons)}) if reasons else valid.append(changes))
    return valid, skipped


def groups_of(planned: dict[str, list[str]], combinations: list[list[str]], size: int) -> list[dict[str, list[str]]]:
    """The ablation plan as the first group, then the combinations not in it, ``size`` per group, each with
    fp32_eager."""
    measured = {frozenset(c) for c in planned.values()}
    rest = [c for c in combinations if frozenset(c) not in measured]
    groups = [dict(planned)]
    for start in range(0, len(rest), size):
        groups.append({"fp32_eager": [], **{ablation.variant_name(c): c for c in rest[start:start + size]}})
    return groups


def eager_iteration_s(workload: dict, threads: int | None, device: str) -> float:
    """The FP32 eager iteration time of ``workload`` here (median of 3 after one warm-up), for the estimate."""
    import torch

    from operator_profiler.capture.workloads import build_workload
    from operator_profiler.config import validate_config

    if threads:
        torch.set_num_threads(threads)
    cfg = validate_config({"workloads": {"w": workload}}, "bench_pgo")["workloads"]["w"]
    torch.manual_seed(0)
    model, inputs = build_workload(cfg, torch.device(device))
    model.eval()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    with torch.no_grad():
        for _ in range(4):
            start = time.perf_counter()
            model(*inputs)
            sync()
            times.append(time.perf_counter() - start)
    del model, inputs
    gc.collect()
    return sorted(times[1:])[1]


def estimate_s(groups: list[dict], iteration_s: float, args) -> float:
    """Seconds one workload's measurements take: per process and variant its build, compilation
    (``--compile-estimate-s`` when it compiles, plus ``--autotune-estimate-s`` with max_autotune) and a warm-up of
    about 15 iterations; per repetition and variant max(``min_repetition_s``, one iteration); per process the
    worker's start (torch import, about 5 s).
    Compiled variants are taken as fast as eager (an upper bound where they are faster)."""
    total = 0.0
    for group in groups:
        per_process = 5.0 + sum(2.0 + 15 * iteration_s + (args.compile_estimate_s if changes else 0.0)
                                + (args.autotune_estimate_s if "max_autotune" in changes else 0.0)
                                for changes in group.values())
        total += args.processes * per_process + args.repetitions * len(group) * max(args.min_repetition_s,
                                                                                    iteration_s)
    return total


def _figure(speedup: dict | None) -> str:
    if not speedup:
        return "-"
    return f"{speedup['value']:.2f}x [{speedup['ci'][0]:.2f}, {speedup['ci'][1]:.2f}]"


def _numerics(entry: dict) -> str:
    if entry.get("rejected"):
        return f"REJECTED: {entry['rejected']}"
    numerics = entry.get("numerics") or {}
    if not numerics:
        return "not checked"
    in_dtype = entry.get("numerics_in_dtype") or {}
    tight = (f"; vs {in_dtype['against'].split(' (')[0]} max_rel {in_dtype['max_rel']:.1e} <= "
             f"{in_dtype['limits']['max_rel']:.1e}" if in_dtype.get("limits") else "")
    top1 = (f", top-1 {numerics['top1_agreement']:.2%} of {numerics.get('top1_positions')}"
            if numerics.get("top1_agreement") is not None else "")
    return f"{'ok' if numerics.get('ok') else 'FAIL'} (max_rel {numerics.get('max_rel', float('nan')):.1e}, " \
           f"cos {numerics.get('cosine', float('nan')):.6f}{top1}{tight})"


def int8_verdict(results: list[dict], skipped: list[dict]) -> str | None:
    """One line on int8_dynamic: why it is not advised here (its precondition, with the figures it measured on a
    CPU without VNNI) when it was skipped, else its best measured combination against the best without it."""
    if any("int8_dynamic" in item["changes"] for item in skipped):
        reason = next(item["reason"] for item in skipped if "int8_dynamic" in item["changes"])
        return (f"not advised on this CPU: {reason.split('; ')[0]} (--force-int8 measures it here)")
    measured = [(entry["speedup"]["value"], entry) for result in results for entry in result["variants"].values()
                if entry.get("speedup") and not entry.get("rejected")]
    with_int8 = [m for m in measured if "int8_dynamic" in m[1]["changes"]]
    rejected = [entry for result in results for entry in result["variants"].values()
                if entry.get("rejected") and "int8_dynamic" in entry["changes"]]
    if not with_int8:
        return (f"every int8 variant was rejected ({rejected[0]['rejected']})" if rejected else None)
    best, entry = max(with_int8, key=lambda m: m[0])
    other = max((m for m in measured if "int8_dynamic" not in m[1]["changes"]), key=lambda m: m[0], default=None)
    top1 = (entry.get("numerics") or {}).get("top1_agreement")
    return (f"best with int8 {'+'.join(entry['changes'])} {best:.2f}x"
            + (f" (top-1 agreement {top1:.2%})" if top1 is not None else "")
            + (f" against the best without it {'+'.join(other[1]['changes'])} {other[0]:.2f}x" if other else "")
            + (f"; {len(rejected)} int8 variant(s) rejected, e.g. {rejected[0]['rejected']}" if rejected else ""))


def row(label: str, entry: dict | None) -> str:
    if entry is None:
        return f"  {label:<18} (not measured)"
    changes = "+".join(entry["changes"]) or "-"
    if entry.get("rejected"):
        return f"  {label:<18} {changes:<42} {_numerics(entry)}"
    faults = entry["faults_per_iteration"]
    return (f"  {label:<18} {changes:<42} {entry['median_ms']:>9.3f} [{entry['ci_ms'][0]:.3f}, {entry['ci_ms'][1]:.3f}]"
            f"  {_figure(entry['speedup']):<24} {faults['minor']:>8.0f} {faults['major']:>5.0f}  {_numerics(entry)}")


def report(name: str, workload: dict, advised: list[str], results: list[dict], record: dict, skipped: list[dict],
           checked: str, searched: bool) -> dict:
    """Print one workload's table; return its summary (advised, best, their ratio)."""
    plan_result = results[0]
    print(f"\n== {name}: {json.dumps({k: v for k, v in workload.items() if k != 'compile'})}")
    print(f"   device {plan_result['device']}, {plan_result['threads']} thread(s), {plan_result['repetitions']} "
          f"repetitions over {plan_result['processes']} processes per group; {checked}")
    loads = [p.get("other_cpu_load") for result in results for p in result["processes_info"]]
    print(f"   CPUs kept busy by other processes during the repetitions, per process: {loads}")
    print(f"  {'':<18} {'changes':<42} {'median ms [95% CI]':>28}  {'speedup vs fp32_eager':<24} "
          f"{'minflt/it':>8} {'majflt/it':>5}  numerics")
    variants = plan_result["variants"]
    for label in ablation.BASELINE_NAMES:
        print(row(label, variants.get(label)))
    advised_entry = ablation._find(plan_result, advised)
    print(row("advised", advised_entry[1] if advised_entry else None))
    recommended = record["ablation"]["recommended"]
    if frozenset(recommended["changes"]) != frozenset(ablation.closure(advised)):
        found = ablation._find(plan_result, recommended["changes"])
        print(row("recommended", found[1] if found else None))
    candidates = [(entry["speedup"]["value"], index, key, entry) for index, result in enumerate(results)
                  for key, entry in result["variants"].items()
                  if not entry.get("rejected") and entry.get("speedup") and set(entry["changes"]) <= set(SEARCH)]
    best = max(candidates, key=lambda c: c[0]) if candidates else None
    label = "best of search" if searched else "best measured"
    if best:
        print(row(label, best[3]) + f"   (group {best[1]})")
    print("  ablation (step: cumulative, advised order; credit: the loss when removed from the full advised set):")
    for step in record["ablation"]["steps"]:
        print(f"    {step['change']:<16} {'+'.join(step['context']) or 'fp32_eager':>34} -> +{step['change']:<16} "
              f"{_figure(step['speedup']):<24} {step['decision']:<9} credit {_figure(step['credit'])}"
              + (f"  ({step['reason']})" if step["decision"] != "kept" or not step["credit"] else "")
              + (f"  [{step['interaction']}]" if step.get("interaction") else ""))
    strong = (f", strong_generic REJECTED ({recommended['strong_generic_rejected']}): not compared with it"
              if recommended.get("strong_generic_rejected") else
              f", vs strong_generic {_figure(recommended.get('vs_strong_generic'))}"
              f"{' SLOWER' if recommended.get('slower_than_strong_generic') else ''}")
    print(f"  recommended: {recommended['name']}"
          + (strong if recommended.get("measured") else " (not measured as a whole)")
          + (f"; instead of {ablation.variant_name(recommended['instead_of']['changes'])}: {recommended['reason']}"
             if recommended.get("instead_of") else ""))
    summary = {"advised": advised, "best": None, "advised_vs_best": None}
    if best:
        summary["best"] = {"changes": best[3]["changes"], "speedup": best[3]["speedup"], "group": best[1]}
        if advised_entry and advised_entry[1].get("speedup"):
            ratio = advised_entry[1]["speedup"]["value"] / best[0]
            summary["advised_vs_best"] = ratio
            print(f"  advised / {label}: {ratio:.3f} ({'within' if ratio >= 0.95 else 'NOT within'} 5 %; "
                  "speedups against each group's own fp32_eager)" + ("" if searched else " (--no-search)"))
    for index, result in enumerate(results[1:], 1):
        eager = result["variants"]["fp32_eager"]
        print(f"  search group {index}: fp32_eager {eager.get('median_ms', float('nan')):.3f} ms")
        for key, entry in result["variants"].items():
            if key != "fp32_eager":
                print(row("", entry))
    for item in skipped:
        print(f"  skipped {'+'.join(item['changes'])}: {item['reason']}")
    int8 = int8_verdict(results, skipped)
    if int8:
        print(f"  int8: {int8}")
    for index, result in enumerate(results):
        for warning in (record["warnings"] if index == 0 else result["warnings"]):
            print(f"  warning{' (search group %d)' % index if index else ''}: {warning}")
    return summary


def _stop(number, frame):
    """SIGTERM as Ctrl-C: the KeyboardInterrupt unwinds through timing.measure, which kills its worker."""
    _stop.number = number
    raise KeyboardInterrupt


_stop.number = signal.SIGINT


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    try:
        return _main()
    except KeyboardInterrupt:
        name = signal.Signals(_stop.number).name
        print(f"bench_pgo: stopped by {name}; the running timing worker was stopped with it", file=sys.stderr)
        return 128 + int(_stop.number)


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="gpt2,sdpa_attention")
    parser.add_argument("--advised", help="advised change ids, comma-separated (for every workload)")
    parser.add_argument("--advice", help="advice.json path; {workload} is replaced by the workload's name")
    parser.add_argument("--repetitions", type=int, default=timing.MIN_REPETITIONS)
    parser.add_argument("--processes", type=int, default=timing.MIN_PROCESSES)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in each worker")
    parser.add_argument("--min-repetition-s", type=float, default=0.1)
    parser.add_argument("--group-size", type=int, default=5, help="search variants per measurement (+ fp32_eager)")
    parser.add_argument("--no-search", action="store_true", help="skip the exhaustive search")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--compile-estimate-s", type=float, default=None,
                        help="assumed compile time per compiled variant and process (default 120 s, --quick 45 s)")
    parser.add_argument("--autotune-estimate-s", type=float, default=None,
                        help="assumed extra time of max_autotune per variant and process (default 240 s, --quick 60 s)")
    parser.add_argument("--build", default=timing.DEFAULT_BUILD, help="variant builder, package.module:function")
    parser.add_argument("--numerics", default=timing.DEFAULT_NUMERICS, help="numerics module")
    parser.add_argument("--work-dir", default="results/bench_pgo", help="specs, worker logs and results")
    parser.add_argument("--out", help="write every result and verification record here (JSON)")
    parser.add_argument("--force-int8", action="store_true",
                        help="measure int8_dynamic on a CPU without VNNI/AMX (where it is not offered)")
    args = parser.parse_args()
    if args.compile_estimate_s is None:
        args.compile_estimate_s = 45.0 if args.quick else 120.0
    if args.autotune_estimate_s is None:  # it benchmarks each GEMM shape's choices (about 9 s per shape, 2 cores)
        args.autotune_estimate_s = 60.0 if args.quick else 240.0
    sizes = QUICK if args.quick else GOAL
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in sizes]
    if unknown:
        sys.exit(f"bench_pgo: unknown workload(s) {unknown}; choose among {sorted(sizes)}")
    mode = "infer"
    if args.force_int8:  # read by machine_features, here and in the timing workers this process starts
        import os

        from operator_profiler.transforms.vocabulary import FORCE_INT8_ENV

        os.environ[FORCE_INT8_ENV] = "1"
    try:
        from operator_profiler.capture.harness import resolve_device

        device = resolve_device(args.device)
        timing.check_importable(args.build, args.numerics)
    except UserError as exc:
        sys.exit(f"bench_pgo: {exc}")
    features, problems, checked = preconditions(device)
    baselines = ablation.default_baselines(bool(features.get("native_bf16")), mode)
    plans = {}
    total = 0.0
    print(f"bench_pgo: {'quick (tiny sizes)' if args.quick else 'goal sizes'}, {args.repetitions} repetitions over "
          f"{args.processes} processes, device {device}; {checked}")
    for name in names:
        advised = advised_changes(args, name)
        planned = ablation.plan(advised, baselines)
        valid, skipped = search_space(problems, mode) if not args.no_search else ([], [])
        groups = groups_of(planned, valid, args.group_size)
        iteration_s = eager_iteration_s(sizes[name], args.threads, device)
        seconds = estimate_s(groups, iteration_s, args)
        total += seconds
        plans[name] = (advised, groups, skipped)
        print(f"  {name}: advised {advised or '(nothing)'}; {len(groups)} measurement(s), "
              f"{sum(len(g) for g in groups)} variant builds per process; eager iteration {iteration_s * 1e3:.1f} ms; "
              f"estimated {seconds / 60:.1f} min")
    print(f"estimated run time: {total / 60:.1f} min (assuming {args.compile_estimate_s:.0f} s of compilation per "
          f"compiled variant and process, {args.autotune_estimate_s:.0f} s more with max_autotune; "
          "--compile-estimate-s, --autotune-estimate-s)", flush=True)
    started = time.perf_counter()
    out: dict = {}
    try:
        for name in names:
            advised, groups, skipped = plans[name]
            results = []
            for index, variants in enumerate(groups):
                spec = {"workload": sizes[name], "workload_name": name, "variants": variants, "device": device,
                        "mode": mode, "threads": args.threads, "repetitions": args.repetitions,
                        "processes": args.processes, "min_repetition_s": args.min_repetition_s}
                results.append(timing.measure(spec, build=args.build, numerics=args.numerics,
                                              work_dir=Path(args.work_dir) / name / f"group-{index}",
                                              progress=lambda line: print(f"  [{time.strftime('%H:%M:%S')}] {line}",
                                                                          flush=True)))
            first = {**spec, "variants": groups[0]}
            verify.refine_borderline(first, results[0], advised, Path(args.work_dir) / name / "group-0",
                                     build=args.build, numerics=args.numerics,
                                     progress=lambda line: print(f"  [{time.strftime('%H:%M:%S')}] {line}",
                                                                 flush=True))
            record = ablation.verification(results[0], advised)  # its refined and measure_more: the extra rounds
            summary = report(name, sizes[name], advised, results, record, skipped, checked, not args.no_search)
            out[name] = {"verification": record, "search": results[1:], "skipped": skipped, "summary": summary}
    except UserError as exc:
        print(f"bench_pgo: {exc}", file=sys.stderr)
        return 1
    print(f"\nbench_pgo: done in {(time.perf_counter() - started) / 60:.1f} min")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
        print(f"bench_pgo: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
