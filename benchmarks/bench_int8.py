"""Which int8 path pays for CPU inference: the measurement behind the ``int8_dynamic`` change (docs/optimize.md,
"int8_dynamic: how it was chosen").

    python benchmarks/bench_int8.py [--quick] [--repetitions 15] [--threads N] [--sequences 8]
        [--candidates fp32_eager,compile_freezing,ao_dynamic,ao_dynamic_compile,pt2e_x86_dynamic]

Builds the built-in ``gpt2`` workload (GPT-2 small: 12 layers, width 768, vocab 50257, batch 1, sequence 128;
``--quick``: a tiny one) and times, interleaved (each repetition runs every candidate once, in a shuffled order):

- ``fp32_eager``: the model as it is;
- ``compile_freezing``: torch.compile with Inductor freezing (the strongest FP32 variant on a CPU);
- ``ao_dynamic``: ``torch.ao.quantization.quantize_dynamic`` on every ``nn.Linear`` (qint8 weights per tensor,
  activations quantized per call; fbgemm / x86 engine), eager;
- ``ao_dynamic_compile``: the same, then torch.compile (Inductor) around it;
- ``pt2e_x86_dynamic``: PT2E (``torch.export``, ``prepare_pt2e`` / ``convert_pt2e`` with Inductor's
  ``X86InductorQuantizer``, dynamic config) then torch.compile with freezing. PT2E left torch for torchao
  (torch 2.13 has no ``torch.ao.quantization.quantize_pt2e``): this candidate needs ``torchao`` importable and is
  reported as unavailable otherwise.

For each: median wall time per iteration (ms), speedup over fp32_eager, and numerics against FP32 eager on a
fixed batch of ``--sequences`` sequences (run one at a time, at the timed shape): max_rel, cosine, and the top-1
agreement of the logits (argmax over the vocabulary at every position). Prints the CPU model, its int8 flags
(avx512_vnni, avx_vnni, amx_int8) and the load average before and after.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import random
import statistics
import sys
import time
import warnings

import torch
from torch import nn

GOAL = {"kind": "gpt2", "compile": False, "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
        "n_positions": 1024, "batch_size": 1, "seq_len": 128}
QUICK = {"kind": "gpt2", "compile": False, "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512,
         "n_positions": 128, "batch_size": 1, "seq_len": 32}
CANDIDATES = ("fp32_eager", "compile_freezing", "ao_dynamic", "ao_dynamic_compile", "pt2e_x86_dynamic")


def _cpu() -> tuple[str, list[str]]:
    name, flags = "unknown CPU", []
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    return name, [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]


def build(name: str, model: nn.Module, example: tuple):
    """``name`` -> a callable (one forward under no_grad), or a string saying why it is unavailable."""
    model = copy.deepcopy(model).eval()
    if name == "fp32_eager":
        return model
    if name == "compile_freezing":
        compiled = torch.compile(model)
        with torch._inductor.config.patch(freezing=True), torch.no_grad():
            compiled(*example)
        return compiled
    if name in ("ao_dynamic", "ao_dynamic_compile"):
        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            quantized = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        return quantized if name == "ao_dynamic" else torch.compile(quantized)
    if name == "pt2e_x86_dynamic":
        try:
            import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        except ImportError as exc:
            return f"unavailable: torchao not importable ({exc}); torch {torch.__version__} has no PT2E"
        exported = torch.export.export(model, example).module()
        quantizer = xiq.X86InductorQuantizer()
        quantizer.set_global(xiq.get_default_x86_inductor_quantization_config(is_dynamic=True))
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            prepared(*example)
        converted = convert_pt2e(prepared)
        compiled = torch.compile(converted)
        with torch._inductor.config.patch(freezing=True), torch.no_grad():
            compiled(*example)
        return compiled
    raise ValueError(name)


def numerics(reference: list[torch.Tensor], outputs: list[torch.Tensor]) -> dict:
    ref = torch.cat([r.reshape(-1, r.shape[-1]) for r in reference]).double()
    out = torch.cat([o.reshape(-1, o.shape[-1]) for o in outputs]).double()
    max_rel = float((out - ref).abs().max() / ref.abs().max())
    cosine = float(torch.nn.functional.cosine_similarity(ref.reshape(1, -1), out.reshape(1, -1)))
    agree = float((ref.argmax(-1) == out.argmax(-1)).double().mean())
    return {"max_rel": max_rel, "cosine": cosine, "top1": agree, "positions": ref.shape[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from operator_profiler.capture.workloads import build_workload
    from operator_profiler.config import validate_config

    cpu, flags = _cpu()
    load_before = os.getloadavg()
    cfg = validate_config({"workloads": {"w": QUICK if args.quick else GOAL}}, "bench_int8")["workloads"]["w"]
    torch.manual_seed(0)
    model, example = build_workload(cfg, torch.device("cpu"))
    model.eval()
    generator = torch.Generator().manual_seed(1)
    batch = [torch.randint(0, cfg["vocab_size"], example[0].shape, generator=generator)
             for _ in range(args.sequences)]
    print(f"bench_int8: {cpu}; int8-relevant flags: {flags or 'none'}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, quantized engine {torch.backends.quantized.engine}; load average "
          f"before {load_before[0]:.2f}", flush=True)
    with torch.no_grad():
        reference = [model(x) for x in batch]
    runners, results = {}, {}
    for name in [c for c in args.candidates.split(",") if c]:
        started = time.perf_counter()
        runner = build(name, model, example)
        if isinstance(runner, str):
            results[name] = {"unavailable": runner}
            print(f"  {name}: {runner}", flush=True)
            continue
        with torch.no_grad():
            for _ in range(3):
                runner(*example)
            results[name] = numerics(reference, [runner(x) for x in batch])
        results[name]["build_s"] = time.perf_counter() - started
        runners[name] = runner
        print(f"  {name}: built and warmed up in {results[name]['build_s']:.1f} s; {results[name]}", flush=True)
    samples = {name: [] for name in runners}
    order = list(runners)
    rng = random.Random(0)
    with torch.no_grad():
        for _ in range(args.repetitions):
            rng.shuffle(order)
            for name in order:
                gc.collect()
                start = time.perf_counter()
                runners[name](*example)
                samples[name].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    base = statistics.median(samples["fp32_eager"]) if "fp32_eager" in samples else None
    print(f"\n{'candidate':<20} {'median ms':>10} {'speedup':>8} {'max_rel':>9} {'cosine':>9} {'top-1':>7}")
    for name, result in results.items():
        if "unavailable" in result:
            print(f"{name:<20} {result['unavailable']}")
            continue
        median = statistics.median(samples[name])
        speedup = base / median if base else float("nan")
        print(f"{name:<20} {median * 1e3:>10.2f} {speedup:>7.2f}x {result['max_rel']:>9.2e} {result['cosine']:>9.6f} "
              f"{result['top1'] * 100:>6.2f}%  ({result['positions']} positions)")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} CPUs); "
          f"{args.repetitions} interleaved repetitions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
