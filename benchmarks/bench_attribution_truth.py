"""Operators and counters against ground truth: the pipeline's stages on many seeded programs whose every kernel's
operator and ncu row are known.

    python benchmarks/bench_attribution_truth.py                       # every scenario, 20 seeds each
    python benchmarks/bench_attribution_truth.py --seeds 50 --jobs 2
    python benchmarks/bench_attribution_truth.py --scenario cuda_graph --scenario clean --details
    python benchmarks/bench_attribution_truth.py --scenario clean --first-seed 7 --seeds 1 --keep /tmp/case

The programs, the files written for them and the rules of what the input determines are in
``tests/ground_truth.py`` (scenarios, docstring), ``tests/truth_formats.py`` and ``tests/truth_inductor.py``; the
stages run and the scoring in ``tests/truth_score.py``. One row per scenario:

* ``kernels``: timeline kernels over all programs (``lost``: kernels of the truth the timeline reader did not
  return, by (device, start_ns); ``extra``: kernels it returned beyond the truth's, e.g. a record the file holds
  twice counted twice);
* ``op P`` = right operators / operators given; ``op R`` = right operators / kernels whose operator the input
  determines; ``nodes P/R`` the same for Inductor source nodes (``-`` when the scenario has none);
* ``ctr P`` = attached counter rows that are the kernel's own (the token metric proves it) / attached rows;
  ``ctr R`` = kernels given their own row / kernels whose pairing the input determines (``det`` of ``pairs``,
  the kernels that have an ncu row at all);
* ``refused``: kernels with an ncu row but no counters, by the reason ``matched/diagnostics.json`` gives;
* ``silent``: refusals nobody sees: kernels with an ncu row and no counters missing from ``timeline_only_kernels``,
  plus ncu rows attached to no kernel missing from ``ncu_only_rows`` (goal: 0);
* ``err``: programs where a stage raised; ``s``: wall time.

Goals: op P and ctr P 100 %, op R and ctr R >= 99 %, ``lost`` and ``extra`` 0. The scenarios ``duplicate_records``
(kernel records written twice) and ``pid_reuse`` (processes that used one pid in turn) are the cases of
docs/field-cases.md C24 and C25. ``--details`` lists every failure with its seed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from ground_truth import all_scenarios
from truth_score import Score, run_case


def _one(job: tuple[str, int, str | None]) -> tuple[str, Score]:
    scenario, seed, keep = job
    if keep:
        folder = Path(keep) / f"{scenario}_{seed}"
        shutil.rmtree(folder, ignore_errors=True)
        score, _ = run_case(scenario, seed, folder)
        return scenario, score
    with tempfile.TemporaryDirectory(prefix=f"truth-{scenario}-{seed}-") as tmp:
        score, _ = run_case(scenario, seed, Path(tmp))
    return scenario, score


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _reasons(counter: Counter, width: int = 46) -> str:
    text = ", ".join(f"{reason} {n}" for reason, n in counter.most_common())
    return (text[: width - 1] + "…") if len(text) > width else (text or "-")


def table(scores: dict[str, Score]) -> str:
    head = (f"{'scenario':<22} {'progs':>5} {'kernels':>7} {'lost':>4} {'extra':>5} {'op P':>7} {'op R':>7} {'nodes P':>7} "
            f"{'nodes R':>7} {'pairs':>6} {'det':>6} {'ctr P':>7} {'ctr R':>7} {'silent':>6} {'err':>4} {'s':>6}  refused")
    lines = [head, "-" * len(head)]
    for name, s in scores.items():
        lines.append(
            f"{name:<22} {s.cases:>5} {s.kernels:>7} {s.not_in_timeline:>4} {s.extra_in_timeline:>5} "
            f"{_pct(s.op_precision):>7} "
            f"{_pct(s.op_recall):>7} {_pct(s.nodes_precision):>7} {_pct(s.nodes_recall):>7} {s.pairs:>6} "
            f"{s.ctr_determined:>6} {_pct(s.ctr_precision):>7} {_pct(s.ctr_recall):>7} "
            f"{s.silent_kernels + s.silent_rows:>6} "
            f"{len({e[0] for e in s.errors}):>4} {s.seconds:>6.1f}  {_reasons(s.refused)}")
    return "\n".join(lines)


def _seeds(items) -> str:
    seeds = sorted({item[0] for item in items})
    return ", ".join(map(str, seeds[:12])) + (f" (+{len(seeds) - 12})" if len(seeds) > 12 else "")


def failures(scores: dict[str, Score], examples: int) -> str:
    """Per scenario: what went wrong, grouped, with the seeds that show it."""
    out = []
    for name, s in scores.items():
        parts = []
        errors = Counter((stage, msg[:150]) for _, stage, msg in s.errors)
        for (stage, msg), n in errors.most_common():
            seeds = _seeds([e for e in s.errors if e[1] == stage and e[2][:150] == msg])
            parts.append(f"  error in {stage} ({n}x; seeds {seeds}): {msg}")
        for label, items in (("wrong operator", s.wrong_operators), ("wrong counters", s.wrong_counters)):
            if items:
                parts.append(f"  {label}: {len(items)} kernels (seeds {_seeds(items)})")
                parts += [f"    seed {i[0]}: {i[1]}: truth {i[2]!r}, answer {i[3]!r}" for i in items[:examples]]
        missed = Counter(reason for _, _, reason in s.missed_counters)
        if missed:
            parts.append(f"  determined counters not attached: {_reasons(missed, 200)} "
                         f"(seeds {_seeds(s.missed_counters)})")
        if s.missed_operators:
            ops = Counter(truth for _, _, truth in s.missed_operators)
            parts.append(f"  determined operators not given: {len(s.missed_operators)} ({_reasons(ops, 160)}; "
                         f"seeds {_seeds(s.missed_operators)})")
        if parts:
            out.append(f"{name}:\n" + "\n".join(parts))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    known = list(all_scenarios())
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="programs per scenario (default 20)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--scenario", action="append", choices=known, help="repeatable; default: all")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    parser.add_argument("--keep", help="keep each program's folder under KEEP/<scenario>_<seed>")
    parser.add_argument("--details", action="store_true", help="list the failures with their seeds")
    parser.add_argument("--examples", type=int, default=3, help="examples per failure kind with --details")
    args = parser.parse_args(argv)
    scenarios = args.scenario or known
    jobs = [(s, seed, args.keep) for s in scenarios for seed in range(args.first_seed, args.first_seed + args.seeds)]
    start = time.perf_counter()
    scores = {s: Score() for s in scenarios}
    if args.jobs > 1:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.imap_unordered(_one, jobs)
            for scenario, score in results:
                scores[scenario].add(score)
    else:
        for job in jobs:
            scenario, score = _one(job)
            scores[scenario].add(score)
    print(table(scores))
    print(f"\n{len(jobs)} programs, seeds {args.first_seed}..{args.first_seed + args.seeds - 1}, "
          f"{time.perf_counter() - start:.1f} s wall")
    if args.details:
        print("\n" + (failures(scores, args.examples) or "no failures"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
