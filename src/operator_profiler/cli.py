"""``opprof``: every pipeline stage on files, outside Snakemake.

Each command imports the stage code it runs when it runs (``from . import stages`` and the like inside the
``_cmd_*`` functions): pandas, pyarrow, jsonschema and torch cost 1-2 s to import, which ``opprof --help``, an
argument error and the commands that need none of them should not pay. ``tests/test_import_graph.py`` checks
which heavy packages ``opprof --help`` imports.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .errors import USER_ERRORS
from .files import InputError

#: Appended to the error line when the user's own traceback was printed above it (capture.py looks for it).
USER_TRACEBACK_ABOVE = " (the traceback is above)"


def _cmd_validate_config(args) -> None:
    from .config import check_callables, load_config

    config = load_config(args.config)
    if not args.no_imports:
        check_callables(config, str(args.config))
    print(json.dumps(config, indent=1, sort_keys=True))


def _cmd_capture(args) -> None:
    from .capture import jobs as capture
    from .capture.harness import resolve_device
    from .config import load_config

    config = load_config(args.config)
    workloads = config["workloads"]
    if args.workload not in workloads:
        from .config import ConfigError

        raise ConfigError(f"workload {args.workload!r} is not defined in {args.config} (have: {sorted(workloads)})")
    from .capture.clocks import choose_target

    out = Path(args.out)
    device = resolve_device(config["device"])
    capture.capture_timeline(args.workload, workloads[args.workload], config["harness"],
                            device, "torch", out / "timeline.kineto.json.gz",
                            out / "run.json", out / "layers.json", out / "clocks_applied.json",
                            choose_target(config["clocks"], device))
    print(f"wrote {out}/timeline.kineto.json.gz, run.json, layers.json")


def _cmd_ceilings(args) -> None:
    """Measure the machine's ceilings on this process's device and write ceilings.json (what the measure_ceilings
    rule writes, without clock locking: ``clocks`` stays null)."""
    from .capture import ceilings
    from .files import write_json

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    settings = {"gemm_n": args.gemm_n, "stream_mib": args.stream_mib, "runs": args.runs, "warmup": args.warmup,
                "min_run_s": args.min_run_s, "trials": args.trials}
    _check_out_file(Path(args.out))  # before a measurement of a minute or more, not after it
    record = ceilings.measure(device, settings, threads=args.threads)
    write_json(Path(args.out), record)
    print("\n".join(ceilings.summary_lines(record, warnings=False)))  # the warnings went to stderr (logging)
    print(f"-> {args.out}")


def _check_out_file(out: Path) -> None:
    """``--out`` can be written: not a folder, its parent a folder (created when missing) we may write in.

    Raises:
        InputError: naming ``--out`` and what is wrong."""
    if out.is_dir():
        raise InputError(f"--out {out} is a folder; give a file path (e.g. {out / 'ceilings.json'})")
    parent = out.parent
    for above in (parent, *parent.parents):
        if above.exists():
            if not above.is_dir():
                raise InputError(f"--out {out}: {above} is a file, not a folder; choose another --out")
            break
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create {parent} ({exc.strerror or exc}); choose another --out") from None
    import tempfile

    try:  # (a folder of /proc passes os.access yet takes no file: try one)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".opprof-write-check-"):
            pass
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write in {parent} ({exc.strerror or exc}); choose another --out") from None


def _json_arg(text: str, what: str) -> dict:
    """``text`` is inline JSON (starts with ``{``) or the path of a JSON file."""
    from .files import read_json_file

    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{what}: not valid JSON ({exc}); pass a JSON object or the path of a JSON file") from None
        if not isinstance(value, dict):
            raise InputError(f"{what}: expected a JSON object")
        return value
    return read_json_file(Path(text), what, "pass a JSON object or the path of a JSON file", expect=dict)


def _cmd_run_harness(args) -> None:
    """The harness once, in this process: what ``nsys profile`` launches and what an ncu replay re-runs.

    argv contract (stable; ``capture.harness_argv`` builds it)::

        python -m operator_profiler.cli run-harness --workload-json W --harness-json H --device cuda
            --profiler {torch,cuda_profiler_api,none} --out-run RUN.json [--out-layers LAYERS.json]
            [--out-trace TRACE.json.gz] [--workload-name NAME] [--record-json R]

    ``W``: the workload's config slice, ``H``: the ``harness`` section (``seed``, ``warmup``,
    ``iterations``), ``R``: extra keys for run.json; each inline JSON (starting with ``{``) or a JSON file
    path. ``--profiler cuda_profiler_api`` brackets the measured iterations with cudaProfilerStart/Stop:
    use ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop`` or ``ncu
    --profile-from-start off`` around it to record exactly the measured window. ``--out-trace`` is
    required with ``--profiler torch``. Exit status 0 on success; 1 with one line ``opprof run-harness:
    error: ...`` on a user error (bad workload, no GPU, unreadable JSON).
    """
    from .capture import harness

    if args.profiler == "torch" and not args.out_trace:
        raise InputError("run-harness --profiler torch needs --out-trace TRACE.json.gz")
    workload = _json_arg(args.workload_json, "--workload-json")
    harness_cfg = _json_arg(args.harness_json, "--harness-json")
    record = _json_arg(args.record_json, "--record-json") if args.record_json else None
    run = harness.run_capture(workload, harness_cfg, args.device, args.out_trace, args.out_layers, args.out_run,
                              profiler=args.profiler, workload_name=args.workload_name, record=record)
    print(f"run-harness: {harness_cfg.get('iterations')} measured iteration(s) in {run['measured_s']} s "
          f"(profiler {args.profiler}) -> {args.out_run}")


def _cmd_timeline(args) -> None:
    from . import stages

    source = Path(args.kineto or args.nsys)
    if args.nsys and source.suffix.lower() in (".json", ".gz"):
        raise InputError(f"{source}: --nsys takes an nsys report (an 'nsys export --type sqlite' file or a .nsys-rep); "
                         "for a torch.profiler trace use --kineto")
    if args.kineto and source.suffix.lower() in stages.NSYS_SUFFIXES:
        raise InputError(f"{source}: --kineto takes a torch.profiler trace (.json or .json.gz); for an nsys report "
                         "use --nsys")
    timeline = stages.export_timeline(source, Path(args.out), kind="nsys" if args.nsys else "kineto",
                                      expect_gpu=args.expect_gpu)
    print(f"{len(timeline.kernels)} kernels, {len(timeline.launches)} launches, {len(timeline.ranges)} ranges -> {args.out}")


def _cmd_ncu(args) -> None:
    from . import stages

    table = stages.parse_ncu_files([Path(f) for f in args.files], Path(args.out))
    from .matching import KERNEL_COLUMNS

    metrics = [c for c in table.columns if c not in KERNEL_COLUMNS]
    print(f"{len(table)} kernels, {len(metrics)} metrics from {len(args.files)} file(s) -> {args.out}")


def _cmd_match(args) -> None:
    from . import stages

    from .files import read_json_file
    from .matching import parse_process_map, parse_window_specs

    json_windows = [w for w in args.window or [] if "=" not in w]
    if json_windows and len(args.window) > 1:
        raise InputError("--window: give either one JSON file or NAME=SKIP:COUNT / NAME=contiguous values, not both")
    try:
        window = (read_json_file(Path(json_windows[0]), "a window", "a JSON object: {\"kernel_ids\": [...]}, "
                                 "{\"launch_skip\": N, \"launch_count\": M} or {\"sources\": {NAME: window}}",
                                 expect=dict) if json_windows
                  else parse_window_specs(args.window) if args.window else None)
        process_map = parse_process_map(args.process_map or [])
    except ValueError as exc:
        raise InputError(str(exc)) from None
    out = Path(args.out)
    matched, diag = stages.match_files(Path(args.timeline), [Path(f) for f in args.ncu],
                                       out / "matched" / "kernel_metrics.parquet", out / "matched" / "diagnostics.json",
                                       window, Path(args.kernel_layers) if args.kernel_layers else None, process_map)
    counters = diag["counters"]
    refused = ", ".join(f"{n} {r}" for r, n in sorted(counters["refused_reasons"].items()))
    print(f"counters: {counters['with_counters']:,} of {counters['kernels']:,} kernels; {counters['refused']:,} refused"
          f"{f' ({refused})' if refused else ''}; {diag['ncu_only']:,} ncu rows without a kernel -> {out / 'matched'}")
    for hint in diag.get("hints", []):  # what the input cannot tell apart, and the fix: one line each
        print(f"opprof match: hint: {' '.join(str(hint).split())}", file=sys.stderr)


def _cmd_fusion_map(args) -> None:
    from . import stages

    fusion = stages.build_fusion_map(Path(args.inductor_dir), Path(args.out))
    print(f"{len(fusion)} call sites in {fusion['graph'].nunique() if len(fusion) else 0} graphs -> {args.out}")


def _cmd_classify(args) -> None:
    from . import stages

    out = Path(args.out)
    classes = stages.classify(Path(args.timeline), Path(args.layers), out / "instances.parquet",
                              out / "kernel_layers.parquet", out / "classes.json", out / "classes", args.verify,
                              fusion_map=Path(args.fusion_map) if args.fusion_map else None,
                              kineto_timeline=Path(args.kineto_timeline) if args.kineto_timeline else None)
    for name, entry in classes.items():
        print(f"{name}: {len(entry['instances'])} instance(s), {entry['kernel_count']} kernels each")


def _cmd_attribute(args) -> None:
    from . import stages
    from .attribution.nvtx import DEFAULT_OPERATOR_DOMAINS, NvtxOptions

    fusion = Path(args.fusion_map) if args.fusion_map else None
    if args.inductor_dir:
        fusion = stages.load_fusion_map_checked(Path(args.inductor_dir))
    options = NvtxOptions(tuple(args.nvtx_operator_domain or DEFAULT_OPERATOR_DOMAINS), tuple(args.nvtx_ignore_range or ()))
    result = stages.attribute_files(Path(args.timeline), Path(args.kernel_layers) if args.kernel_layers else None,
                                    fusion, Path(args.out), options,
                                    Path(args.kineto_timeline) if args.kineto_timeline else None,
                                    [Path(r) for r in args.run or ()])
    attributed = (result["path"] != "unattributed").sum()
    by_path = ", ".join(f"{p} {n}" for p, n in result["path"].value_counts().sort_index().items())
    print(f"{attributed} of {len(result)} kernels attributed" + (f" ({by_path})" if by_path else "") + f" -> {args.out}")


def _cmd_aggregate(args) -> None:
    from . import stages

    out = Path(args.out)
    stages.aggregate_files(Path(args.attribution), Path(args.instances), Path(args.classes),
                           {"per_iteration": not args.totals, "device": args.device}, out / "operators.parquet", out / "operators.csv",
                           out / "modules.parquet", out / "layer_classes.parquet", out / "coverage.json",
                           counters_path=Path(args.counters) if args.counters else None,
                           matching_path=Path(args.matching) if args.matching else None,
                           out_phases=out / "phases.parquet")
    print(f"wrote operators.csv, phases.parquet, modules.parquet, layer_classes.parquet, coverage.json in {out}")


def _cmd_report(args) -> None:
    from . import stages
    from .results import ReportPaths

    d = Path(args.results)
    # the capture writes clocks_applied.json beside run.json
    clocks = Path(args.run).parent / "clocks_applied.json" if args.run else Path("/nonexistent")
    paths = ReportPaths(d / "coverage.json", d / "operators.parquet", d / "modules.parquet",
                        d / "layer_classes.parquet", run=Path(args.run) if args.run else None,
                        diagnostics=Path(args.timeline) / "diagnostics.json" if args.timeline else None,
                        matching=Path(args.matching) if args.matching else None,
                        clocks=clocks if clocks.is_file() else None,
                        phases=d / "phases.parquet" if (d / "phases.parquet").is_file() else None,
                        advice=d / "advice.json" if (d / "advice.json").is_file() else None)
    stages.report_files(args.workload or d.name, paths, {"top_operators": args.top}, Path(args.out))
    print(f"wrote {args.out}")


def _cmd_report_html(args) -> None:
    from . import stages
    from .report.html import html_output
    from .results import ReportPaths

    folder = Path(args.results)
    out = html_output(args.out, results=folder)  # the text typed: '' and '.' are different mistakes
    paths = ReportPaths.of_folder(folder)
    if args.timeline:  # a trace captured elsewhere: its timeline folder is not inside the results folder
        paths.diagnostics = Path(args.timeline) / "diagnostics.json"
    stages.report_html_files(args.workload or folder.resolve().name, paths, {"top_operators": args.top}, out)
    print(f"wrote {args.out}")


def _cmd_compare(args) -> None:
    from . import stages
    from .report import html as report_html
    from .report.markdown import operators_phrase

    out = report_html.html_output(args.out, "compare.html")  # the text typed: '' and '.' are different mistakes
    table = stages.compare_files(Path(args.results_a), Path(args.results_b), out, force=args.force, top=args.top)
    change = report_html.operator_changes(table)  # the (unattributed) row is not an operator
    both = sum(change.get(c, 0) for c in ("slower", "faster", "same"))
    totals = report_html.compare_totals(table)  # the page's headline: the sums of the table's columns
    percent = "" if totals["change"] is None else f" ({totals['change'] * 100:+.1f}%)"
    print(f"{operators_phrase(sum(change.values()))} ({both} in both, {change.get('only A', 0)} "
          f"only in A, {change.get('only B', 0)} only in B); by per-iteration {table.attrs['basis']}s: "
          f"{change.get('slower', 0)} slower, {change.get('faster', 0)} faster, {change.get('same', 0)} the same "
          f"within noise ({report_html.change_rule(table.attrs['ranges'], short=True)}); kernel time / iteration "
          f"(sum of the operators' {table.attrs['basis']}s): A {totals['a_ms']:.3f} ms, B {totals['b_ms']:.3f} ms"
          f"{percent} -> {args.out}")


def _cmd_advise(args) -> None:
    from . import stages

    folder = Path(args.results)
    if args.shapes and not Path(args.shapes).is_file():
        raise InputError(f"--shapes {args.shapes}: no such file; pass the capture's shapes iteration "
                         "(capture/shapes.kineto.json.gz) or leave --shapes out")
    shapes = Path(args.shapes) if args.shapes else folder / "capture" / "shapes.kineto.json.gz"
    advice = stages.advise_files(folder, Path(args.out), Path(args.catalog) if args.catalog else None,
                                 shapes if shapes.is_file() else None, args.workload)
    for record in advice["advice"]:
        print(f"advise {record['change']} (rule {record['rule']}): {record['evidence']}")
    for record in advice["not_offered"]:
        print(f"not offered {record['change']} (rule {record['rule']}): {record['reason']}")
    for text in advice["diagnoses"]:
        print(f"diagnosis: {text}")
    print(f"advised variant: {' + '.join(advice['advised_changes']) or 'no change'} -> {args.out}")


def _cmd_optimize(args) -> None:
    from . import stages
    from .config import ConfigError, load_config, threads_problem, validate_config

    if not args.results.strip():
        raise InputError("--results is empty; pass results/<workload>/ of a finished profile")
    if args.catalog and not Path(args.catalog).is_file():
        raise InputError(f"--catalog {args.catalog}: no such file; pass a rule catalog YAML or leave --catalog out")
    if args.threads is not None and threads_problem(args.threads):
        raise ConfigError(f"--threads: {threads_problem(args.threads)}")
    config = load_config(Path(args.config)) if args.config else validate_config({}, "the defaults")

    def progress(line: str) -> None:
        print(line, flush=True)

    record = stages.optimize_folder(Path(args.results), config, Path(args.catalog) if args.catalog else None,
                                    args.threads, progress)
    recommended = record["ablation"]["recommended"]
    speedup = recommended.get("speedup") or {}
    from .figures import apart

    figure = (f" ({apart(speedup['value'], digits=2)}x over FP32 eager, 95% CI {apart(speedup['ci'][0], digits=2)}-"
              f"{apart(speedup['ci'][1], digits=2)})" if speedup.get("value") is not None and speedup.get("ci") else "")
    print(f"recommended: {' + '.join(recommended.get('changes') or []) or 'no change'}{figure}")
    for index, line in enumerate(recommended.get("trail") or [], 1):
        print(f"  {index}. {line}")
    scaling = record.get("thread_scaling") or {}
    print(f"threads: {scaling.get('threads')} ({record.get('threads_source')}): {scaling.get('text')}")
    for warning in record.get("warnings") or []:
        print(f"warning: {warning}")
    print(f"optimize page: {Path(args.results) / 'optimize' / 'report.html'}")


def _cmd_trace(args) -> None:
    from . import stages

    trace = stages.trace_files(Path(args.timeline), Path(args.attribution), Path(args.out),
                               Path(args.counters) if args.counters else None)
    other = trace["otherData"]
    print(f"{other['kernels']} kernels, {len(trace['traceEvents'])} events -> {args.out} (open it in "
          "https://ui.perfetto.dev)")


def _positive_int(text: str) -> int:
    """``--top N``: argparse words the error ``argument --top: must be a positive integer, got 'abc'``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opprof", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("validate-config", help="validate a config file and print it with defaults")
    s.add_argument("config", type=Path, help="the workflow config (YAML), e.g. config/config.yaml")
    s.add_argument("--no-imports", action="store_true",
                   help="do not import anything: skip the checks of the custom workloads' factory and loss_fn "
                        "modules (by default each is imported, its function looked up, not called; the module must "
                        "be on PYTHONPATH) and of compile_options (names and value types, checked with torch)")
    s.set_defaults(func=_cmd_validate_config)

    s = sub.add_parser("capture", help="run one workload of a config under torch.profiler")
    s.add_argument("--config", type=Path, default=Path("config/config.yaml"),
                   help="the workflow config (default: config/config.yaml)")
    s.add_argument("--workload", required=True, help="the workload's name in the config's workloads")
    s.add_argument("--out", required=True, help="folder for timeline.kineto.json.gz, run.json and layers.json")
    s.set_defaults(func=_cmd_capture)

    s = sub.add_parser("run-harness", help="run a workload's harness once (what nsys launches; ncu replays)",
                       description=_cmd_run_harness.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--workload-json", required=True, help="the workload's config slice: inline JSON or a file")
    s.add_argument("--harness-json", required=True, help="the harness section (seed, warmup, iterations)")
    s.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to run (auto: cuda when torch sees a GPU, else cpu)")
    s.add_argument("--profiler", default="cuda_profiler_api", choices=("torch", "cuda_profiler_api", "none"),
                   help="torch: torch.profiler trace (--out-trace); cuda_profiler_api: measured iterations between "
                        "cudaProfilerStart/Stop, for nsys/ncu around the process; none: no profiler")
    s.add_argument("--out-run", required=True, help="run.json to write")
    s.add_argument("--out-layers", help="layers.json to write (left out: not written)")
    s.add_argument("--out-trace", help="gzipped Chrome trace (--profiler torch)")
    s.add_argument("--workload-name", help="the workload's name in the config (error messages)")
    s.add_argument("--record-json", help="extra keys for run.json: inline JSON or a file")
    s.set_defaults(func=_cmd_run_harness)

    s = sub.add_parser("ceilings", help="measure the machine's ceilings: GEMM peak per dtype, STREAM bandwidth",
                       description="Timed microbenchmarks on this machine's device: square torch.mm per dtype "
                                   "(float32, bfloat16; on CUDA also tf32 and float16) and STREAM copy/triad, each the "
                                   "best of several runs, the whole set measured in several trials (each figure its "
                                   "best trial's), written to a ceilings.json (the workflow's measure_ceilings writes "
                                   "results/ceilings/<device>.json). Takes ~30-60 s on a small CPU (3 trials).")
    s.add_argument("--out", "-o", required=True, help="ceilings.json to write")
    s.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to measure (auto: cuda when torch sees a GPU, else cpu)")
    s.add_argument("--threads", type=_positive_int,
                   help="torch's CPU threads for the measurement (default: torch's, e.g. from OMP_NUM_THREADS); the "
                        "workflow's captures use 1 unless set-threads gives them more")
    s.add_argument("--gemm-n", type=_positive_int, help="size n of the square GEMMs (default: CPU 2048, CUDA 8192)")
    s.add_argument("--stream-mib", type=_positive_float,
                   help="MiB per STREAM array (default: 4 x the CPU's last-level cache, CUDA 8 x L2)")
    s.add_argument("--runs", type=_positive_int, help="timed runs per ceiling (default 5)")
    s.add_argument("--warmup", type=_positive_int, help="untimed calls before the runs (default 2)")
    s.add_argument("--min-run-s", type=_non_negative_float, help="shortest timed run, seconds (default 0.05)")
    s.add_argument("--trials", type=_positive_int,
                   help="times the whole set is measured; each ceiling is its best trial's (default 3)")
    s.set_defaults(func=_cmd_ceilings)

    s = sub.add_parser("timeline", help="trace -> kernels/launches/ranges parquet tables")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--kineto", help="torch.profiler Chrome trace (.json or .json.gz)")
    src.add_argument("--nsys", help="Nsight Systems export (.sqlite or .nsys-rep)")
    s.add_argument("--out", required=True, help="folder for kernels/launches/ranges/gpu_activities.parquet and "
                                                "diagnostics.json")
    s.add_argument("--expect-gpu", action="store_true",
                   help="fail when a torch.profiler trace has no GPU kernel record (a CUDA run profiled "
                        "without ProfilerActivity.CUDA) instead of reading it as a CPU trace")
    s.set_defaults(func=_cmd_timeline)

    s = sub.add_parser("ncu", help="Nsight Compute CSVs (ncu --csv, details or raw page) -> per-kernel counters parquet")
    s.add_argument("files", nargs="+", help="ncu --csv output files")
    s.add_argument("--out", required=True, help="the counters parquet to write (one row per profiled kernel)")
    s.set_defaults(func=_cmd_ncu)

    s = sub.add_parser("match", help="ncu counters <-> timeline kernels by invocation order (scoped alignment)")
    s.add_argument("--timeline", required=True, help="timeline directory (kernels.parquet)")
    s.add_argument("--ncu", required=True, action="append", help="ncu parquet from 'opprof ncu' (repeatable)")
    s.add_argument("--out", required=True, help="writes OUT/matched/kernel_metrics.parquet and diagnostics.json")
    s.add_argument("--window", action="append",
                   help="the launches an ncu file covers (repeatable): NAME=SKIP:COUNT (its --launch-skip and "
                        "--launch-count), NAME=SKIP:COUNT:KERNEL (with -k KERNEL), NAME=contiguous (consecutive "
                        "launches, start unknown); NAME is the CSV's path, file name or stem. Or one JSON file")
    s.add_argument("--process-map", action="append", metavar="NCU_PID=TIMELINE_PID",
                   help="pair an ncu process with a timeline process (repeatable), when they cannot be told apart")
    s.add_argument("--kernel-layers", help="kernel_layers.parquet from 'opprof classify': broadcast each layer "
                                           "class's measured counters to its other instances")
    s.set_defaults(func=_cmd_match)

    s = sub.add_parser("fusion-map", help="Inductor debug directory -> fusion map parquet")
    s.add_argument("--inductor-dir", required=True,
                   help="the folder torch.compile wrote with TORCH_COMPILE_DEBUG=1 (or its torchinductor/)")
    s.add_argument("--out", required=True, help="fusion_map.parquet to write")
    s.set_defaults(func=_cmd_fusion_map)

    s = sub.add_parser("classify", help="layer instances and classes from a timeline")
    s.add_argument("--timeline", required=True, help="timeline directory from 'opprof timeline'")
    s.add_argument("--layers", required=True, help="layers.json written by the capture")
    s.add_argument("--verify", action="store_true", help="name two instances per class for ncu to replay "
                                                         "(their counters are compared: dedup.verify)")
    s.add_argument("--fusion-map", help="fusion_map.parquet of a compiled workload: kernels no layer range claims "
                                        "(whole-model compile) take the layer of their FX nodes")
    s.add_argument("--kineto-timeline", help="with an nsys --timeline and --fusion-map: the timeline folder of a "
                                             "torch.profiler run of the same program, whose kernels are placed on "
                                             "their call sites (else only generated kernels are, by name)")
    s.add_argument("--out", required=True, help="folder for instances.parquet, kernel_layers.parquet, classes.json "
                                                "and classes/")
    s.set_defaults(func=_cmd_classify)

    s = sub.add_parser("attribute", help="one attribution record per kernel")
    s.add_argument("--timeline", required=True, help="timeline directory from 'opprof timeline'")
    s.add_argument("--out", required=True, help="attribution parquet to write (e.g. attribution/kernels.parquet)")
    s.add_argument("--kernel-layers", help="kernel_layers.parquet from 'opprof classify'")
    fusion_source = s.add_mutually_exclusive_group()
    fusion_source.add_argument("--fusion-map", help="fusion_map.parquet from 'opprof fusion-map'")
    fusion_source.add_argument("--inductor-dir", help="Inductor debug directory (its fusion map is built in memory)")
    s.add_argument("--nvtx-operator-domain", action="append", metavar="DOMAIN",
                   help="nsys timelines: NVTX domain whose push/pop ranges name operators (repeatable; "
                        "default: 'default', the unnamed domain where torch emit_nvtx writes)")
    s.add_argument("--nvtx-ignore-range", action="append", metavar="REGEX",
                   help="nsys timelines: range names never used as the operator (repeatable)")
    s.add_argument("--kineto-timeline", metavar="DIR",
                   help="nsys timelines: timeline folder of a torch.profiler run of the same program "
                        "('opprof timeline --kineto'); its kernels are paired by invocation order and "
                        "lend paths (a) correlation and (c) fusion map")
    s.add_argument("--run", action="append", metavar="RUN_JSON",
                   help="run.json of a capture of this workload, this timeline's first (repeatable): the kernel "
                        "counts of the measured window must agree, else attribute fails")
    s.set_defaults(func=_cmd_attribute)

    s = sub.add_parser("aggregate", help="operators, modules, layer classes, coverage")
    s.add_argument("--attribution", required=True, help="attribution parquet from 'opprof attribute'")
    s.add_argument("--instances", required=True, help="instances.parquet from 'opprof classify'")
    s.add_argument("--classes", required=True, help="classes.json from 'opprof classify'")
    s.add_argument("--totals", action="store_true", help="do not divide by the number of iterations")
    s.add_argument("--device", choices=("cpu", "cuda"), help="where the trace ran (words the note on counters)")
    s.add_argument("--counters", help="matched/kernel_metrics.parquet from 'opprof match': adds the catalog's "
                                      "hardware metrics and a bottleneck label per operator and module")
    s.add_argument("--matching", help="matched/diagnostics.json from 'opprof match': coverage.json counts the kernels "
                                      "whose counters were refused, per reason and kernel")
    s.add_argument("--out", required=True, help="folder for operators.{parquet,csv}, phases.parquet, "
                                                "modules.parquet, layer_classes.parquet and coverage.json")
    s.set_defaults(func=_cmd_aggregate)

    s = sub.add_parser("report", help="Markdown report from aggregated results")
    s.add_argument("--results", required=True, help="folder with operators.parquet, coverage.json ...")
    s.add_argument("--run", help="the capture's run.json (leave out for a trace captured elsewhere)")
    s.add_argument("--timeline", help="the timeline folder (nsys or Kineto): its diagnostics.json goes in the report")
    s.add_argument("--matching", help="matched/diagnostics.json of 'opprof match': counters per layer class and "
                                      "the dedup.verify check")
    s.add_argument("--workload", help="the report's title (default: the results folder's name)")
    s.add_argument("--top", type=_positive_int, default=20, help="operators listed (default 20)")
    s.add_argument("--out", required=True, help="report.md to write")
    s.set_defaults(func=_cmd_report)

    s = sub.add_parser("report-html", help="self-contained HTML report of a results folder (plots, sortable tables)")
    s.add_argument("--results", required=True, help="results/<workload>/ of a finished run (or the --out of "
                                                     "opprof aggregate); capture/, timeline/, ncu/, matched/ "
                                                     "files in it are used when present")
    s.add_argument("--timeline", help="the timeline folder (nsys or Kineto) of a trace captured elsewhere: its "
                                      "diagnostics.json (source, GPU name, memcpy/memset, reader warnings) goes in "
                                      "the page, as with 'opprof report' (default: timeline/ in the results folder)")
    s.add_argument("--workload", help="the page's title (default: the folder's name)")
    s.add_argument("--top", type=_positive_int, default=20, help="operators and modules drawn before 'other'")
    s.add_argument("--out", "-o", required=True, help="report.html to write (an .html file in an existing folder)")
    s.set_defaults(func=_cmd_report_html)

    s = sub.add_parser("compare", help="HTML page comparing two profiles of one workload (before/after a change)",
                       description="Per-operator time per iteration of RESULTS_B against RESULTS_A (delta B - A, "
                                   "ratio B/A, counter deltas): the per-iteration medians when both have them "
                                   "(aggregate.per_iteration, the default), else the means; a change within the noise "
                                   "tolerance the page states is 'same'. Two different workloads (model kind/factory of "
                                   "their capture/run.json) are refused unless --force.")
    s.add_argument("results_a", metavar="RESULTS_A", help="results/<workload>/ of the first (before) run")
    s.add_argument("results_b", metavar="RESULTS_B", help="results/<workload>/ of the second (after) run")
    s.add_argument("--out", "-o", required=True, help="compare.html to write")
    s.add_argument("--force", action="store_true", help="compare profiles of different workloads anyway")
    s.add_argument("--top", type=_positive_int, default=20, help="largest changes drawn in the plot")
    s.set_defaults(func=_cmd_compare)

    s = sub.add_parser("advise", help="advice from a profile: the rule catalog's changes, each with its evidence",
                       description="Reads a results folder (operators.parquet, attribution/kernels.parquet, "
                                   "capture/run.json, coverage.json) and writes advice.json: the changes the rule "
                                   "catalog offers for this profile, the evidence each quotes, the rules whose "
                                   "preconditions fail on this machine and why, and the advised variant.")
    s.add_argument("--results", required=True, help="results/<workload>/ of a finished run")
    s.add_argument("--catalog", help="a rule catalog YAML (default: the package's optimize/catalog.yaml)")
    s.add_argument("--shapes", help="the capture's shapes iteration (default: capture/shapes.kineto.json.gz in "
                                    "the results folder, when present)")
    s.add_argument("--workload", help="the workload's name (default: the folder's name)")
    s.add_argument("--out", "-o", required=True, help="advice.json to write")
    s.set_defaults(func=_cmd_advise)

    s = sub.add_parser("optimize", help="advise -> profile the advised variant -> verify, for one finished profile",
                       description="For a finished profile (results/<workload>/ of a workflow run), what the "
                                   "workflow does for a workload under optimize.workloads, outside Snakemake: "
                                   "advice.json, the advised variant profiled into results/<workload>+<changes>/ "
                                   "(capture and compile each in a process of its own, as the workflow's jobs, at "
                                   "the base profile's recorded threads; kept only when its capture/run.json is "
                                   "this variant's, else profiled again), its verification (numerics, interleaved wall "
                                   "time, ablation) in optimize/verification.json, and optimize/report.html with "
                                   "the recommendation's decision trail. Prints the recommendation, its trail and "
                                   "how the model scales with threads.")
    s.add_argument("--results", required=True, help="results/<workload>/ of a finished profile")
    s.add_argument("--config", help="the config the profile was made with, for its optimize, dedup, nvtx, aggregate "
                                    "sections and harness.threads (default: the defaults)")
    s.add_argument("--catalog", help="a rule catalog YAML (default: the config's optimize.catalog, else the "
                                     "package's optimize/catalog.yaml)")
    s.add_argument("--threads", type=_positive_int, help="torch threads for the verification (default: the config's "
                                                         "harness.threads, else the profile's, else every usable "
                                                         "CPU); the variant's capture keeps the base profile's")
    s.set_defaults(func=_cmd_optimize)

    s = sub.add_parser("trace", help="Chrome/Perfetto trace.json: kernels with their operator, module and counters")
    s.add_argument("--timeline", required=True, help="timeline directory (kernels, ranges, launches parquet)")
    s.add_argument("--attribution", required=True, help="attribution/kernels.parquet from 'opprof attribute'")
    s.add_argument("--counters", help="matched/kernel_metrics.parquet from 'opprof match'")
    s.add_argument("--out", required=True, help="trace.json to write")
    s.set_defaults(func=_cmd_trace)
    return p


#: The files commands read out of an input folder (a timeline folder's tables, a results folder's tables and
#: JSON, at any depth: results/<workload>/timeline/kernels.parquet).
_READ_FROM_FOLDERS = frozenset({
    "kernels.parquet", "ranges.parquet", "launches.parquet", "gpu_activities.parquet", "diagnostics.json",
    "nvtx_gpu_projection.parquet", "operators.parquet", "operators.csv", "modules.parquet", "layer_classes.parquet",
    "coverage.json", "clocks_applied.json", "run.json", "layers.json", "pairing.json", "kernel_metrics.parquet",
    "kernel_layers.parquet", "instances.parquet", "classes.json"})


def _refuse_output_over_input(args) -> None:
    """Every subcommand: an output path (``--out``, ``-o``, ``--out-*``) that is one of the command's inputs (file
    or folder), or one of the tables/JSON files commands read out of folders (``_READ_FROM_FOLDERS``) inside an
    input folder (``attribute --timeline tl --out tl/kernels.parquet``), would destroy what it reads: a one-line error before anything is read or written. Inputs are the other path
    arguments that exist on disk.

    Raises:
        InputError: naming the option, the path and the input it would overwrite.
    """
    values = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    outputs = {k: v for k, v in values.items() if (k == "out" or k.startswith("out_")) and isinstance(v, str)}
    inputs = []
    for key, value in values.items():
        if key in outputs:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item and Path(item).exists():
                inputs.append((key, Path(item).resolve()))
    for key, out in outputs.items():
        if not out or Path(out).is_dir():
            continue  # an output folder (or none): the command writes its own files into it, or says it is a folder
        target = Path(out).resolve()
        option = "--" + key.replace("_", "-")
        for in_key, source in inputs:
            inside = source.is_dir() and target.name in _READ_FROM_FOLDERS and source in target.parents
            if target == source or inside:
                what = "is" if target == source else "lies inside"
                raise InputError(f"{option} {out} {what} the input --{in_key.replace('_', '-')} {source}: it would "
                                 "be overwritten while it is read; choose another output path")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Stage findings (warnings, notes) go to stderr once, without logger names or timestamps.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    package_log = logging.getLogger("operator_profiler")
    package_log.handlers[:] = [handler]
    package_log.setLevel(logging.INFO)
    package_log.propagate = False
    # Progress lines (counts, seconds) are for the rules' logs; on the terminal an error stays one line.
    logging.getLogger("operator_profiler.progress").setLevel(logging.WARNING)
    try:
        _refuse_output_over_input(args)
        args.func(args)
    except USER_ERRORS as exc:
        user_traceback = getattr(exc, "traceback_text", None)  # the user's model raised: its frames help
        if user_traceback:
            print(user_traceback.rstrip(), file=sys.stderr)
        print(f"opprof {args.command}: error: {exc}{USER_TRACEBACK_ABOVE if user_traceback else ''}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (the command removed what it had written)
        print(f"opprof {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # an output folder that is a file, not writable, full ...
        where = f": {exc.filename}" if exc.filename else ""
        print(f"opprof {args.command}: error: {exc.strerror or exc}{where}; choose another --out (a writable folder "
              "or file path as the command expects)", file=sys.stderr)
        return 1
    finally:
        # Called in-process (tests, a notebook): leave the package's logging as it was found, so later
        # logging does not go to this call's stderr, which may be closed by then.
        package_log.handlers[:] = [h for h in package_log.handlers if h is not handler]
        package_log.propagate = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
