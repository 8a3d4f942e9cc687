"""The Hugging Face transformers goals, measured on a finished run of config/transformers.yaml (or any config with
``kind: transformers`` workloads): per workload

- ``coverage_time``: the attributed share of kernel time (coverage.json);
- ``work_known_share``: the share of kernel time whose analytic work is known (coverage.json ``work``);
- ``flops``: the profile's FLOPs per iteration by PyTorch's formulas against ``torch.utils.flop_counter.
  FlopCounterMode`` run here, independently, on the same model and inputs (built again from the config with the
  harness's seed; forward under no_grad in inference, forward + loss + backward in train mode; CPU flash attention
  mapped to the registry's SDPA formula, as the work stage does); a variant of the optimize workflow
  (``<workload>+<changes>``: compiled, frozen...) against the eager model it was made from;
- ``layer_classes``: per group of identical layers (layers.json ``found_by``), its instances and the layer classes
  they formed (``N/1``: N instances, one class);
- ``unattributed_share``: the time share of ``(unattributed)`` in operators.csv;
- ``optimize``: where results/<w>/optimize/verification.json exists, the advised variant, its numerics and its
  speedup over FP32 eager with the 95 % interval.

    python benchmarks/bench_transformers.py [--workdir .] [--config config/transformers.yaml]
        [--workloads hf_gpt2,hf_resnet] [--out bench_transformers.json] [--run --cores 2]

``--run`` runs ``snakemake --cores N --configfile CONFIG`` in ``--workdir`` first. Prints one line per workload
and writes the JSON. Exit 1 when a goal is missed (coverage < 0.99, work known < 0.99, FLOPs off by more than 2 %,
a group of identical layers split into several classes in an eager profile, unattributed >= 0.5 %), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

GOALS = {"coverage_time": 0.99, "work_known_share": 0.99, "flops_rel_error": 0.02, "unattributed_share": 0.005}
ROOT = Path(__file__).resolve().parents[1]


def flop_counter_total(workload: dict, seed: int) -> int:
    """FlopCounterMode's FLOPs of one iteration of ``workload`` (module docstring), on the CPU."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from operator_profiler.capture.training import default_loss
    from operator_profiler.capture.workloads import build_workload
    from operator_profiler.work.op_calls import EXTRA_FORMULAS

    torch.manual_seed(seed)
    # the workload's model as built, without its changes: compiling, freezing, folding BatchNorm, rewriting
    # attention into SDPA or autocasting change how the FLOPs run, not how many the model computes
    model, inputs = build_workload({k: v for k, v in workload.items() if k != "changes"}, torch.device("cpu"))
    train = workload.get("mode", "inference") == "train"
    model.train(train)
    mapping = {getattr(torch.ops.aten, k.split("::")[1]): f() for k, f in EXTRA_FORMULAS.items()}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        if train:
            default_loss(model(*inputs)).backward()
        else:
            with torch.no_grad():
                model(*inputs)
    return int(counter.get_total_flops())


def layer_groups(folder: Path) -> list[dict]:
    """Per group of identical layers (layers.json ``found_by``): instances, the classes they fell in."""
    layers = json.loads((folder / "capture" / "layers.json").read_text())
    classes = json.loads((folder / "layers" / "classes.json").read_text())
    class_of = {i: name for name, c in classes.items() if name != "rest" for i in c["instances"]}
    groups: dict[str, list[str]] = defaultdict(list)
    for layer in layers:
        groups[layer.get("found_by") or layer["class"]].append(layer["path"])
    out = []
    for found_by, paths in groups.items():
        formed = sorted({class_of.get(p, "rest") for p in paths})
        out.append({"found_by": found_by, "instances": len(paths), "classes": len(formed), "class_names": formed,
                    "n_over_classes": f"{len(paths)}/{len(formed)}"})
    return out


def measure(folder: Path, workload: dict, seed: int) -> dict:
    """The goals' figures of one finished workload folder (module docstring)."""
    import pandas as pd

    coverage = json.loads((folder / "coverage.json").read_text())
    run = json.loads((folder / "capture" / "run.json").read_text())
    work = coverage["work"]
    operators = pd.read_csv(folder / "operators.csv")
    unattributed = float(operators.loc[operators["operator"] == "(unattributed)", "time_share"].sum())
    expected = flop_counter_total(workload, seed)
    measured = float(work["flops_by_pytorch_formulas_per_iteration"])
    record = {
        "compiled": run["compiled"], "compile_scope": run.get("compile_scope"), "mode": run["mode"],
        "measured_s": run["measured_s"], "iterations": len(coverage["iteration_time_ns"]),
        "kernel_time_per_iteration_ms": coverage["kernel_time_ns"] / max(1, len(coverage["iteration_time_ns"])) / 1e6,
        "coverage_time": coverage["coverage_time"], "work_known_share": work["known_time_share"],
        "flops_per_iteration": measured, "flop_counter_mode": expected,
        "flops_rel_error": abs(measured - expected) / expected if expected else None,
        "layer_classes": layer_groups(folder), "unattributed_share": unattributed,
    }
    verification = folder / "optimize" / "verification.json"
    if verification.exists():
        record["optimize"] = summarize_verification(json.loads(verification.read_text()))
    record["missed"] = missed(record)
    return record


def summarize_verification(v: dict) -> dict:
    """The advised variant's figures from verification.json (speedup over FP32 eager, its interval, numerics)."""
    keep = ("advised_changes", "advised", "verdict", "speedup", "speedup_interval", "numerics", "variants")
    return {k: v[k] for k in keep if k in v} or v


def missed(record: dict) -> list[str]:
    """The goals ``record`` misses, in words."""
    out = []
    if record["coverage_time"] < GOALS["coverage_time"]:
        out.append(f"coverage_time {record['coverage_time']:.4f} < {GOALS['coverage_time']}")
    if record["work_known_share"] < GOALS["work_known_share"]:
        out.append(f"work known for {record['work_known_share']:.4f} < {GOALS['work_known_share']}")
    if record["flops_rel_error"] is None or record["flops_rel_error"] > GOALS["flops_rel_error"]:
        out.append(f"FLOPs {record['flops_per_iteration']:.4g} vs FlopCounterMode {record['flop_counter_mode']:.4g}")
    if not record["compiled"]:
        split = [g["found_by"] for g in record["layer_classes"] if g["classes"] != 1]
        if split:
            out.append(f"identical layers split into several classes: {split}")
    if record["unattributed_share"] >= GOALS["unattributed_share"]:
        out.append(f"(unattributed) {record['unattributed_share']:.4f} of time")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=".", type=Path)
    parser.add_argument("--config", default=str(ROOT / "config" / "transformers.yaml"))
    parser.add_argument("--workloads", default=None, help="comma-separated; default: every kind transformers")
    parser.add_argument("--out", default="bench_transformers.json", type=Path)
    parser.add_argument("--run", action="store_true", help="run the workflow first")
    parser.add_argument("--cores", default=2, type=int)
    args = parser.parse_args(argv)
    import yaml

    from operator_profiler.config import ConfigError, validate_config

    try:
        raw = {}
        default = ROOT / "config" / "config.yaml"
        for path in ([default] if Path(args.config).resolve() != default.resolve() else []) + [Path(args.config)]:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            raw = {**raw, **{k: ({**raw.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in loaded.items()}}
        config = validate_config(raw, args.config)
    except (OSError, ConfigError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from operator_profiler.transforms.variants import split_name, variant_workload

    names = args.workloads.split(",") if args.workloads else [
        n for n, w in config["workloads"].items() if w["kind"] == "transformers"]
    if not args.workloads:  # the variants the optimize workflow profiled (results/<workload>+<changes>/)
        names += sorted(p.name for p in (args.workdir / "results").glob("*+*") if split_name(p.name)[0] in names)
    workload_of = {n: variant_workload(config["workloads"][split_name(n)[0]], split_name(n)[1])
                   for n in names if split_name(n)[0] in config["workloads"]}
    unknown = [n for n in names if n not in workload_of]
    if unknown:
        print(f"error: --workloads {unknown} are not workloads of {args.config}", file=sys.stderr)
        return 2
    if args.run:
        done = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d",
                               str(args.workdir), "--configfile", str(args.config), "--cores", str(args.cores)])
        if done.returncode:
            print(f"error: the workflow failed (exit {done.returncode})", file=sys.stderr)
            return 1
    results, failed = {}, False
    for name in names:
        folder = args.workdir / "results" / name
        if not (folder / "coverage.json").exists():
            print(f"{name}: no finished results in {folder} (run the workflow, or --run)")
            failed = True
            continue
        record = measure(folder, workload_of[name], config["harness"]["seed"])
        results[name] = record
        classes = ", ".join(g["n_over_classes"] for g in record["layer_classes"]) or "no layers"
        print(f"{name}: coverage {record['coverage_time']:.4f}, work known {record['work_known_share']:.4f}, "
              f"FLOPs/iteration {record['flops_per_iteration']:.4g} vs FlopCounterMode {record['flop_counter_mode']:.4g} "
              f"({record['flops_rel_error']:.2%}), layer classes {classes}, unattributed "
              f"{record['unattributed_share']:.2%}" + (f"; MISSED: {'; '.join(record['missed'])}" if record['missed']
                                                         else ""))
        failed |= bool(record["missed"])
    args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
