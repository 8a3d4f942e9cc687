"""The toy CUDA program of ``scripts/gpu-check --first-contact`` (:mod:`operator_profiler.first_contact`).

``python -m operator_profiler.first_contact_toy --out RUN.json [--profiler torch --trace T.json.gz]``. It warms up
(a Triton kernel compiled by torch.compile, a cuBLAS GEMM, an elementwise kernel and ``torch.cuda._sleep``'s spin
kernel: many launches before the window), then runs its window exactly as the harness does
(:func:`operator_profiler.capture.harness.cuda_profiler_range`'s pieces):

    cudaProfilerStart
      NVTX start/end range opprof.measured (domain opprof)
        K0 fill (x.fill_)      K1 GEMM (cuBLAS)      K2 Triton (compiled x * 2 relu + 1)      K3 mul (x.mul_)
      end of the range
      K4 spin (torch.cuda._sleep): inside the profiler range, outside the NVTX range
    cudaProfilerStop

so an ncu run tells which launches each filter selects and counts. ``--profiler torch`` records the same window
with torch.profiler (Kineto: the timeline's kernel names); RUN.json says what ran (``window``: the kernels meant,
``launches_before_window``: a lower bound of the warm-up launches).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WINDOW = ("fill", "gemm", "triton", "mul")  # K0..K3 inside the NVTX range
AFTER_RANGE = "spin"  # K4: after the NVTX range, before cudaProfilerStop
WARMUP_ROUNDS = 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--profiler", choices=("none", "torch"), default="none")
    p.add_argument("--trace", type=Path)
    args = p.parse_args(argv)

    import torch

    from .capture.harness import _start_measured_range, measured_range_record

    if not torch.cuda.is_available():
        raise SystemExit("first_contact_toy: torch sees no CUDA GPU")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    a, b = torch.randn(512, 512, device=dev), torch.randn(512, 512, device=dev)
    x = torch.randn(1 << 20, device=dev)
    fused = torch.compile(lambda t: torch.relu(t * 2) + 1)

    def window() -> None:
        x.fill_(1.0)
        torch.mm(a, b)
        fused(x)
        x.mul_(2)

    launches = 0
    for _ in range(WARMUP_ROUNDS):  # compile, cuBLAS handles and heuristics, lazy module loads: before the window
        window()
        torch.cuda._sleep(1000)
        launches += len(WINDOW) + 1
    torch.cuda.synchronize()

    def bracketed() -> None:
        torch.cuda.profiler.start()
        end = _start_measured_range()
        window()
        torch.cuda.synchronize()
        end()
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()

    if args.profiler == "torch":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            bracketed()
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(args.trace))
    else:
        bracketed()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "window": list(WINDOW), "after_range": AFTER_RANGE, "launches_before_window": launches,
        "measured_range": measured_range_record(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
