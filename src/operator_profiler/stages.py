"""File-level stage runners: read a stage's input files, call the library, write its outputs.

The Snakemake scripts and the ``opprof`` CLI both call these, so a stage behaves the same inside and
outside the workflow. Every writer is atomic (temp file + rename) so a failing stage leaves no
partial output.
"""

from __future__ import annotations

from collections import Counter

import logging
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import aggregate as agg
from . import layers as layer_classes
from . import report as report_md
from . import tables
from .attribution import inductor, nvtx
from .attribution.correlation import enclosing_ops
from .attribution.merge import attribute, merge_fusion_by_name, merge_kineto_run
from .files import (
    InputError,
    read_json_file,
    read_parquet_file,
    write_json,
    write_parquet_atomic,
    write_text_atomic,
)
from .progress import stage_done
from .timeline import kineto, nsys

log = logging.getLogger(__name__)




def _read_counts(timeline: kineto.Timeline) -> str:
    events = sum((timeline.diagnostics.get("event_categories") or {}).values())
    return (f"{events:,} events, " if events else "") + (
        f"{len(timeline.kernels):,} kernels, {len(timeline.launches):,} launches, {len(timeline.ranges):,} ranges")


def is_nsys(kernels: pd.DataFrame) -> bool:
    """Whether a timeline's kernels came from an nsys export (source column, DESIGN.md §3)."""
    return bool(len(kernels)) and bool((kernels["source"] == "nsys").all())


def load_fusion_map_checked(debug_dir: Path) -> pd.DataFrame:
    """The fusion map of an Inductor debug directory; an error when it holds no compiled graph.

    Raises:
        InductorArtifactError: no ``output_code.py`` anywhere under ``debug_dir``.
    """
    debug_dir = Path(debug_dir)
    if not inductor.find_graph_dirs(debug_dir):
        raise inductor.InductorArtifactError(
            f"{debug_dir}: no Inductor debug directory (no output_code.py) found; pass the folder "
            "torch.compile wrote with TORCH_COMPILE_DEBUG=1 (its torchinductor/ or a parent of it)"
        )
    return inductor.load_fusion_map(debug_dir)


def build_fusion_map(debug_dir: Path, out: Path) -> pd.DataFrame:
    fusion = load_fusion_map_checked(debug_dir)
    write_parquet_atomic(fusion, out)
    return fusion


def read_timeline(timeline_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``kernels.parquet`` and ``ranges.parquet`` of a timeline folder."""
    timeline_dir = Path(timeline_dir)
    hint = f"write the timeline first: opprof timeline (--kineto TRACE | --nsys REPORT) --out {timeline_dir}"
    kernels = read_parquet_file(timeline_dir / "kernels.parquet", "a timeline kernels table", hint,
                                tuple(tables.KERNELS.names), nullable_ints=True)
    ranges = read_parquet_file(timeline_dir / "ranges.parquet", "a timeline ranges table", hint,
                               tuple(tables.RANGES.names), nullable_ints=True)
    return kernels, ranges


NSYS_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")


NSYS_ONLY_OUTPUTS = ("nvtx_gpu_projection.parquet",)


def export_timeline(trace: Path, out_dir: Path, kind: str | None = None, expect_gpu: bool = False) -> kineto.Timeline:
    """A trace -> ``kernels.parquet``, ``launches.parquet``, ``ranges.parquet`` in ``out_dir``.

    A Kineto trace (``.json``/``.json.gz``) or an Nsight Systems report (``.sqlite`` export, or
    ``.nsys-rep`` exported with ``nsys``). Also ``gpu_activities.parquet`` (memcpy/memset rows, maybe
    none) and ``diagnostics.json`` (counts, warnings, which are logged); for nsys also
    ``nvtx_gpu_projection.parquet`` (per-stream GPU projection of every NVTX range).
    ``kind`` (``nsys`` or ``kineto``) overrides the guess from the file suffix. ``expect_gpu``
    (a CUDA run): a Kineto trace without GPU kernel records is an error, not a CPU trace.

    Raises:
        TimelineError: unreadable trace; a Kineto trace with neither kernels nor profiler ops; with
            ``expect_gpu``, a Kineto trace without GPU kernel records.
    """
    trace = Path(trace)
    if kind is None:
        kind = "nsys" if trace.suffix.lower() in NSYS_SUFFIXES else "kineto"
    start = time.perf_counter()
    if kind == "nsys":
        timeline = nsys.read_report(trace)
        stage_done(f"read {_read_counts(timeline)}", start)
        for warning in timeline.diagnostics["warnings"]:
            log.warning("%s: %s", trace, warning)
        for info in timeline.diagnostics["info"]:
            log.info("%s: %s", trace, info)
        start = time.perf_counter()
        timeline.diagnostics["gpu_activities"] = kineto.gpu_activity_summary(timeline.activities, timeline.ranges)
        projection = nvtx.gpu_projection(timeline.kernels, timeline.ranges)
        nsys.write_nsys_timeline(timeline, out_dir)
        write_parquet_atomic(projection, Path(out_dir) / "nvtx_gpu_projection.parquet")
        stage_done(f"wrote the timeline tables and the GPU projection of {len(projection):,} ranges to {out_dir}",
                  start)
        return timeline
    timeline = kineto.read_kineto(trace)
    stage_done(f"read {_read_counts(timeline)}", start)
    gpu_kernels = timeline.diagnostics["counts"]["kernels"]
    if expect_gpu and not gpu_kernels:
        raise kineto.TimelineError(
            f"{trace}: no GPU events: the trace holds no 'kernel' record "
            f"({timeline.diagnostics['counts']['cpu_kernels']} CPU ops); profile the CUDA run with "
            "torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])")
    _name_launch_operators(timeline)
    for warning in timeline.diagnostics["warnings"]:
        log.warning("%s: %s", trace, warning)
    start = time.perf_counter()
    timeline.diagnostics["gpu_activities"] = kineto.gpu_activity_summary(timeline.activities, timeline.ranges)
    kineto.write_timeline(timeline, out_dir)
    write_json(Path(out_dir) / "diagnostics.json", timeline.diagnostics)
    stage_done(f"wrote the timeline tables to {out_dir}", start)
    for stale in NSYS_ONLY_OUTPUTS:  # from an nsys timeline written to the same folder before
        (Path(out_dir) / stale).unlink(missing_ok=True)
    return timeline


def _name_launch_operators(timeline: kineto.Timeline) -> None:
    """Name the op around each kernel launch that has no kernel record (docs/field-cases.md C04): its device
    time is unknown, which the report says per operator instead of showing 0."""
    missing = timeline.diagnostics.get("launches_without_kernel") or []
    if not missing:
        return
    probe = pd.DataFrame({
        "kernel_id": range(len(missing)), "pid": [m["pid"] for m in missing],
        "launch_tid": [m["tid"] for m in missing], "launch_start_ns": [m["start_ns"] for m in missing],
        "launch_end_ns": [m["end_ns"] for m in missing], "correlation_id": [m["correlation_id"] for m in missing],
    })
    found = enclosing_ops(probe, timeline.ranges)
    per_operator: dict[str, int] = {}
    for i, entry in enumerate(missing):
        entry["operator"] = found[i].operator
        key = found[i].operator or "<no enclosing op>"
        per_operator[key] = per_operator.get(key, 0) + 1
    timeline.diagnostics["launches_without_kernel_by_operator"] = per_operator


def classify(timeline_dir: Path, layers_json: Path, out_instances: Path, out_kernel_layers: Path,
             out_summary: Path, out_classes_dir: Path, verify: bool = False,
             out_plans_dir: Path | None = None, fusion_map: Path | pd.DataFrame | None = None,
             kineto_timeline: Path | None = None) -> dict[str, dict]:
    """The layer-class checkpoint: instances table, per-kernel layer table, one JSON per class
    (``verify``: each class names two instances to replay, see config ``dedup.verify``) and, with
    ``out_plans_dir``, one ncu replay plan per class (:func:`operator_profiler.ncu.replay.plan_replay`;
    written here, by the checkpoint, so that an unchanged class keeps a byte-identical plan and the GPU
    replay depends on nothing else the timeline export rewrites).

    ``fusion_map`` (a compiled workload's ``fusion_map.parquet``): kernels no layer range claims (a whole-model
    compile has none inside the compiled region) take the layer instance of their FX nodes
    (:func:`operator_profiler.layers.kernel_layers`); on an nsys timeline through the torch.profiler run of the
    same program (``kineto_timeline``, paired by invocation order), else by kernel name (generated kernels only).
    """
    start = time.perf_counter()
    kernels, ranges = read_timeline(timeline_dir)
    hint = ("it is written by the capture (capture/layers.json); for a trace captured elsewhere pass a "
            "file containing [] (no layers)")
    layers = read_json_file(layers_json, "the capture's layers.json", hint, expect=list)
    for index, entry in enumerate(layers):
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not isinstance(entry.get("class"), str):
            raise InputError(f"{layers_json}: entry {index} is not {{\"path\": str, \"class\": str, ...}}: {entry!r}; {hint}")
    fusion = _read_fusion_map(fusion_map)
    fx_answers = None
    if fusion is not None and is_nsys(kernels):
        paths = [entry["path"] for entry in layers]
        if kineto_timeline is not None:
            from .attribution.transfer import align_runs

            k_kernels, k_ranges = read_timeline(kineto_timeline)
            pairs, _ = align_runs(kernels, k_kernels)
            fx_answers = layer_classes.carry_membership(pairs, k_kernels, layer_classes.kernel_layers(
                k_kernels, k_ranges, layers, fusion))
        else:
            fx_answers = layer_classes.fx_membership_by_name(kernels, fusion, paths)
    kernel_layers, instances, classes = layer_classes.classify_layers(kernels, ranges, layers, verify, fusion,
                                                                      fx_answers)
    stage_done(f"classified {len(kernels):,} kernels into {len(classes):,} layer classes "
              f"({len(instances):,} instances)", start)
    membership = kernel_layers["membership"].value_counts()
    if membership.get("cross_layer", 0) or membership.get("unknown", 0):
        log.warning("%d kernels are cross-layer (their FX nodes lie in several layer instances) and %d have no known "
                    "layer (whole-model compile, FX nodes' modules unknown): both are in no layer instance (class "
                    "rest); the report lists them", int(membership.get("cross_layer", 0)),
                    int(membership.get("unknown", 0)))
    write_parquet_atomic(instances, out_instances)
    write_parquet_atomic(kernel_layers, out_kernel_layers)
    write_json(out_summary, classes)
    layer_classes.write_classes(classes, out_classes_dir)
    if out_plans_dir is not None:
        from .ncu.replay import write_plans

        write_plans(kernels, kernel_layers, classes, out_plans_dir)
    return classes


def _read_fusion_map(fusion_map: Path | pd.DataFrame | None) -> pd.DataFrame | None:
    """A fusion map given as a ``fusion_map.parquet`` path (read and checked) or a loaded table; None stays None."""
    if fusion_map is None or isinstance(fusion_map, pd.DataFrame):
        return fusion_map
    return read_parquet_file(Path(fusion_map), "a fusion map", "write it with: opprof fusion-map --inductor-dir DIR --out FILE",
                             ("graph", "call_index", "profiler_name"))


def timeline_kernel_count(kernels: pd.DataFrame) -> int:
    """Kernels of a timeline that count as launches of the measured window: every kernel row, less nsys's
    ``<cuda_graph N>`` rows of graphs traced at graph granularity (``activity == "graph"``)."""
    if "activity" in kernels.columns:
        return int((kernels["activity"] != "graph").sum())
    return len(kernels)


def check_kernel_counts(counts: dict[str, int | None]) -> None:
    """Fail when the runs of one workload launched different numbers of kernels in their measured window.

    ``counts`` maps a run's label (its run.json, or a timeline) to its kernel count; ``None`` (not known)
    is skipped. Every run of a workload (the timeline capture, the torch.profiler run beside nsys, each ncu
    replay) uses the same seed, shapes and settings, and autotuning happens in warm-up, so the invocation
    order must be identical: pairing and counter matching rely on it.

    Raises:
        InputError: two known counts differ (the message lists them all and what to check).
    """
    known = {label: int(n) for label, n in counts.items() if n is not None}
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{label}: {n}" for label, n in known.items())
        raise InputError(f"the runs of this workload launched different numbers of kernels in the measured window "
                         f"({listed}), so their invocation order differs and kernels cannot be paired by it; "
                         "check that all runs used the same config, seed, shapes and settings (run.json "
                         "'settings'), that nothing autotunes in the measured window (harness.warmup >= 1), "
                         "and re-run the captures")


def _check_run_counts(runs: list[Path], kernels: pd.DataFrame) -> dict[str, int | None]:
    """Kernel counts of the workload's runs: each run.json's ``measured_kernels`` (the harness's count, null
    under nsys), and for the first run (the one this timeline comes from) the timeline reader's count too.
    CPU runs are skipped (their "kernels" are compute calls, not launches)."""
    counts: dict[str, int | None] = {}
    for i, path in enumerate(runs):
        run = read_json_file(Path(path), "a capture's run.json", "run the capture rules", expect=dict)
        device = (run.get("versions") or {}).get("device") or run.get("device")
        if device == "cpu":
            continue
        counts[f"{path} (recorded by the harness)"] = run.get("measured_kernels")
        if i == 0:
            counts[f"{path} (counted in its timeline)"] = timeline_kernel_count(kernels)
    check_kernel_counts(counts)
    return counts


def attribute_files(timeline_dir: Path, kernel_layers: Path | None, fusion_map: Path | pd.DataFrame | None,
                    out: Path, nvtx_options: nvtx.NvtxOptions | None = None,
                    kineto_timeline: Path | None = None, runs: list[Path] | None = None) -> pd.DataFrame:
    """Attribution of every kernel of a timeline -> ``attribution/kernels.parquet``.

    A Kineto timeline runs paths (a) correlation and (c) the fusion map; an nsys timeline runs path
    (b) NVTX enclosure with ``nvtx_options``, plus (a) and (c) from ``kineto_timeline`` (the
    timeline folder of a torch.profiler run of the same program, paired by invocation order; its
    summary goes to ``pairing.json`` beside ``out``). ``fusion_map`` is a ``fusion_map.parquet``
    path or an already loaded fusion map.

    ``runs``: the run.json of every capture of the workload, this timeline's first (``capture/run.json``,
    then ``capture/kineto_run.json``): their kernel counts of the measured window must agree
    (:func:`check_kernel_counts`; the nsys count is the timeline reader's), else nothing is attributed.

    Raises:
        InputError: unreadable inputs, tables from different timelines, a ``kineto_timeline``
            that is not a Kineto timeline, or runs with different kernel counts.
    """
    start = time.perf_counter()
    kernels, ranges = read_timeline(timeline_dir)
    stage_done(f"read {len(kernels):,} kernels and {len(ranges):,} ranges", start)
    start = time.perf_counter()
    if runs:
        _check_run_counts([Path(r) for r in runs], kernels)
    kl = _kernel_layers_for(kernels, ranges, timeline_dir, kernel_layers)
    fusion = _read_fusion_map(fusion_map)
    if is_nsys(kernels):
        result = nvtx.attribute_nvtx(kernels, ranges, kl, nvtx_options or nvtx.NvtxOptions())
        if kineto_timeline is not None:
            k_kernels, k_ranges = read_timeline(kineto_timeline)
            if is_nsys(k_kernels):
                raise InputError(f"{kineto_timeline} is an nsys timeline; --kineto-timeline takes the timeline "
                                 "folder of a torch.profiler run (opprof timeline --kineto TRACE --out DIR)")
            k_layers, _, _ = layer_classes.classify_layers(k_kernels, k_ranges, [])
            kineto_result = attribute(k_kernels, k_ranges, k_layers, fusion)
            result, summary = merge_kineto_run(result, kernels, kineto_result, k_kernels)
            if summary["paired"] < summary["target_kernels"]:
                log.warning("%d of %d kernels have no partner in the torch.profiler run %s (paired by invocation "
                            "order): they keep the NVTX answer only", summary["target_kernels"] - summary["paired"],
                            summary["target_kernels"], kineto_timeline)
            if summary["mismatched_iterations"]:
                diff = summary["first_difference"]
                where = "the whole run" if diff["iteration"] < 0 else f"iteration {diff['iteration']}"
                log.warning("the torch.profiler run %s launched a different kernel sequence than this timeline in %s "
                            "(%d vs %d kernels; first difference at position %d: %s here, %s there): those kernels "
                            "keep the NVTX answer only. Are both captures of the same program, shapes and settings?",
                            kineto_timeline, where, diff["target_kernels"], diff["source_kernels"], diff["position"],
                            diff["target"], diff["source"])
            write_json(Path(out).parent / "pairing.json", summary)
        elif fusion is not None and len(fusion):
            result = merge_fusion_by_name(result, kernels, fusion)
    else:
        if kineto_timeline is not None:
            log.warning("--kineto-timeline is ignored: the timeline %s is itself a Kineto timeline", timeline_dir)
        result = attribute(kernels, ranges, kl, fusion)
    if fusion is not None and len(fusion):
        _warn_fusion_map(result, fusion, timeline_dir)
    # The train-step phase (forward/backward/optimizer) from our phase ranges by launch time on the process.
    phases = pd.Series(kineto.kernel_phases(kernels, ranges), index=kernels["kernel_id"].astype("int64").to_numpy())
    result["phase"] = phases.reindex(result["kernel_id"].astype("int64").to_numpy()).to_numpy(dtype=object)
    disagreements = agg.external_id_disagreements(result)
    if disagreements["count"]:
        log.warning("%d of %d checked kernels carry a Kineto External id that names another op than the one around "
                    "their launch (their operator stays the launch's; coverage.json external_id_disagreements "
                    "lists examples): the trace's op ids are not to be trusted", disagreements["count"],
                    disagreements["checked"])
    stage_done(f"attributed {len(result):,} kernels ({int(result['operator'].notna().sum()):,} to an operator)", start)
    result = _with_membership(result, kl)
    tables.write_table(result, tables.ATTRIBUTION, out)
    return result


# Path (c) refusals that say the map does not fit the trace (rather than that it fits several ways).
_FUSION_MISMATCH_REASONS = ("fusion_map_mismatch", "cuda_graph_replay_mismatch", "not_in_fusion_map")


def _warn_fusion_map(result: pd.DataFrame, fusion: pd.DataFrame, timeline_dir: Path) -> None:
    """One warning about what the fusion map could not place.

    "Is it from another run?" only when it placed no kernel and every refusal says the map does not fit
    (:data:`_FUSION_MISMATCH_REASONS`); otherwise the count per reason, the candidate graphs of
    ``ambiguous_compiled_graph``, and the kernels whose FX nodes stayed undecided (``source_nodes_ambiguous``).
    Reads the ``inductor`` entry of each kernel's evidence JSON (its keys are sorted, so an answered call site
    starts with ``call_index``).
    """
    evidence = result["evidence"].astype(str)
    matched = int(evidence.str.contains('"inductor": {"call_index"', regex=False).sum())
    refused = evidence.str.extract(r'"inductor": \{[^{}]*?"reason": "(\w+)"', expand=False)
    counts = refused.value_counts()
    ambiguous_nodes = int((result["reason"] == "source_nodes_ambiguous").sum())
    graphs = fusion["graph"].nunique()
    if not matched and set(counts.index) <= set(_FUSION_MISMATCH_REASONS):
        detail = ", ".join(f"{n} {why}" for why, n in counts.items())
        log.warning("the fusion map (%d call sites of %d graphs) matched no kernel of %s%s: is it from "
                    "another run or model?", len(fusion), graphs, timeline_dir, f" ({detail})" if detail else "")
        return
    if counts.empty and not ambiguous_nodes:
        return
    parts = [f"{n} {why}" for why, n in counts.items()]
    if "ambiguous_compiled_graph" in counts:
        sets = evidence[refused == "ambiguous_compiled_graph"].str.extract(
            r'"candidates": \[([^\]]*)\]', expand=False).value_counts()
        parts[list(counts.index).index("ambiguous_compiled_graph")] += " (graphs " + "; ".join(
            s.replace('"', "") for s in sets.index[:3]) + (" ..." if len(sets) > 3 else "") + \
            ": pass the TORCH_TRACE log of the compile in the Inductor dir to tell them apart)"
    if ambiguous_nodes:
        parts.append(f"{ambiguous_nodes} with their operator but undecided FX nodes (source_nodes_ambiguous)")
    log.warning("the fusion map (%d graphs) placed %d kernels of %s; not placed: %s", graphs, matched,
                timeline_dir, "; ".join(parts))


def _with_membership(result: pd.DataFrame, kl: pd.DataFrame) -> pd.DataFrame:
    """The kernel_layers ``membership``/``layers_spanned`` as extra attribution columns (how each kernel's layer
    was decided, the instances a cross-layer kernel spans; DESIGN.md §3), for coverage.json and the report."""
    if "membership" not in kl:
        return result
    by_id = kl.set_index(kl["kernel_id"].astype("int64"))
    ids = result["kernel_id"].astype("int64").to_numpy()
    out = result.copy()
    out["membership"] = by_id["membership"].reindex(ids).to_numpy(dtype=object)
    spans = by_id["layers_spanned"].reindex(ids).to_numpy(dtype=object)
    out["layers_spanned"] = [list(v) if isinstance(v, (list, tuple, np.ndarray)) else [] for v in spans]
    return out


def _kernel_layers_for(kernels: pd.DataFrame, ranges: pd.DataFrame, timeline_dir: Path,
                       kernel_layers: Path | None) -> pd.DataFrame:
    if kernel_layers is None:
        return layer_classes.classify_layers(kernels, ranges, [])[0]
    kl = read_parquet_file(kernel_layers, "a kernel_layers table (layers/kernel_layers.parquet)",
                           "write it with: opprof classify --timeline DIR --layers LAYERS.json --out DIR",
                           ("kernel_id", "layer", "layer_class", "position"))
    if len(kl) != len(kernels) or not kl["kernel_id"].astype("int64").sort_values().reset_index(drop=True).equals(
            kernels["kernel_id"].astype("int64").sort_values().reset_index(drop=True)):
        raise InputError(f"{kernel_layers} lists {len(kl)} kernels, the timeline {timeline_dir} {len(kernels)}: they "
                         f"come from different timelines; run: opprof classify --timeline {timeline_dir} ...")
    return kl


def aggregate_files(attribution_path: Path, instances_path: Path, classes_path: Path, options: dict, out_operators_parquet: Path, out_operators_csv: Path, out_modules: Path,
                    out_layer_classes: Path, out_coverage: Path, counters_path: Path | None = None,
                    matching_path: Path | None = None, out_phases: Path | None = None) -> None:
    """Operators, modules, layer classes and coverage (and, with ``out_phases``, the operators per train-step
    phase: :func:`operator_profiler.aggregate.phases_table`, empty for inference); with ``counters_path``
    (``matched/kernel_metrics.parquet``) the catalog's hardware metrics and a bottleneck label per
    operator and module, and with ``matching_path`` (``matched/diagnostics.json``) the kernels whose
    counters the matching refused, per reason and key (``coverage.json`` ``counters``)."""
    hint = "write it with opprof attribute / opprof classify (see opprof --help)"
    attribution = read_parquet_file(attribution_path, "an attribution table", hint,
                                    tuple(tables.ATTRIBUTION.names) + ("duration_ns", "operator_range_id"),
                                    nullable_ints=True)
    instances = read_parquet_file(instances_path, "a layer instances table", hint,
                                  ("layer", "layer_class", "iteration", "time_ns"))
    classes = read_json_file(classes_path, "classes.json of opprof classify", hint, expect=dict)
    _check_same_timeline(attribution, attribution_path, instances, instances_path)
    matching = read_json_file(Path(matching_path), "matched/diagnostics.json", "write it with: opprof match ...",
                              expect=dict) if matching_path is not None else None
    if matching is not None:
        _check_counters_timeline(matching.get("timeline"), attribution, matching_path, attribution_path)
    operators = agg.operators_table(attribution, options["per_iteration"])
    modules = agg.modules_table(attribution, options["per_iteration"])
    counters = None
    if counters_path is not None:
        from .ncu.catalog import load_catalog

        counters = read_parquet_file(counters_path, "matched kernel counters (matched/kernel_metrics.parquet)",
                                     "write it with: opprof match --timeline DIR --ncu NCU.parquet --out DIR",
                                     ("kernel_id", "ncu_id", "counters_from"))
        _check_counters_timeline(counters.attrs.get("timeline"), attribution, counters_path, attribution_path)
        catalog = load_catalog(options.get("catalog"))
        operators = agg.with_counters(operators, attribution, counters, "operator", catalog)
        modules = agg.with_counters(modules, attribution, counters, "module", catalog)
        layer_table = agg.with_counters(agg.layer_classes_table(instances, classes, options["per_iteration"]),
                                        attribution, counters, "layer_class", catalog)
    else:
        layer_table = agg.layer_classes_table(instances, classes, options["per_iteration"])
    write_parquet_atomic(operators, out_operators_parquet)
    if out_phases is not None:
        write_parquet_atomic(agg.phases_table(attribution), out_phases)
    write_parquet_atomic(modules, out_modules)
    write_parquet_atomic(layer_table, out_layer_classes)
    write_text_atomic(out_operators_csv, operators.to_csv(index=False))
    summary = agg.coverage(attribution, counters_collected=counters is not None, device=options.get("device"),
                           counters=counters, matching=matching)
    summary["timeline"] = timeline_digest(attribution)  # the report checks a matching's against it
    write_json(out_coverage, summary)


def _check_same_timeline(attribution: pd.DataFrame, attribution_path: Path, instances: pd.DataFrame,
                         instances_path: Path) -> None:
    """The attribution and the layer instances must describe the same timeline: the kernels the
    attribution puts in layers are exactly those the instances count.

    Raises:
        InputError: naming both files and the counts that disagree.
    """
    # Every kernel is in one instance: a layer instance or the class "rest" (layers.REST_CLASS).
    counted = int(instances["kernel_count"].sum()) if "kernel_count" in instances and len(instances) else 0
    unknown = set(attribution["layer"].dropna()) - set(instances["layer"])
    if (len(instances) and counted != len(attribution)) or unknown:
        detail = (f"layers {sorted(unknown)[:3]} are not among its instances" if unknown
                  else f"its instances hold {counted} kernels, the attribution {len(attribution)}")
        raise InputError(f"{instances_path} does not describe the timeline of {attribution_path}: {detail}; pass the "
                         "instances.parquet/classes.json that opprof classify wrote for the same timeline")


def read_report_inputs(run_path: Path | None, coverage_path: Path, operators_path: Path, modules_path: Path,
                       layer_classes_path: Path, diagnostics_path: Path | None = None,
                       match_diagnostics_path: Path | None = None, replay_paths: list[Path] | None = None,
                       clocks_path: Path | None = None, phases_path: Path | None = None) -> dict:
    """What a report shows, read and checked: ``run``, ``coverage``, ``operators``, ``modules``,
    ``layer_classes``, ``diagnostics``, ``matching``, ``replays``, ``clocks`` (the optional ones None when
    their path is None). ``run_path`` is the capture's ``run.json`` (None for a trace captured elsewhere);
    ``diagnostics_path`` a timeline's ``diagnostics.json`` (source file, versions, GPUs and the reader's
    warnings); ``replay_paths`` the classes' ``ncu/{cls}.replay.json`` (measured replay time against
    replaying every layer instance); ``clocks_path`` the capture's ``clocks_applied.json``; ``phases_path``
    ``phases.parquet`` (operators per train-step phase; key ``phases``, None without it).

    Raises:
        InputError: a missing or wrong file, or a diagnostics.json of another timeline.
    """
    hint = "run opprof aggregate first"
    run = read_json_file(run_path, "the capture's run.json", "pass capture/run.json, or leave --run out for a trace "
                         "captured elsewhere", expect=dict) if run_path is not None else None
    diagnostics = read_json_file(diagnostics_path, "a timeline's diagnostics.json", "write the timeline with opprof "
                                 "timeline (--kineto TRACE | --nsys REPORT) --out DIR", expect=dict) if diagnostics_path is not None else None
    coverage = read_json_file(coverage_path, "coverage.json", hint, expect=dict)
    if diagnostics and "counts" in diagnostics:
        counts = diagnostics["counts"]
        in_timeline = counts.get("kernels", 0) + counts.get("cpu_kernels", 0) + counts.get("graph_launch_rows", 0)
        if in_timeline != coverage.get("kernel_count"):
            raise InputError(f"{diagnostics_path} describes a timeline of {in_timeline} kernels, {coverage_path} "
                             f"{coverage.get('kernel_count')}: pass the timeline these results were made from")
    matching = read_json_file(match_diagnostics_path, "matched/diagnostics.json", "run opprof match first",
                              expect=dict) if match_diagnostics_path is not None else None
    recorded = (matching or {}).get("timeline") or {}
    if recorded and coverage.get("timeline") and recorded != coverage["timeline"] or \
            recorded.get("kernels") is not None and recorded["kernels"] != coverage.get("kernel_count"):
        raise InputError(f"{match_diagnostics_path} was matched on another timeline ({recorded['kernels']} kernels) "
                         f"than {coverage_path} describes ({coverage.get('kernel_count')} kernels): pass the matching "
                         "of these results")
    return {
        "run": run,
        "coverage": coverage,
        "operators": read_parquet_file(operators_path, "an operators table", hint, ("operator", "time_ns")),
        "modules": read_parquet_file(modules_path, "a modules table", hint, ("module", "time_ns")),
        "layer_classes": read_parquet_file(layer_classes_path, "a layer classes table", hint,
                                           ("layer_class", "instances")),
        "diagnostics": diagnostics,
        "matching": matching,
        "replays": read_replay_records(replay_paths) if replay_paths else None,
        "clocks": read_json_file(clocks_path, "the capture's clocks_applied.json", "it is written by the capture",
                                 expect=dict) if clocks_path is not None else None,
        "phases": read_parquet_file(phases_path, "a phases table (phases.parquet)", hint, ("phase", "operator",
                                    "time_ns", "phase_share")) if phases_path is not None else None,
    }


def report_files(workload: str, run_path: Path | None, coverage_path: Path, operators_path: Path, modules_path: Path,
                 layer_classes_path: Path, options: dict, out: Path, diagnostics_path: Path | None = None,
                 match_diagnostics_path: Path | None = None, replay_paths: list[Path] | None = None,
                 clocks_path: Path | None = None, phases_path: Path | None = None) -> None:
    """The Markdown report (inputs: :func:`read_report_inputs`)."""
    inputs = read_report_inputs(run_path, coverage_path, operators_path, modules_path, layer_classes_path,
                                diagnostics_path, match_diagnostics_path, replay_paths, clocks_path, phases_path)
    text = report_md.render_markdown(workload, inputs.pop("run"), inputs.pop("coverage"), inputs.pop("operators"),
                                     inputs.pop("modules"), inputs.pop("layer_classes"), options["top_operators"],
                                     **inputs)
    write_text_atomic(out, text)


def counters_time_share(attribution_path: Path, counters_path: Path) -> float:
    """The share of kernel time (timeline durations) whose kernels have matched ncu counters."""
    attribution = read_parquet_file(attribution_path, "an attribution table", "run opprof attribute first",
                                    ("kernel_id", "duration_ns"))
    counters = read_parquet_file(counters_path, "matched kernel counters (matched/kernel_metrics.parquet)",
                                 "run opprof match first", ("kernel_id",))
    total = int(attribution["duration_ns"].sum())
    with_counters = int(attribution.loc[attribution["kernel_id"].isin(counters["kernel_id"]), "duration_ns"].sum())
    return with_counters / total if total else 0.0


HTML_SUFFIXES = (".html", ".htm")


def html_output(out: str | Path, example: str = "report.html", results: str | Path | None = None) -> Path:
    """The path of an HTML page to write (``report.html``, ``compare.html``), checked before anything is read or
    written: a name ending in ``.html``/``.htm`` (so no input table, JSON or other file is ever overwritten by a
    page), not a folder, in a folder that exists, and not the ``report.html`` of a results folder (one holding
    ``operators.parquet``) other than ``results`` (the folder the page is of; None: any), which Snakemake would
    then take as up to date. Errors name ``out`` as given.

    Raises:
        InputError: an empty path, a folder, another suffix, a missing parent folder, or another results
            folder's report.html.
    """
    text = str(out)
    if not text.strip():
        raise InputError(f"--out {text!r} is empty; name the HTML page to write, e.g. -o {example}")
    path = Path(text)
    if text.endswith(("/", os.sep)) or path.name in ("", ".", "..") or path.is_dir():
        raise InputError(f"--out {text} is a folder; name the HTML page to write, e.g. -o {path / example}")
    if path.suffix.lower() not in HTML_SUFFIXES:
        raise InputError(f"--out {text} does not end in .html; the page is only written to an .html (or .htm) "
                         f"file, so that no other file is overwritten: e.g. -o {example}")
    if not path.parent.is_dir():
        raise InputError(f"--out {text}: the folder {path.parent} does not exist; create it first, or choose "
                         "another --out")
    if (path.name.lower() == "report.html" and (path.parent / "operators.parquet").is_file()
            and (results is None or path.parent.resolve() != Path(results).resolve())):
        raise InputError(f"--out {text} is the report.html of the results folder {path.parent} (the workflow's "
                         "output, which Snakemake would then take as up to date); write the page elsewhere, e.g. "
                         f"-o {example}")
    return path


def report_html_files(workload: str, run_path: Path | None, coverage_path: Path, operators_path: Path,
                      modules_path: Path, layer_classes_path: Path, options: dict, out: Path,
                      diagnostics_path: Path | None = None, match_diagnostics_path: Path | None = None,
                      replay_paths: list[Path] | None = None, clocks_path: Path | None = None,
                      attribution_path: Path | None = None, counters_path: Path | None = None,
                      phases_path: Path | None = None) -> None:
    """``report.html``, self-contained (:func:`operator_profiler.report_html.render_html`); inputs as
    :func:`report_files`, plus the attribution and the matched counters (CUDA) for the share of kernel time
    with counters. Written atomically."""
    from . import report_html

    out = html_output(out, results=Path(operators_path).parent)
    inputs = read_report_inputs(run_path, coverage_path, operators_path, modules_path, layer_classes_path,
                                diagnostics_path, match_diagnostics_path, replay_paths, clocks_path, phases_path)
    counters_time = (counters_time_share(attribution_path, counters_path)
                     if attribution_path is not None and counters_path is not None else None)
    text = report_html.render_html(workload, inputs.pop("run"), inputs.pop("coverage"), inputs.pop("operators"),
                                   inputs.pop("modules"), inputs.pop("layer_classes"), options["top_operators"],
                                   counters_time=counters_time, **inputs)
    write_text_atomic(out, text)


def results_folder_inputs(folder: Path) -> dict:
    """The report inputs of a workload's results folder (``results/<workload>/`` of a finished run), by the
    workflow's layout: the keyword arguments of :func:`report_html_files` after ``workload``.

    Raises:
        InputError: not a folder, or no ``operators.parquet`` in it (not a results folder).
    """
    folder = Path(folder)
    if not folder.is_dir() or not (folder / "operators.parquet").is_file():
        what = "is not a folder" if not folder.is_dir() else "holds no operators.parquet"
        raise InputError(f"{folder} {what}: not a results folder; pass results/<workload>/ of a finished run "
                         "(snakemake), or the --out folder of opprof aggregate")

    def optional(relative: str) -> Path | None:
        return folder / relative if (folder / relative).is_file() else None

    counters = optional("matched/kernel_metrics.parquet")
    return {
        "run_path": optional("capture/run.json"),
        "coverage_path": folder / "coverage.json",
        "operators_path": folder / "operators.parquet",
        "modules_path": folder / "modules.parquet",
        "layer_classes_path": folder / "layer_classes.parquet",
        "diagnostics_path": optional("timeline/diagnostics.json"),
        "match_diagnostics_path": optional("matched/diagnostics.json"),
        "replay_paths": sorted((folder / "ncu").glob("*.replay.json")) or None,
        "clocks_path": optional("capture/clocks_applied.json"),
        "attribution_path": optional("attribution/kernels.parquet") if counters else None,
        "counters_path": counters,
        "phases_path": optional("phases.parquet"),
    }


def compare_files(folder_a: Path, folder_b: Path, out: Path, force: bool = False, top: int | None = None) -> pd.DataFrame:
    """``compare.html``: the profile in ``folder_b`` against the one in ``folder_a`` (two results folders of
    one workload, e.g. before and after a change; :func:`operator_profiler.report_html.render_compare`).
    Returns the per-operator comparison table (:func:`operator_profiler.report_html.compare_table`); ``top``: the
    largest changes plotted (default ``report_html.TOP_BARS``). Nothing is written on an error.

    Raises:
        InputError: a folder that is not a results folder, or two different workloads (model kind/factory of
            their run.json, or the folder names without one) unless ``force``.
    """
    from . import report_html

    out = html_output(out, "compare.html")
    profiles = []
    for folder in (Path(folder_a), Path(folder_b)):
        paths = results_folder_inputs(folder)
        inputs = read_report_inputs(paths["run_path"], paths["coverage_path"], paths["operators_path"],
                                    paths["modules_path"], paths["layer_classes_path"],
                                    clocks_path=paths["clocks_path"])
        name = folder.resolve().name
        profiles.append({"folder": str(folder), "workload": name, "run": inputs["run"], "clocks": inputs["clocks"],
                         "coverage": inputs["coverage"], "operators": inputs["operators"]})
    a, b = profiles
    identity_a = report_html.workload_identity(a["run"], a["workload"])
    identity_b = report_html.workload_identity(b["run"], b["workload"])
    differ = identity_a != identity_b
    if differ and not force:
        raise InputError(f"{folder_a} and {folder_b} are profiles of different workloads ({identity_a} vs "
                         f"{identity_b}); compare two profiles of one workload, or pass --force to compare anyway")
    write_text_atomic(out, report_html.render_compare(a, b, top=top or report_html.TOP_BARS, forced=differ))
    return report_html.compare_table(a["operators"], report_md.measured_iterations(a["run"], a["coverage"]),
                                     b["operators"], report_md.measured_iterations(b["run"], b["coverage"]))


def trace_files(timeline_dir: Path, attribution_path: Path, out: Path, counters_path: Path | None = None) -> dict:
    """``trace.json``: the timeline as a Chrome/Perfetto trace with each kernel's attribution (and
    matched counters) in its ``args`` (``trace_export.build_trace``); written atomically.

    Raises:
        InputError: a missing or wrong input table, or an attribution of another timeline.
    """
    from . import trace_export

    timeline_dir = Path(timeline_dir)
    kernels, ranges = read_timeline(timeline_dir)
    launches_path = timeline_dir / "launches.parquet"
    launches = read_parquet_file(launches_path, "a timeline launches table", "write the timeline with opprof "
                                 f"timeline --out {timeline_dir}", tuple(tables.LAUNCHES.names),
                                 nullable_ints=True) if launches_path.is_file() else None
    attribution = read_parquet_file(attribution_path, "an attribution table",
                                    f"write it with: opprof attribute --timeline {timeline_dir} --out FILE",
                                    tuple(tables.ATTRIBUTION.names), nullable_ints=True)
    counters = read_parquet_file(counters_path, "matched kernel counters (matched/kernel_metrics.parquet)",
                                 "write it with: opprof match --timeline DIR --ncu NCU.parquet --out DIR",
                                 ("kernel_id", "ncu_id", "counters_from")) if counters_path is not None else None
    if counters is not None:
        _check_counters_timeline(counters.attrs.get("timeline"), kernels, counters_path, Path(timeline_dir))
    activities_path = timeline_dir / "gpu_activities.parquet"
    activities = read_parquet_file(activities_path, "the timeline's memcpy/memset table", "write the timeline "
                                   f"again with opprof timeline --out {timeline_dir}", ("kind", "start_ns", "end_ns"),
                                   nullable_ints=True) if activities_path.is_file() else None
    try:
        trace = trace_export.build_trace(kernels, ranges, attribution, counters=counters, launches=launches,
                                         activities=activities)
    except ValueError as exc:
        raise InputError(f"{attribution_path} does not belong to the timeline {timeline_dir}: {exc}; run opprof "
                         f"attribute --timeline {timeline_dir} again") from None
    write_text_atomic(out, trace_export.dumps(trace))
    return trace


def parse_ncu_files(csv_paths: list[Path], out: Path) -> pd.DataFrame:
    """ncu CSVs (or ``.ncu-rep`` reports, exported with ``ncu`` from PATH) -> one row per profiled
    kernel (``ncu/{cls}.parquet``, DESIGN.md §3).

    Columns: ``source`` (the CSV), ``ncu_id``, ``pid``, ``device`` (ncu's ``Device``, null when the
    layout lacks it), ``name``, ``match_key`` (the name as printed: the replay asks ncu for mangled names),
    ``occurrence`` (index among the kernels of the same file, process, device and name, in ncu_id order),
    ``stream``, ``grid``, ``block``, then one column per metric as ncu spells it, in base units; the units
    are in the parquet metadata (``units``: metric -> unit).

    Raises:
        NcuCsvError: a CSV that is empty, has no header, holds a failed run's errors or a non-numeric
            metric (the message says what ncu reported and how to fix it).
    """
    import tempfile

    from .ncu.csv_reader import export_report_csv, read_ncu_csv, wide_metrics

    frames, units = [], {}
    for path in csv_paths:
        if Path(path).suffix == ".ncu-rep":  # exported with ncu itself (it must be on PATH)
            with tempfile.TemporaryDirectory(prefix="opprof-ncu-") as tmp:
                long = read_ncu_csv(export_report_csv(Path(path), Path(tmp)))
        else:
            long = read_ncu_csv(Path(path))
        if long.attrs.get("locale_guessed"):
            example = long.attrs["locale_guessed"]
            log.warning("%s: every number is written like %r, which reads as %s (decimal point) or as %s (grouped "
                        "thousands); nothing in the file tells which, so it is read with a decimal point. If ncu ran "
                        "in a locale that groups thousands with '.', re-export it: LC_ALL=C ncu -i REPORT --csv ...",
                        path, example, example.replace(",", "."), example.replace(".", "").replace(",", ""))
        wide = wide_metrics(long)
        units.update(wide.attrs.get("units", {}))
        for column in ("pid", "device"):  # a non-numeric cell (never seen) must not pass for an id
            wide[column] = pd.array(pd.to_numeric(wide[column], errors="coerce"), dtype="Int64")
        wide.insert(0, "source", str(path))
        wide.insert(wide.columns.get_loc("name") + 1, "match_key", wide["name"])
        keys = [c for c in ("pid", "device") if wide[c].notna().all()] + ["match_key"]
        wide.insert(wide.columns.get_loc("match_key") + 1, "occurrence",
                    wide.sort_values("ncu_id").groupby(keys, dropna=False).cumcount().reindex(wide.index).astype("int64"))
        frames.append(wide)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    table.attrs = {"units": units}
    write_parquet_atomic(table, out)
    return table



def timeline_digest(kernels: pd.DataFrame) -> dict:
    """What identifies a timeline's kernels: their count and a SHA-1 of their names in ``kernel_id`` order. The
    matched counters and diagnostics carry it, so the stages that join them to an attribution table can refuse
    those of another timeline (kernel ids alone are 0..n-1 in every timeline)."""
    import hashlib

    ordered = kernels.sort_values("kernel_id")
    text = "\n".join(f"{k}\t{n}" for k, n in zip(ordered["kernel_id"].astype("int64"), ordered["name"].astype(str)))
    return {"kernels": int(len(kernels)), "sha1": hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()}


def _check_counters_timeline(recorded: dict | None, attribution: pd.DataFrame, what: Path,
                             attribution_path: Path) -> None:
    """Counters/diagnostics of ``opprof match`` belong to the attribution's timeline, else one-line error."""
    if not recorded:
        return
    mine = timeline_digest(attribution)
    if recorded != mine:
        raise InputError(f"{what} was matched on another timeline ({recorded.get('kernels')} kernels) than "
                         f"{attribution_path} ({mine['kernels']} kernels, other kernel names): run opprof match on "
                         "the timeline this attribution came from")


def _window_specs(window: dict | None) -> list[dict]:
    if not isinstance(window, dict):
        return []
    return [w for w in window["sources"].values() if isinstance(w, dict)] if "sources" in window else [window]


def match_files(timeline_dir: Path, ncu_paths: list[Path], out_metrics: Path, out_diagnostics: Path,
                window: dict | None = None, kernel_layers_path: Path | None = None,
                process_map: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """``timeline/kernels.parquet`` + ``ncu/{cls}.parquet`` files -> ``matched/kernel_metrics.parquet`` and
    ``matched/diagnostics.json`` (invocation-order matching, :func:`operator_profiler.matching.match_invocations`,
    whose docstring describes ``window`` and ``process_map``). With ``kernel_layers_path`` the counters of
    each layer class's measured instance are broadcast to the class's other instances by position
    (``counters_from`` names the measured kernel)."""
    from .matching import broadcast_to_instances, match_invocations

    for stale in (Path(out_metrics), Path(out_diagnostics)):  # a failed run must not leave an earlier run's answer
        stale.unlink(missing_ok=True)
    kernels = read_parquet_file(Path(timeline_dir) / "kernels.parquet", "the timeline kernels table",
                                "run 'opprof timeline' first", ("kernel_id", "name", "match_key", "occurrence"))
    frames, units, owner = [], {}, {}
    for path in ncu_paths:
        frame = read_parquet_file(Path(path), "an ncu counters table", "run 'opprof ncu' first",
                                  ("ncu_id", "name", "match_key"))
        units.update(frame.attrs.get("units", {}))
        if "source" not in frame.columns:
            frame.insert(0, "source", str(path))
        for source in frame["source"].astype(str).unique():
            # rows are known by (source, ID): two runs under one name would mix their results
            if owner.setdefault(source, str(path)) != str(path):
                raise InputError(f"{path} and {owner[source]} both hold rows of an ncu file named {source!r}: two runs "
                                 "under one name cannot be told apart; parse each CSV from a path of its own "
                                 "(opprof ncu DIR1/prof.csv DIR2/prof.csv --out ...)")
        frames.append(frame)
    ncu = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["source", "ncu_id", "name", "match_key"])
    ncu.attrs = {"units": units}
    from .matching.windows import check_window

    try:
        check_window(window, ncu["source"].astype(str).unique().tolist() if len(ncu) else [])
    except ValueError as exc:
        raise InputError(str(exc)) from None
    timeline_pids = sorted(set(pd.array(kernels["pid"], dtype="Int64").dropna().tolist())) if "pid" in kernels else []
    ncu_pids = sorted(set(pd.array(ncu["pid"], dtype="Int64").dropna().tolist())) if "pid" in ncu else []
    for ncu_pid, tl_pid in (process_map or {}).items():
        if tl_pid not in timeline_pids:
            raise InputError(f"--process-map {ncu_pid}={tl_pid}: the timeline {timeline_dir} has no process {tl_pid} "
                             f"(its processes: {', '.join(map(str, timeline_pids)) or 'none'})")
        if ncu_pid not in ncu_pids:
            raise InputError(f"--process-map {ncu_pid}={tl_pid}: no ncu file has a process {ncu_pid} (their processes: "
                             f"{', '.join(map(str, ncu_pids)) or 'none'})")
    for spec in _window_specs(window):
        if spec.get("pid") is not None and int(spec["pid"]) not in timeline_pids:
            raise InputError(f"a window names process {spec['pid']}, which the timeline {timeline_dir} does not have "
                             f"(its processes: {', '.join(map(str, timeline_pids)) or 'none'})")
    start = time.perf_counter()
    ranges_path = Path(timeline_dir) / "ranges.parquet"
    ranges = read_parquet_file(ranges_path, "the timeline ranges table", "run 'opprof timeline' first",
                               ("pid", "name", "start_ns", "end_ns")) if ranges_path.exists() else None
    matched, diagnostics = match_invocations(kernels, ncu, window, process_map, ranges)
    counters = diagnostics["counters"]
    stage_done(f"matched {len(kernels):,} timeline kernels with {len(ncu):,} ncu rows "
               f"({counters['with_counters']:,} with counters, {counters['refused']:,} refused)", start)
    if window and "sources" in window:
        _check_replay_windows(window["sources"], matched, diagnostics)
    if kernel_layers_path is not None:
        kernel_layers = read_parquet_file(kernel_layers_path, "a kernel_layers table", "run 'opprof classify' first",
                                          ("kernel_id", "layer_class", "position"))
        matched, diagnostics["broadcast"] = broadcast_to_instances(matched, kernels, kernel_layers)
        _count_broadcast(diagnostics, matched)
    else:  # every kernel measured itself (DESIGN.md §3: the column is part of the table either way)
        matched.insert(matched.columns.get_loc("ncu_source") + 1, "counters_from", matched["kernel_id"].to_numpy())
    diagnostics["ncu_files"] = [str(p) for p in ncu_paths]
    diagnostics["units"] = units
    diagnostics["timeline"] = matched.attrs["timeline"] = timeline_digest(kernels)
    write_parquet_atomic(matched, out_metrics)
    write_json(out_diagnostics, diagnostics)
    return matched, diagnostics


def _count_broadcast(diagnostics: dict, counters: pd.DataFrame) -> None:
    """After the layer-class broadcast: ``counters.with_counters`` counts the kernels the written table holds
    (measured or filled), ``counters.from_layer_class`` the filled ones; a kernel whose class representative's
    kernel differs in launch configuration (``layer_config_mismatch``) and that has no counters of its own is
    counted as refused, with its reason, so the console line and the reports say what the file holds."""
    from .matching.diagnostics import REFUSED

    summary = diagnostics["counters"]
    own = counters["kernel_id"] == counters["counters_from"]
    have = set(counters["kernel_id"].astype("int64").tolist())
    summary["from_layer_class"] = int((~own).sum())
    summary["with_counters"] = len(have)
    refused_broadcast = counters.attrs.pop("broadcast_refused", [])
    diagnostics["broadcast_refused"] = refused_broadcast
    refused = {int(k["kernel_id"]): k["reason"] for k in diagnostics.get("timeline_only_kernels", [])
               if k.get("reason") in REFUSED and int(k["kernel_id"]) not in have}
    refused.update({e["kernel_id"]: e["reason"] for e in refused_broadcast
                    if e["reason"] == "layer_config_mismatch" and e["kernel_id"] not in refused})
    summary["refused"] = len(refused)
    summary["refused_reasons"] = dict(sorted(Counter(refused.values()).items()))
    summary["not_measured"] = int(summary["kernels"]) - len(have) - len(refused)


def _check_replay_windows(sources: dict, matched: pd.DataFrame, diagnostics: dict) -> None:
    """Our own replays must profile exactly the planned kernels: a replay that profiled others (the
    launch window shifted: launches counted that the timeline does not have) would attach a neighbour's
    counters to a kernel. Unplanned ncu rows, planned kernels left without counters or a name
    disagreement the alignment could not explain fail the stage. Kernels refused as ``order_ambiguous``
    (CUDA-graph nodes that ran in another order on several streams) are not a shifted window: they stay
    visible as refusals.

    Raises:
        InputError: naming the class, the counts and the first disagreement.
    """
    from .matching.windows import source_window

    got = set(matched["kernel_id"].astype("int64")) if len(matched) else set()
    problems = []
    sources = {cls: win for cls, win in sources.items() if (win or {}).get("kernel_ids") is not None}
    if not sources:  # declared launch windows of imported files: refusals are reported, not fatal
        return
    unordered = {k["kernel_id"] for k in diagnostics.get("timeline_only_kernels", [])
                 if k.get("reason") == "order_ambiguous"}
    for cls, win in sorted(sources.items()):
        planned = set(int(k) for k in (win or {}).get("kernel_ids") or [])
        missing = planned - got - unordered
        extra = [r for r in diagnostics.get("ncu_only_rows", []) if r.get("reason") != "order_ambiguous"
                 and source_window({cls: True}, r.get("source"))]
        if missing or extra:
            problems.append(f"ncu file {cls}: {len(planned) - len(planned - got)} of {len(planned)} planned kernels "
                            f"matched, {len(extra)} profiled kernel(s) not planned")
    if problems or diagnostics.get("name_disagreements"):
        first = (diagnostics.get("name_disagreements") or [None])[0]
        raise InputError("the ncu files with a kernel_ids window (our replays' windows) did not profile exactly "
                         "those kernels (" + "; ".join(problems or ["names disagree"])
                         + (f"; first disagreement: {first}" if first else "") + "): the launch window is shifted "
                         "(the replayed run launched other kernels than the timeline, e.g. autotuning or a different "
                         "input); counters are not attached: recapture, or check the replay's ncu/{cls}.replay.json")


def read_replay_records(paths: list[Path]) -> list[dict]:
    """The ``ncu/{cls}.replay.json`` files of the ncu replays (:func:`operator_profiler.ncu.replay.run_replay`)."""
    records = []
    for path in paths:
        record = read_json_file(Path(path), "an ncu replay record", "run the replay_ncu rule (GPU) first", expect=dict)
        for key in ("class", "window", "wall_s"):
            if key not in record:
                raise InputError(f"{path}: no {key!r} in this replay record; re-run the replay_ncu rule for this class")
        records.append(record)
    return records


def replay_window(paths: list[Path]) -> dict:
    """The matching window of the classes' ncu replays: ``{"sources": {cls: {"kernel_ids": [...]}}}``."""
    from .ncu.replay import match_window

    return match_window({r["class"]: r for r in read_replay_records(paths)})
