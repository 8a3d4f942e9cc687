"""File-level stage runners: read a stage's input files, call the library, write its outputs.

The Snakemake scripts and the ``opprof`` CLI both call these, so a stage behaves the same inside and
outside the workflow. Every writer is atomic (temp file + rename) so a failing stage leaves no
partial output.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .files import (
    InputError,
    read_json_file,
    write_json,
    write_parquet_atomic,
    write_text_atomic,
    writes_in_background,
)
from .progress import stage_done

if TYPE_CHECKING:  # annotations only: each function imports what it runs (see the module docstring)
    import pandas as pd

    from .attribution import nvtx
    from .results import ReportPaths
    from .timeline import model as timeline_model

log = logging.getLogger(__name__)


def _read_counts(timeline: timeline_model.Timeline) -> str:
    events = sum((timeline.diagnostics.get("event_categories") or {}).values())
    return (f"{events:,} events, " if events else "") + (
        f"{len(timeline.kernels):,} kernels, {len(timeline.launches):,} launches, {len(timeline.ranges):,} ranges")


def is_nsys(kernels: pd.DataFrame) -> bool:
    """Whether a timeline's kernels came from an nsys export (source column, DESIGN.md §3)."""
    return bool(len(kernels)) and bool((kernels["source"] == "nsys").all())


def load_fusion_map_checked(debug_dir: Path) -> pd.DataFrame:
    """The fusion map of an Inductor debug directory; an error when it holds no compiled graph, a warning when
    none of its call sites has a module path (:func:`inductor.load_fusion_map`).

    Raises:
        InductorArtifactError: no ``output_code.py`` anywhere under ``debug_dir``.
    """
    from .attribution import inductor

    debug_dir = Path(debug_dir)
    if not debug_dir.is_dir():
        raise inductor.InductorArtifactError(
            f"{debug_dir}: no such folder; pass the folder torch.compile wrote with TORCH_COMPILE_DEBUG=1 (its "
            "torchinductor/ or a parent of it)")
    if not inductor.find_graph_dirs(debug_dir):
        raise inductor.InductorArtifactError(
            f"{debug_dir}: no Inductor debug directory (no output_code.py) found; pass the folder "
            "torch.compile wrote with TORCH_COMPILE_DEBUG=1 (its torchinductor/ or a parent of it)"
        )
    fusion = inductor.load_fusion_map(debug_dir)
    if len(fusion) and not fusion["module_paths"].map(len).any():
        log.warning("%s: no compiled kernel has a module path (no opprof_module_paths.json beside the graphs, and no "
                    "TORCH_TRACE log under the folder that names their frames): their layers read unknown; run with "
                    "TORCH_COMPILE_DEBUG=1 and pass the torch_compile_debug folder holding tlparse/", debug_dir)
    return fusion


def build_fusion_map(debug_dir: Path, out: Path) -> pd.DataFrame:
    """The fusion map of ``debug_dir`` with each generated kernel's work (``work_*`` columns) -> ``out``."""
    from .attribution import inductor
    from .work.fused_kernels import with_fused_work

    fusion = load_fusion_map_checked(debug_dir)
    attrs = dict(fusion.attrs)
    fusion = with_fused_work(fusion, inductor.find_graph_dirs(Path(debug_dir)))
    fusion.attrs.update(attrs)  # the layers a TORCH_TRACE log shows (inductor.load_fusion_map), kept in the file
    write_parquet_atomic(fusion, out)
    return fusion


def work_files(timeline_dir: Path, attribution_path: Path, out: Path, fusion_map_path: Path | None = None,
               kineto_dir: Path | None = None, shapes_trace: Path | None = None) -> pd.DataFrame:
    """Analytic work (FLOPs, ideal bytes) of every attributed kernel -> ``out`` (work/kernels.parquet).

    Reads the timeline's ranges (their recorded input shapes), the attribution (which call or fused call site
    each kernel belongs to) and, for compiled workloads, the fusion map's ``work_*`` columns; with an nsys
    timeline, ``kineto_dir`` is the torch.profiler run's timeline (the op ranges with shapes); ``shapes_trace``:
    the capture's shapes iteration (``capture/shapes.kineto.json.gz``) for a timeline recorded without shapes."""
    from . import results
    from .timeline import kineto
    from .work.assign import kernel_work

    t0 = time.perf_counter()
    kernels, ranges = read_timeline(timeline_dir)
    attribution = results.read(results.ATTRIBUTION, attribution_path)
    if len(attribution) != len(kernels) or not attribution["kernel_id"].isin(kernels["kernel_id"]).all():
        raise InputError(f"{attribution_path} does not describe the timeline in {timeline_dir}: {len(attribution):,} "
                         f"attributed kernels, {len(kernels):,} in the timeline; pass the attribution written for it")
    merged = attribution[["kernel_id", "operator", "operator_range_id", "evidence", "duration_ns"]].merge(
        kernels[["kernel_id", "range_id", "parent_kernel_id"]], on="kernel_id", how="left")
    fusion = _read_fusion_map(fusion_map_path) if fusion_map_path else None
    kineto_ranges = read_timeline(kineto_dir)[1] if kineto_dir else None
    shapes_ranges = kineto.read_kineto(Path(shapes_trace)).ranges if shapes_trace else None
    work = kernel_work(merged, ranges, fusion, kineto_ranges, shapes_ranges)
    write_parquet_atomic(work, out)
    known = work["flops"].notna()
    stage_done(f"work: {int(known.sum()):,} of {len(work):,} kernels with known FLOPs", t0)
    return work


#: Timeline columns the attribution never reads (the matching's kernel names, the nsys reader's own record of the
#: export's ids and types): ``opprof attribute`` leaves them unread, 1M kernels and 2M ranges: 0.1 GB less held.
NOT_ATTRIBUTED = {"kernels": ("mangled_name", "short_name", "graph_id", "gpu_id"),
                  "ranges": ("end_tid", "sizes", "event_type", "domain_id")}

#: Timeline string columns of few distinct values, read as the readers hold them in memory: categoricals (1M kernels
#: and 2M ranges: 0.15 GB less than a string per row).
FEW_VALUES = {"kernels": ("activity", "source", "launch_api", "grid", "block"), "ranges": ("domain", "kind")}


def read_timeline(timeline_dir: Path, omit: dict[str, tuple[str, ...]] | None = None,
                  categorical: dict[str, tuple[str, ...]] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``kernels.parquet`` and ``ranges.parquet`` of a timeline folder; ``omit``: per table, columns not to read
    (:data:`NOT_ATTRIBUTED`); ``categorical``: per table, string columns read as categoricals (:data:`FEW_VALUES`)."""
    from . import results
    from .heap import release_free_memory

    timeline_dir = Path(timeline_dir)
    omit, categorical = omit or {}, categorical or {}
    hint = f"write the timeline first: opprof timeline (--kineto TRACE | --nsys REPORT) --out {timeline_dir}"
    kernels = results.read(results.KERNELS, timeline_dir / "kernels.parquet", hint=hint,
                           omit=omit.get("kernels", ()), categorical=categorical.get("kernels", ()))
    ranges = results.read(results.RANGES, timeline_dir / "ranges.parquet", hint=hint, omit=omit.get("ranges", ()),
                          categorical=categorical.get("ranges", ()))
    _check_range_tree(ranges, timeline_dir / "ranges.parquet")
    # The parquet decoding's buffers, freed but resident (1M kernels, 2M ranges: 1.08 -> 0.75 GB), would be the
    # floor under the attribution's own peak.
    release_free_memory()
    return kernels, ranges


def _check_range_tree(ranges: pd.DataFrame, path: Path) -> None:
    """Raises InputError when ``range_id`` repeats, a ``parent_id`` chain runs in a cycle (the attribution walks
    up parents and would never stop), a ``parent_id`` names no range of the table (rows filtered out), or a
    ``depth`` is not its parent's plus one (ids renumbered): a hand-edited table. The readers number ranges so
    that a parent's id is below its children's, which rules out a cycle without the doubling check."""
    import numpy as np
    import pandas as pd

    from .errors import InputError
    from .timeline.nesting import parent_cycle, parent_rows

    fix = "ranges.parquet is written by opprof timeline: write it again rather than editing it"
    ids = ranges["range_id"].to_numpy(dtype=np.int64)
    # Ids in ascending order (as the readers write them) repeat none; only other tables are hashed (2M ranges: 0.3 GB).
    ascending = len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())
    repeated = np.zeros(len(ids), dtype=bool) if ascending else pd.Index(ids).duplicated()
    if repeated.any():
        raise InputError(f"{path}: range_id {int(ids[repeated][0])} names more than one range "
                         f"({int(repeated.sum())} repeated ids); {fix}")
    has = ranges["parent_id"].notna().to_numpy()
    parent_ids = ranges["parent_id"][has].astype("int64").to_numpy()
    parent = parent_rows(ids, ranges["parent_id"])  # (-1: a parent not in the table)
    if not (parent_ids < ids[has]).all():  # (the readers' numbering: every chain descends, no cycle possible)
        row = parent_cycle(parent)
        if row is not None:
            raise InputError(f"{path}: the parent_id chain of range_id {int(ids[row])} never ends (the parents form "
                             f"a cycle); {fix}")
    missing = np.flatnonzero(has & (parent < 0))
    if len(missing):
        # The attribution climbs from a range to its parents: above a missing one it would find nothing and
        # name no operator, or a wrong one, without a word.
        raise InputError(f"{path}: parent_id {int(ranges['parent_id'].iloc[missing[0]])} of range_id "
                         f"{int(ids[missing[0]])} names no range of the table ({len(missing)} range(s) with a missing "
                         f"parent: rows were filtered out); {fix}")
    depth = ranges["depth"].to_numpy(dtype=np.int64)
    expected = np.where(parent >= 0, depth[np.maximum(parent, 0)] + 1, 0)
    wrong = np.flatnonzero(depth != expected)
    if len(wrong):
        raise InputError(f"{path}: range_id {int(ids[wrong[0]])} has depth {int(depth[wrong[0]])} but its parent_id "
                         f"gives {int(expected[wrong[0]])} ({len(wrong)} range(s) disagree: ids or parents were "
                         f"edited); {fix}")


NSYS_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")


NSYS_ONLY_OUTPUTS = ("nvtx_gpu_projection.parquet",)


TIMELINE_OUTPUTS = ("kernels.parquet", "launches.parquet", "ranges.parquet", "gpu_activities.parquet",
                    "diagnostics.json", *NSYS_ONLY_OUTPUTS)


def export_timeline(trace: Path, out_dir: Path, kind: str | None = None, expect_gpu: bool = False) -> timeline_model.Timeline:
    """:func:`_export_timeline` (its docstring says what is written), all or nothing: the timeline files an
    earlier run left in ``out_dir`` are removed first (a failed run must not leave another trace's tables
    looking current), and the ones written before an error or an interrupt are removed (with ``out_dir``
    itself when this call created it and it is left empty)."""
    out_dir = Path(out_dir)
    created = not out_dir.exists()

    def clear() -> None:
        for name in TIMELINE_OUTPUTS:
            (out_dir / name).unlink(missing_ok=True)

    if not created and out_dir.is_dir():
        clear()
    try:
        return _export_timeline(trace, out_dir, kind, expect_gpu)
    except BaseException:
        if out_dir.is_dir():
            clear()
            if created and not any(out_dir.iterdir()):
                out_dir.rmdir()
        raise


def _export_timeline(trace: Path, out_dir: Path, kind: str | None = None, expect_gpu: bool = False) -> timeline_model.Timeline:
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
    from .attribution import nvtx
    from .heap import release_free_memory
    from .timeline import kineto
    from .timeline import model as timeline_model
    from .timeline import nsys

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
        timeline.diagnostics["gpu_activities"] = timeline_model.gpu_activity_summary(timeline.activities, timeline.ranges)
        # The timeline tables are written on a second thread while this one computes the GPU projection (both only
        # read the tables). 1M kernels, 2M ranges, 2 cores: this phase 2.7 -> 1.6 s, its peak RSS no higher than the
        # read's (tables.ROW_GROUP_ROWS keeps the writer's Arrow copies small).
        with writes_in_background() as submit:
            submit(nsys.write_nsys_timeline, timeline, out_dir)
            projection = nvtx.gpu_projection(timeline.kernels, timeline.ranges)
            projected = len(projection)
            release_free_memory()  # (what the projection freed)
            write_parquet_atomic(projection, Path(out_dir) / "nvtx_gpu_projection.parquet")
            del projection
            release_free_memory()
        stage_done(f"wrote the timeline tables and the GPU projection of {projected:,} ranges to {out_dir}", start)
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
    timeline.diagnostics["gpu_activities"] = timeline_model.gpu_activity_summary(timeline.activities, timeline.ranges)
    timeline_model.write_timeline(timeline, out_dir)
    write_json(Path(out_dir) / "diagnostics.json", timeline.diagnostics)
    stage_done(f"wrote the timeline tables to {out_dir}", start)
    for stale in NSYS_ONLY_OUTPUTS:  # from an nsys timeline written to the same folder before
        (Path(out_dir) / stale).unlink(missing_ok=True)
    return timeline


def _name_launch_operators(timeline: timeline_model.Timeline) -> None:
    """Name the op around each kernel launch that has no kernel record (docs/field-cases.md C04): its device
    time is unknown, which the report says per operator instead of showing 0."""
    import pandas as pd

    from .attribution.correlation import enclosing_ops

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
    ``out_plans_dir``, one ncu replay plan per class (:func:`operator_profiler.ncu.plan.plan_replay`;
    written here, by the checkpoint, so that an unchanged class keeps a byte-identical plan and the GPU
    replay depends on nothing else the timeline export rewrites).

    ``fusion_map`` (a compiled workload's ``fusion_map.parquet``): kernels no layer range claims (a whole-model
    compile has none inside the compiled region) take the layer instance of their FX nodes
    (:func:`operator_profiler.layers.kernel_layers`); on an nsys timeline through the torch.profiler run of the
    same program (``kineto_timeline``, paired by invocation order), else by kernel name (generated kernels only).
    When ``layers_json`` names no layer and the fusion map was built from a debug dir with a TORCH_TRACE log,
    the layer instances that log shows are used (``fusion_map.attrs["layers"]``, with a warning).
    """
    from . import layers as layer_classes
    from . import results

    start = time.perf_counter()
    kernels, ranges = read_timeline(timeline_dir)
    hint = ("it is written by the capture (capture/layers.json); for a trace captured elsewhere pass a "
            "file containing [] (no layers)")
    layers = results.read(results.LAYERS, layers_json, hint=hint)
    for index, entry in enumerate(layers):
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not isinstance(entry.get("class"), str):
            raise InputError(f"{layers_json}: entry {index} is not {{\"path\": str, \"class\": str, ...}}: {entry!r}; {hint}")
    fusion = _read_fusion_map(fusion_map)
    if not layers and fusion is not None and fusion.attrs.get("layers"):
        # a debug dir captured outside the workflow: the layer instances its TORCH_TRACE log shows
        layers = list(fusion.attrs["layers"])
        log.warning("%s names no layer: using the %d layer instances the fusion map's TORCH_TRACE log shows (%s; "
                    "children of a module list with identical parameter shapes)", layers_json, len(layers),
                    ", ".join(entry["path"] for entry in layers))
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
        from .ncu.plan import write_plans

        write_plans(kernels, kernel_layers, classes, out_plans_dir)
    return classes


def _read_fusion_map(fusion_map: Path | pd.DataFrame | None) -> pd.DataFrame | None:
    """A fusion map given as a ``fusion_map.parquet`` path (read and checked) or a loaded table; None stays None."""
    import pandas as pd

    from . import results

    if fusion_map is None or isinstance(fusion_map, pd.DataFrame):
        return fusion_map
    return results.read(results.FUSION_MAP, Path(fusion_map), hint="write it with: opprof fusion-map --inductor-dir DIR --out FILE", columns=("graph", "call_index", "profiler_name"))


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


def _check_run_counts(runs: list[Path], kernels: pd.DataFrame, workload: dict | None = None) -> dict[str, int | None]:
    """Kernel counts of the workload's runs: each run.json's ``measured_kernels`` (the harness's count, null
    under nsys), and for the first run (the one this timeline comes from) the timeline reader's count too.
    CPU runs are skipped (their "kernels" are compute calls, not launches). With ``workload`` (the config's), each
    run must have captured that workload: a capture copied in from another workload or config is refused."""
    from . import results

    counts: dict[str, int | None] = {}
    for i, path in enumerate(runs):
        run = results.read(results.RUN, Path(path), hint="run the capture rules")
        captured = run.get("workload")
        if isinstance(workload, dict) and isinstance(captured, dict):
            # keys both record (a capture of an older version lacks keys added since: not a difference)
            differ = sorted((k for k in set(captured) & set(workload) if captured[k] != workload[k]),
                            key=lambda k: (k not in ("kind", "factory"), k))  # what the model is, first
            if differ:
                raise InputError(
                    f"{path} is a capture of another workload than the config's ({', '.join(differ[:5])} differ: "
                    f"captured {', '.join(f'{k}={captured[k]!r}' for k in differ[:3])}; config "
                    f"{', '.join(f'{k}={workload[k]!r}' for k in differ[:3])}): the profile would not be of the "
                    f"configured workload; capture it again (delete {Path(path).parent}, or snakemake --forcerun "
                    "capture_timeline)")
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
                    kineto_timeline: Path | None = None, runs: list[Path] | None = None,
                    workload: dict | None = None) -> pd.DataFrame:
    """Attribution of every kernel of a timeline -> ``attribution/kernels.parquet``.

    A Kineto timeline runs paths (a) correlation and (c) the fusion map; an nsys timeline runs path
    (b) NVTX enclosure with ``nvtx_options``, plus (a) and (c) from ``kineto_timeline`` (the
    timeline folder of a torch.profiler run of the same program, paired by invocation order; its
    summary goes to ``pairing.json`` beside ``out``). ``fusion_map`` is a ``fusion_map.parquet``
    path or an already loaded fusion map.

    ``runs``: the run.json of every capture of the workload, this timeline's first (``capture/run.json``,
    then ``capture/kineto_run.json``): their kernel counts of the measured window must agree
    (:func:`check_kernel_counts`; the nsys count is the timeline reader's), else nothing is attributed; with
    ``workload`` (the config's) each must be a capture of that workload.

    Raises:
        InputError: unreadable inputs, tables from different timelines, a ``kineto_timeline``
            that is not a Kineto timeline, or runs with different kernel counts.
    """
    import pandas as pd

    from . import aggregate as agg
    from . import layers as layer_classes
    from . import tables
    from .attribution import nvtx
    from .attribution.merge import attribute, fusion_map_warning, merge_fusion_by_name, merge_kineto_run
    from .attribution.transfer import pairing_warnings
    from .heap import release_free_memory
    from .timeline import model as timeline_model

    start = time.perf_counter()
    kernels, ranges = read_timeline(timeline_dir, omit=NOT_ATTRIBUTED, categorical=FEW_VALUES)
    stage_done(f"read {len(kernels):,} kernels and {len(ranges):,} ranges", start)
    start = time.perf_counter()
    if runs:
        _check_run_counts([Path(r) for r in runs], kernels, workload)
    fusion = _read_fusion_map(fusion_map)
    kl = _kernel_layers_for(kernels, ranges, timeline_dir, kernel_layers, fusion)
    if is_nsys(kernels):
        result = nvtx.attribute_nvtx(kernels, ranges, kl, nvtx_options or nvtx.NvtxOptions())
        if kineto_timeline is not None:
            k_kernels, k_ranges = read_timeline(kineto_timeline)
            if is_nsys(k_kernels):
                raise InputError(f"{kineto_timeline} is an nsys timeline; --kineto-timeline takes the timeline "
                                 "folder of a torch.profiler run (opprof timeline --kineto TRACE --out DIR)")
            k_layers = layer_classes.kernel_layer_classes(k_kernels, k_ranges, [])
            kineto_result = attribute(k_kernels, k_ranges, k_layers, fusion)
            result, summary = merge_kineto_run(result, kernels, kineto_result, k_kernels)
            for warning in pairing_warnings(summary, kineto_timeline):
                log.warning("%s", warning)
            write_json(Path(out).parent / "pairing.json", summary)
        elif fusion is not None and len(fusion):
            result = merge_fusion_by_name(result, kernels, fusion)
    else:
        if kineto_timeline is not None:
            log.warning("--kineto-timeline is ignored: the timeline %s is itself a Kineto timeline", timeline_dir)
        result = attribute(kernels, ranges, kl, fusion)
    if fusion is not None and len(fusion) and (warning := fusion_map_warning(result, fusion, timeline_dir)):
        log.warning("%s", warning)
    # The train-step phase (forward/backward/optimizer) from our phase ranges by launch time on the process.
    phases = pd.Series(timeline_model.kernel_phases(kernels, ranges), index=kernels["kernel_id"].astype("int64").to_numpy())
    result["phase"] = phases.reindex(result["kernel_id"].astype("int64").to_numpy()).to_numpy(dtype=object)
    disagreements = agg.external_id_disagreements(result)
    if disagreements["count"]:
        log.warning("%d of %d checked kernels carry a Kineto External id that names another op than the one around "
                    "their launch (their operator stays the launch's; coverage.json external_id_disagreements "
                    "lists examples): the trace's op ids are not to be trusted", disagreements["count"],
                    disagreements["checked"])
    stage_done(f"attributed {len(result):,} kernels ({int(result['operator'].notna().sum()):,} to an operator)", start)
    result = _with_membership(result, kl)
    # The timeline's tables are done with: freed before the result is converted for writing, which was the peak of
    # a big capture's `opprof attribute` (docs/DESIGN.md, "The commands' peak RSS, cut").
    del kernels, ranges, kl
    release_free_memory()
    tables.write_table(result, tables.ATTRIBUTION, out)
    return result


def _with_membership(result: pd.DataFrame, kl: pd.DataFrame) -> pd.DataFrame:
    """The kernel_layers ``membership``/``layers_spanned`` as extra attribution columns (how each kernel's layer
    was decided, the instances a cross-layer kernel spans; DESIGN.md §3), for coverage.json and the report."""
    import numpy as np

    from .layers import NO_SPANS

    if "membership" not in kl:
        return result
    by_id = kl.set_index(kl["kernel_id"].astype("int64"))
    ids = result["kernel_id"].astype("int64").to_numpy()
    out = result.copy(deep=False)  # (new columns only: the result's own are not copied, 1M kernels: 0.2 GB)
    out["membership"] = by_id["membership"].reindex(ids).to_numpy(dtype=object)
    spans = by_id["layers_spanned"].reindex(ids).to_numpy(dtype=object)
    # Most kernels span no instance: they share one empty list (layers.NO_SPANS, never mutated); a fresh list per
    # kernel took 0.9 s of `opprof attribute` at 1 M kernels, and testing each kernel's entry 0.65 s: only the
    # entries that are not that list already are looked at.
    shown = np.empty(len(spans), dtype=object)
    shown.fill(NO_SPANS)
    for i in [i for i, v in enumerate(spans) if v is not NO_SPANS]:
        v = spans[i]
        if isinstance(v, (list, tuple, np.ndarray)) and len(v):
            shown[i] = list(v)
    out["layers_spanned"] = shown
    return out


def _kernel_layers_for(kernels: pd.DataFrame, ranges: pd.DataFrame, timeline_dir: Path,
                       kernel_layers: Path | None, fusion: pd.DataFrame | None = None) -> pd.DataFrame:
    """The kernel_layers table attribution uses: ``kernel_layers`` (from ``opprof classify``), else derived here:
    the timeline's layer ranges, and for a fusion map loaded from a debug dir captured outside the workflow the
    layer instances its TORCH_TRACE log shows (``fusion.attrs["layers"]``, :func:`.attribution.torch_trace.
    infer_layers`), each compiled kernel placed by its FX nodes."""
    from . import layers as layer_classes
    from . import results

    if kernel_layers is None:
        inferred = list(fusion.attrs.get("layers") or []) if fusion is not None else []
        if inferred:
            return layer_classes.kernel_layer_classes(kernels, ranges, inferred, fusion_map=fusion)
        return layer_classes.kernel_layer_classes(kernels, ranges, [])
    kl = results.read(results.KERNEL_LAYERS, kernel_layers)
    if len(kl) != len(kernels) or not kl["kernel_id"].astype("int64").sort_values().reset_index(drop=True).equals(
            kernels["kernel_id"].astype("int64").sort_values().reset_index(drop=True)):
        raise InputError(f"{kernel_layers} lists {len(kl)} kernels, the timeline {timeline_dir} {len(kernels)}: they "
                         f"come from different timelines; run: opprof classify --timeline {timeline_dir} ...")
    return kl


def aggregate_files(attribution_path: Path, instances_path: Path, classes_path: Path, options: dict, out_operators_parquet: Path, out_operators_csv: Path, out_modules: Path,
                    out_layer_classes: Path, out_coverage: Path, counters_path: Path | None = None,
                    matching_path: Path | None = None, out_phases: Path | None = None,
                    work_path: Path | None = None, ceilings_path: Path | None = None) -> None:
    """Operators, modules, layer classes and coverage (and, with ``out_phases``, the operators per train-step
    phase: :func:`operator_profiler.aggregate.phases_table`, empty for inference); with ``counters_path``
    (``matched/kernel_metrics.parquet``) the catalog's hardware metrics and a bottleneck label per
    operator and module, and with ``matching_path`` (``matched/diagnostics.json``) the kernels whose
    counters the matching refused, per reason and key (``coverage.json`` ``counters``); with ``work_path``
    (``work/kernels.parquet``) the work columns per operator, and with ``ceilings_path`` (``ceilings.json``) their
    roofline (:mod:`operator_profiler.roofline`; ``coverage.json`` ``work``)."""
    from . import aggregate as agg
    from . import results

    hint = "write it with opprof attribute / opprof classify (see opprof --help)"
    attribution = results.read(results.ATTRIBUTION, attribution_path, hint=hint)
    instances = results.read(results.INSTANCES, instances_path, hint=hint)
    classes = results.read(results.CLASSES, classes_path, hint=hint)
    _check_same_timeline(attribution, attribution_path, instances, instances_path)
    matching = results.read(results.MATCHING, Path(matching_path), hint="write it with: opprof match ...") if matching_path is not None else None
    if matching is not None:
        results.check_matched_on(matching.get("timeline"), attribution, matching_path, attribution_path)
    operators = agg.operators_table(attribution, options["per_iteration"])
    modules = agg.modules_table(attribution, options["per_iteration"])
    counters = None
    if counters_path is not None:
        from .ncu.catalog import load_catalog

        counters = results.read(results.COUNTERS, counters_path)
        results.check_matched_on(counters.attrs.get("timeline"), attribution, counters_path, attribution_path)
        catalog = load_catalog()
        operators = agg.with_counters(operators, attribution, counters, "operator", catalog)
        modules = agg.with_counters(modules, attribution, counters, "module", catalog)
        layer_table = agg.with_counters(agg.layer_classes_table(instances, classes, options["per_iteration"]),
                                        attribution, counters, "layer_class", catalog)
    else:
        layer_table = agg.layer_classes_table(instances, classes, options["per_iteration"])
    work = ceilings = None
    if work_path is not None:
        from . import roofline

        work = results.read(results.WORK, work_path)
        if len(work) != len(attribution) or not work["kernel_id"].isin(attribution["kernel_id"]).all():
            raise InputError(f"{work_path} does not describe the kernels of {attribution_path} ({len(work):,} vs "
                             f"{len(attribution):,} kernels); run opprof work for this attribution")
        ceilings = results.read(results.CEILINGS, ceilings_path) if ceilings_path is not None else None
        if ceilings is not None:
            roofline.check_ceilings(ceilings, str(ceilings_path))
        operators = roofline.with_roofline(roofline.with_work(operators, attribution, work), ceilings)
        if counters is not None:  # analytic vs measured (ncu): DRAM bytes and FP FLOPs per operator
            operators = operators.merge(roofline.measured_vs_analytic(attribution, work, counters, catalog),
                                        on="operator", how="left")
    write_parquet_atomic(operators, out_operators_parquet)
    if out_phases is not None:
        write_parquet_atomic(agg.phases_table(attribution), out_phases)
    write_parquet_atomic(modules, out_modules)
    write_parquet_atomic(layer_table, out_layer_classes)
    write_text_atomic(out_operators_csv, operators.to_csv(index=False))
    summary = agg.coverage(attribution, counters_collected=counters is not None, device=options.get("device"),
                           counters=counters, matching=matching)
    summary["timeline"] = results.timeline_digest(attribution)  # the report checks a matching's against it
    if work is not None:
        summary["work"] = roofline.work_summary(attribution, work, ceilings,
                                                str(ceilings_path) if ceilings_path is not None else None)
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


def report_files(workload: str, paths: ReportPaths, options: dict, out: Path) -> None:
    """The Markdown report of ``paths`` (:class:`operator_profiler.results.ReportInputs`)."""
    from .report import markdown as report_md
    from .results import ReportInputs

    inputs = ReportInputs.read(paths)
    write_text_atomic(out, report_md.render_markdown(workload, inputs, options["top_operators"]))


def report_html_files(workload: str, paths: ReportPaths, options: dict, out: Path) -> None:
    """``report.html``, self-contained (:func:`operator_profiler.report.html.render_html`), with the share of kernel
    time with counters when ``paths`` has the attribution and the matched counters (CUDA). Written atomically."""
    from .report import html as report_html
    from .results import ReportInputs

    out = report_html.html_output(out, results=Path(paths.operators).parent)
    inputs = ReportInputs.read(paths, counters_time=True)
    write_text_atomic(out, report_html.render_html(workload, inputs, options["top_operators"]))


def compare_files(folder_a: Path, folder_b: Path, out: Path, force: bool = False, top: int | None = None) -> pd.DataFrame:
    """``compare.html``: the profile in ``folder_b`` against the one in ``folder_a`` (two results folders of
    one workload, e.g. before and after a change; :func:`operator_profiler.report.html.render_compare`).
    Returns the per-operator comparison table (:func:`operator_profiler.report.html.compare_table`); ``top``: the
    largest changes plotted (default ``report_html.TOP_BARS``). Nothing is written on an error.

    Raises:
        InputError: a folder that is not a results folder, or two different workloads (model kind/factory of
            their run.json, or the folder names without one) unless ``force``.
    """
    from .report import html as report_html
    from .report import markdown as report_md
    from .results import ReportInputs, ReportPaths

    out = report_html.html_output(out, "compare.html")
    profiles = []
    for folder in (Path(folder_a), Path(folder_b)):
        found = ReportPaths.of_folder(folder)
        inputs = ReportInputs.read(ReportPaths(found.coverage, found.operators, found.modules, found.layer_classes,
                                               run=found.run, clocks=found.clocks))
        name = folder.resolve().name
        profiles.append({"folder": str(folder), "workload": name, "run": inputs.run, "clocks": inputs.clocks,
                         "coverage": inputs.coverage, "operators": inputs.operators})
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


def advise_files(folder: Path, out: Path, catalog: Path | None = None, shapes_trace: Path | None = None,
                 workload: str | None = None) -> dict:
    """``advice.json`` for the profile in results folder ``folder`` (operators.parquet, attribution/kernels.parquet,
    capture/run.json, coverage.json; ``shapes_trace``: the capture's shapes iteration, for the convolutions' input
    layouts) by the rule catalog ``catalog`` (default: the package's optimize/catalog.yaml). Written atomically;
    returns its content. Raises ConfigError for a bad catalog, InputError for a missing or wrong profile file."""
    from .optimize import advisor
    from .transforms.vocabulary import machine_features

    t0 = time.perf_counter()
    catalog = Path(catalog) if catalog else advisor.CATALOG
    rules = advisor.load_catalog(catalog)
    profile = advisor.load_profile(Path(folder), shapes_trace)
    advice = advisor.advise(profile, rules, machine_features(profile.device), workload or Path(folder).resolve().name,
                            catalog)
    write_json(out, advice)
    stage_done(f"advice: {len(advice['advice'])} offered, {len(advice['not_offered'])} not offered; advised "
               f"{' + '.join(advice['advised_changes']) or 'no change'}", t0)
    return advice


def optimize_report_files(workload: str, base_folder: Path, variant_folder: Path, advice_path: Path,
                          verification_path: Path, out: Path) -> None:
    """``optimize/report.html`` (report/optimize_page.py) and ``optimize/compare.html`` beside it (the base profile
    against the advised variant's, :func:`compare_files`). Raises InputError for a missing or wrong input."""
    from . import results
    from .report import markdown as report_md
    from .report import optimize_page
    from .results import ReportInputs, ReportPaths

    out = Path(out)
    advice = read_json_file(Path(advice_path), "advice.json", "run the advise rule first", expect=dict)
    verification = read_json_file(Path(verification_path), "verification.json", "run the verify_variants rule first",
                                  expect=dict)
    compare = compare_files(Path(base_folder), Path(variant_folder), out.with_name("compare.html"), force=True)
    variant = ReportPaths.of_folder(variant_folder)
    variant_inputs = ReportInputs.read(ReportPaths(variant.coverage, variant.operators, variant.modules,
                                                   variant.layer_classes, run=variant.run))
    base = ReportPaths.of_folder(base_folder)
    base_inputs = ReportInputs.read(ReportPaths(base.coverage, base.operators, base.modules, base.layer_classes,
                                                run=base.run))
    kernels = results.read(results.ATTRIBUTION, Path(base_folder) / results.ATTRIBUTION.path)
    variant_kernels = results.read(results.ATTRIBUTION, Path(variant_folder) / results.ATTRIBUTION.path)
    iterations_a = report_md.measured_iterations(base_inputs.run, base_inputs.coverage)
    iterations_b = report_md.measured_iterations(variant_inputs.run, variant_inputs.coverage)
    pairs = optimize_page.rewrite_pairs((variant_inputs.run or {}).get("rewrites") or [], kernels, iterations_a,
                                        variant_inputs.operators, iterations_b,
                                        optimize_page.rewritten_layers(variant_inputs.run, kernels))
    nodes = optimize_page.node_groups(kernels, variant_kernels, iterations_a, iterations_b)
    write_text_atomic(out, optimize_page.render_optimize(workload, advice, verification, compare, pairs,
                                                         Path(variant_folder).name, variant_inputs.coverage, nodes))


def trace_files(timeline_dir: Path, attribution_path: Path, out: Path, counters_path: Path | None = None) -> dict:
    """``trace.json``: the timeline as a Chrome/Perfetto trace with each kernel's attribution (and
    matched counters) in its ``args`` (``trace_export.build_trace``); written atomically.

    Raises:
        InputError: a missing or wrong input table, or an attribution of another timeline.
    """
    from . import results
    from . import tables
    from .report import trace as trace_export

    timeline_dir = Path(timeline_dir)
    kernels, ranges = read_timeline(timeline_dir)
    launches_path = timeline_dir / "launches.parquet"
    launches = results.read(results.LAUNCHES, launches_path, hint="write the timeline with opprof "
                                 f"timeline --out {timeline_dir}", columns=tuple(tables.LAUNCHES.names)) if launches_path.is_file() else None
    attribution = results.read(results.ATTRIBUTION, attribution_path, hint=f"write it with: opprof attribute --timeline {timeline_dir} --out FILE", columns=tuple(tables.ATTRIBUTION.names))
    counters = results.read(results.COUNTERS, counters_path) if counters_path is not None else None
    if counters is not None:
        results.check_matched_on(counters.attrs.get("timeline"), kernels, counters_path, Path(timeline_dir))
    activities_path = timeline_dir / "gpu_activities.parquet"
    activities = results.read(results.ACTIVITIES, activities_path, hint="write the timeline "
                                   f"again with opprof timeline --out {timeline_dir}", columns=("kind", "start_ns", "end_ns")) if activities_path.is_file() else None
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

    import pandas as pd

    from .ncu.csv_reader import counters_table, export_report_csv, read_ncu_csv

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
        wide = counters_table(long, str(path))
        units.update(wide.attrs.get("units", {}))
        frames.append(wide)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    table.attrs = {"units": units}
    write_parquet_atomic(table, out)
    return table


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
    import pandas as pd

    from . import results
    from .matching import broadcast_to_instances, match_invocations
    from .matching.broadcast import count_broadcast

    for stale in (Path(out_metrics), Path(out_diagnostics)):  # a failed run must not leave an earlier run's answer
        stale.unlink(missing_ok=True)
    kernels = results.read(results.KERNELS, Path(timeline_dir) / "kernels.parquet", hint="run 'opprof timeline' first", columns=("kernel_id", "name", "match_key", "occurrence"), nullable_ints=False)
    frames, units, owner = [], {}, {}
    for path in ncu_paths:
        frame = results.read(results.NCU_COUNTERS, Path(path), hint="run 'opprof ncu' first", columns=("ncu_id", "name", "match_key"))
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
    ranges = results.read(results.RANGES, ranges_path, hint="run 'opprof timeline' first", columns=("pid", "name", "start_ns", "end_ns"), nullable_ints=False) if ranges_path.exists() else None
    matched, diagnostics = match_invocations(kernels, ncu, window, process_map, ranges)
    counters = diagnostics["counters"]
    stage_done(f"matched {len(kernels):,} timeline kernels with {len(ncu):,} ncu rows "
               f"({counters['with_counters']:,} with counters, {counters['refused']:,} refused)", start)
    if window and "sources" in window:
        _replay_windows_checked(window["sources"], matched, diagnostics)
    if kernel_layers_path is not None:
        kernel_layers = results.read(results.KERNEL_LAYERS, kernel_layers_path, hint="run 'opprof classify' first", columns=("kernel_id", "layer_class", "position"))
        matched, diagnostics["broadcast"] = broadcast_to_instances(matched, kernels, kernel_layers)
        count_broadcast(diagnostics, matched)
    else:  # every kernel measured itself (DESIGN.md §3: the column is part of the table either way)
        matched.insert(matched.columns.get_loc("ncu_source") + 1, "counters_from", matched["kernel_id"].to_numpy())
    diagnostics["ncu_files"] = [str(p) for p in ncu_paths]
    diagnostics["units"] = units
    diagnostics["timeline"] = matched.attrs["timeline"] = results.timeline_digest(kernels)
    write_parquet_atomic(matched, out_metrics)
    write_json(out_diagnostics, diagnostics)
    return matched, diagnostics


def replay_window(paths: list[Path]) -> dict:
    """The matching window of the classes' ncu replays: ``{"sources": {cls: {"kernel_ids": [...]}}}``."""
    from . import results
    from .ncu.plan import match_window

    return match_window({r["class"]: r for r in results.read_replay_records(paths)})


def _replay_windows_checked(sources: dict, matched: pd.DataFrame, diagnostics: dict) -> None:
    """:func:`operator_profiler.matching.windows.check_replay_windows`, its refusal as an :class:`InputError`."""
    from .matching.windows import check_replay_windows

    try:
        check_replay_windows(sources, matched, diagnostics)
    except ValueError as exc:
        raise InputError(str(exc)) from None


#: What ``opprof optimize`` needs in a finished profile's folder (the advise rule's inputs).
OPTIMIZE_NEEDS = ("capture/run.json", "operators.parquet", "attribution/kernels.parquet", "coverage.json")


#: What ``opprof optimize`` (and the workflow's verify_variants, optimize_report rules) write in
#: results/<workload>/optimize/: removed before a new run advises.
OPTIMIZE_OUTPUTS = ("verification.json", "report.html", "compare.html", "timing")


def finished_profile(folder: Path) -> dict:
    """The ``run.json`` of the finished profile in results folder ``folder``, checked for what ``opprof optimize``
    needs: the advise rule's inputs (:data:`OPTIMIZE_NEEDS`), the workload's config slice, the harness settings and
    the device it ran on, and a torch.profiler timeline (the variant is profiled in process with torch.profiler).
    Raises InputError (one line: what is missing and what to do)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--results {folder}: not a folder; pass results/<workload>/ of a finished profile")
    if not folder.is_dir():
        raise InputError(f"--results {folder}: no such folder; pass results/<workload>/ of a finished profile")
    missing = [name for name in OPTIMIZE_NEEDS if not (folder / name).is_file()]
    if missing:
        raise InputError(f"--results {folder}: not a finished profile ({', '.join(missing)} missing); run the "
                         "workflow for this workload first (snakemake --cores all)")
    run = read_json_file(folder / "capture/run.json", "run.json", "capture the workload again", expect=dict)
    lacks = [key for key, kind in (("workload", dict), ("harness", dict), ("versions", dict))
             if not isinstance(run.get(key), kind)]
    if not lacks and not isinstance(run["workload"].get("kind"), str):
        lacks.append("workload.kind")
    if not lacks and run["versions"].get("device") not in ("cpu", "cuda"):
        lacks.append("versions.device")
    if lacks:
        raise InputError(f"--results {folder}: capture/run.json lacks {', '.join(lacks)} (the workload's config "
                         "slice, the harness settings and the device it ran on): it was not written by this "
                         "version's capture; run the workflow for this workload again")
    if run.get("timeline", "torch") != "torch":
        raise InputError(f"--results {folder}: captured with {run['timeline']}; opprof optimize profiles the "
                         "variant with torch.profiler, whose profile would not compare: list the workload under "
                         "optimize.workloads and run the workflow")
    return run


#: The thread variables Snakemake sets to a job's ``threads`` (its shell's environment); the captures read
#: OMP_NUM_THREADS (capture/harness.py ``apply_threads``).
THREAD_ENV = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def thread_env(run: dict) -> dict[str, str | None]:
    """The thread environment a profile's capture ran under, from its run.json ``threads`` (``{"count",
    "requested", "source"}``): the recorded count in :data:`THREAD_ENV` (as Snakemake sets them for the job),
    or OMP_NUM_THREADS unset (None) when the capture ran at torch's default count. Empty when not recorded."""
    threads = run.get("threads") if isinstance(run.get("threads"), dict) else {}
    if threads.get("source") == "torch default":
        return {"OMP_NUM_THREADS": None}
    count = threads.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return dict.fromkeys(THREAD_ENV, str(count))
    return {}


def _run_job(rule: str, params: dict, files: dict, log: Path, env: dict[str, str | None] | None) -> None:
    """Run the workflow rule ``rule``'s job in its own Python process, as its Snakemake job does
    (``python -m operator_profiler.gpu_jobs RULE PARAMS FILES LOG``: a fresh process, so that Inductor's graph
    counters and torch's thread settings start as in the workflow), with ``env`` applied (None: unset).
    Raises CaptureError with the job's FAILED line (the log holds the rest)."""
    import json as _json
    import os
    import subprocess
    import sys

    from .errors import CaptureError

    environ = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    src = str(Path(__file__).resolve().parent.parent)
    environ["PYTHONPATH"] = os.pathsep.join([src] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    log.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "operator_profiler.gpu_jobs", rule, _json.dumps(params, sort_keys=True),
                           _json.dumps(files, sort_keys=True), str(log)], env=environ, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode == 130:
        raise KeyboardInterrupt
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        failed = next((line for line in reversed(lines) if "FAILED" in line or "interrupted" in line),
                      lines[-1] if lines else f"exit status {done.returncode}")
        raise CaptureError(f"{rule} of {files['wildcards']['workload']}: {failed.strip()} (log: {log})")


def profile_files(workload_name: str, workload: dict, harness: dict, device: str, out: Path, options: dict,
                  clocks_target: Path | None = None, ceilings: Path | None = None,
                  env: dict[str, str | None] | None = None) -> None:
    """Profile one workload into results folder ``out`` as the workflow's rules do on a torch.profiler timeline
    (same files, same stage functions): capture_timeline in its own process, as its Snakemake job runs (it also
    writes the Inductor debug output of the compile it profiles, inductor/debug/), with ``env``
    (:func:`thread_env`: the thread variables Snakemake gives the jobs); then, in this process, build_fusion_map
    (compiled workloads), export_timeline,
    classify_layers, attribute, compute_work, aggregate. The jobs' logs go to ``out``/logs/.
    ``options``: the config sections ``dedup``, ``nvtx``, ``aggregate`` (a validated config's); ``clocks_target``:
    clocks/target.json on CUDA (the base profile's); ``ceilings``: the machine's ceilings.json, when measured."""
    from .attribution.nvtx import NvtxOptions

    out = Path(out)
    cap = out / "capture"
    trace, shapes = cap / "timeline.kineto.json.gz", cap / "shapes.kineto.json.gz"
    clocks = str(clocks_target) if clocks_target else None
    _run_job("capture_timeline",
             {"workload": _dumps(workload), "harness": _dumps(harness), "device": device, "timeline": "torch",
              "timeline_requested": "torch"},
             {"wildcards": {"workload": workload_name}, "input": {"clocks": clocks},
              "output": {"trace": str(trace), "run": str(cap / "run.json"), "layers": str(cap / "layers.json"),
                         "clocks": str(cap / "clocks_applied.json"), "shapes": str(shapes),
                         "debug": str(out / "inductor" / "debug")}},
             out / "logs" / "capture_timeline.log", env)
    fusion = None
    if workload.get("compile"):
        fusion = out / "inductor" / "fusion_map.parquet"
        build_fusion_map(out / "inductor" / "debug", fusion)
    export_timeline(trace, out / "timeline", None, device == "cuda")
    layers = out / "layers"
    classify(out / "timeline", cap / "layers.json", layers / "instances.parquet", layers / "kernel_layers.parquet",
             layers / "classes.json", layers / "classes", options["dedup"]["verify"], layers / "replay", fusion)
    attribution = out / "attribution" / "kernels.parquet"
    attribute_files(out / "timeline", layers / "kernel_layers.parquet", fusion, attribution,
                    NvtxOptions.from_config(options["nvtx"]), None, [cap / "run.json"], workload)
    work_files(out / "timeline", attribution, out / "work" / "kernels.parquet", fusion_map_path=fusion,
               shapes_trace=shapes)
    aggregate_files(attribution, layers / "instances.parquet", layers / "classes.json",
                    {**options["aggregate"], "device": device}, out / "operators.parquet", out / "operators.csv",
                    out / "modules.parquet", out / "layer_classes.parquet", out / "coverage.json",
                    out_phases=out / "phases.parquet", work_path=out / "work" / "kernels.parquet",
                    ceilings_path=ceilings)


def _dumps(value) -> str:
    import json as _json

    return _json.dumps(value, sort_keys=True)


def variant_mismatch(variant_folder: Path, workload: dict, harness: dict, base_run: dict) -> str | None:
    """Why the profile in ``variant_folder`` is not the advised variant's (config slice ``workload``, profiled with
    the base profile's ``harness``, its recorded thread count and device, and this torch): one phrase, or None
    when its run.json matches (and it is finished: :func:`finished_profile`)."""
    try:
        run = finished_profile(variant_folder)
    except InputError as exc:
        return str(exc).split(": ", 1)[-1].split(";")[0]
    if run.get("workload") != workload:
        return "its workload slice is another (changes, compile or settings differ)"
    if run.get("harness") != harness:
        return "its harness settings differ from the base profile's"
    ours, theirs = base_run.get("threads") or {}, run.get("threads") or {}
    if (ours.get("count"), ours.get("requested")) != (theirs.get("count"), theirs.get("requested")):
        return (f"it ran at {theirs.get('count')} threads, the base profile at {ours.get('count')}")
    versions, base_versions = run.get("versions") or {}, base_run.get("versions") or {}
    for key in ("device", "device_name", "torch", "torch_git", "cuda_runtime"):
        if versions.get(key) != base_versions.get(key):
            return f"its {key} ({versions.get(key)}) is not the base profile's ({base_versions.get(key)})"
    return None


def optimize_folder(folder: Path, config: dict, catalog: Path | None = None, threads: int | None = None,
                    progress=None) -> dict:
    """``opprof optimize``: for the finished profile in results folder ``folder`` (results/<workload>/), what the
    workflow's optimize path does for a workload under ``optimize.workloads``: advise (``advice.json``), profile
    the advised variant into results/<workload>+<changes>/ (:func:`profile_files`, at the base profile's recorded threads; kept when
    its run.json is this variant's, else removed and profiled again),
    verify it (``optimize/verification.json``, with ``threads``, else ``config``'s harness.threads, else the
    profile's, else every usable CPU) and write ``optimize/report.html`` and ``optimize/compare.html``;
    ``progress``: called with one line per step. ``config``: a validated config (its ``optimize``,
    ``dedup``, ``nvtx``, ``aggregate`` sections and ``harness.threads``). Returns the verification record.
    Raises InputError (a folder that is not a finished profile), ConfigError, WorkloadError."""
    import json as _json

    from .optimize.verify import verify_variants_job
    from .transforms.variants import advised_variant, variant_workload

    progress = progress or (lambda line: None)
    folder = Path(folder)
    run = finished_profile(folder)
    name = folder.resolve().name
    workload, device = run["workload"], run["versions"]["device"]
    shapes = folder / "capture" / "shapes.kineto.json.gz"
    out = folder / "optimize"
    # The previous run's verification and pages describe the previous advice: gone before advice.json is
    # replaced, so that after a failure or Ctrl-C no file describes other advice than advice.json.
    removed = [entry for entry in OPTIMIZE_OUTPUTS if (out / entry).exists()]
    for entry in removed:
        if (out / entry).is_dir():
            shutil.rmtree(out / entry)
        else:
            (out / entry).unlink()
    if removed:
        progress(f"{out}: removed the previous run's {', '.join(removed)}")
    advice = advise_files(folder, folder / "advice.json", catalog or config["optimize"].get("catalog"),
                          shapes if shapes.is_file() else None, name)
    variant, new = advised_variant(name, workload, advice["advised_changes"])
    progress(f"advised: {' + '.join(advice['advised_changes']) or 'no change'} -> variant {variant}")
    variant_folder = folder.parent / variant
    if new:
        variant_slice = variant_workload(workload, new)
        why = variant_mismatch(variant_folder, variant_slice, run["harness"], run) if variant_folder.exists() else None
        if variant_folder.exists() and why is None:
            progress(f"{variant_folder}: already profiled, kept")
        else:
            if why is not None:
                progress(f"{variant_folder}: not this variant's profile ({why}); removed, profiling it again")
                shutil.rmtree(variant_folder)
            progress(f"profiling {variant} into {variant_folder}")
            target = folder / "clocks" / "target.json"
            ceilings = folder.parent / "ceilings" / f"{device}.json"
            # the base profile's harness and recorded thread count (its environment): the two profiles compare
            profile_files(variant, variant_slice, run["harness"], device, variant_folder, config,
                          target if device == "cuda" and target.is_file() else None,
                          ceilings if ceilings.is_file() else None, env=thread_env(run))
    source = ("--threads" if threads else "harness.threads" if config["harness"].get("threads") else
              "the profile's harness.threads" if run["harness"].get("threads") else None)
    threads = threads or config["harness"].get("threads") or run["harness"].get("threads")
    progress(f"verifying on {device}: the ablation of the advised changes, interleaved wall time")
    record = verify_variants_job(name, _json.dumps(workload, sort_keys=True),
                                 _json.dumps(config["optimize"], sort_keys=True), device,
                                 str(folder / "advice.json"), str(out / "verification.json"), threads,
                                 progress=progress, threads_source=source)
    optimize_report_files(name, folder, variant_folder, folder / "advice.json", out / "verification.json",
                          out / "report.html")
    return record
