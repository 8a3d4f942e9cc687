"""The program an ncu replay runs: the workload harness once more, its measured iterations between
``cudaProfilerStart`` and ``cudaProfilerStop`` (``harness.run_capture(profiler="cuda_profiler_api")``), so
``ncu --profile-from-start off`` counts launches from the first measured kernel, as the timeline does
(:mod:`operator_profiler.ncu.replay`).

argv contract (:func:`operator_profiler.ncu.replay.target_argv`)::

    python -m operator_profiler.ncu.replay_target --workload JSON --harness JSON --out DIR [--name NAME]

``--workload``: the workload's config slice; ``--harness``: ``{"seed", "warmup", "iterations"}``; ``--out``:
where the re-run writes its ``layers.json`` and ``run.json``. Device: ``cuda``. A user error (bad workload,
no GPU) is one line on stderr and exit status 1.

TODO(capture side, issue #6): replace with the capture stage's own entry for a ``cuda_profiler_api`` run
once it exists (the nsys capture needs the same window).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m operator_profiler.ncu.replay_target", description=__doc__)
    p.add_argument("--workload", required=True, help="the workload's config slice (JSON)")
    p.add_argument("--harness", required=True, help='{"seed", "warmup", "iterations"} (JSON)')
    p.add_argument("--out", required=True, help="folder for the re-run's layers.json and run.json")
    p.add_argument("--name", help="the workload's name in the config (error messages)")
    args = p.parse_args(argv)
    from operator_profiler import harness
    from operator_profiler.errors import USER_ERRORS

    out = Path(args.out)
    try:
        harness.run_capture(json.loads(args.workload), json.loads(args.harness), "cuda", None, out / "layers.json",
                            out / "run.json", profiler="cuda_profiler_api", workload_name=args.name)
    except USER_ERRORS as exc:
        print(f"replay target: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
