"""The files of a workload's results folder (``results/<workload>/``): where each lies, what it is, how it is
made and which columns prove it is the right table; one reader that checks them (:func:`read`), and the inputs
of a report as one typed object (:class:`ReportPaths` -> :class:`ReportInputs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import tables
from .errors import InputError
from .files import read_json_file, read_parquet_file


@dataclass(frozen=True)
class Artifact:
    """One file of the pipeline: ``path`` inside a workload's results folder (the workflow's layout), ``what``
    it is (for messages), ``hint`` how to make it, ``columns`` it must have (parquet) or the JSON type it must be
    (``expect``); ``nullable_ints`` reads int64 columns as nullable."""

    path: str
    what: str
    hint: str
    columns: tuple[str, ...] = ()
    nullable_ints: bool = False
    expect: type | None = None

    @property
    def is_json(self) -> bool:
        return self.path.endswith(".json")


_TIMELINE = "write the timeline with: opprof timeline (--kineto TRACE | --nsys REPORT) --out DIR"
_AGGREGATE = "write it with opprof aggregate (see opprof --help)"
_MATCH = "write it with: opprof match --timeline DIR --ncu NCU.parquet --out DIR"

KERNELS = Artifact("timeline/kernels.parquet", "a timeline kernels table", _TIMELINE, tuple(tables.KERNELS.names),
                   nullable_ints=True)
RANGES = Artifact("timeline/ranges.parquet", "a timeline ranges table", _TIMELINE, tuple(tables.RANGES.names),
                  nullable_ints=True)
LAUNCHES = Artifact("timeline/launches.parquet", "a timeline launches table", _TIMELINE,
                    tuple(tables.LAUNCHES.names), nullable_ints=True)
ACTIVITIES = Artifact("timeline/gpu_activities.parquet", "the timeline's memcpy/memset table", _TIMELINE,
                      ("kind", "start_ns", "end_ns"), nullable_ints=True)
DIAGNOSTICS = Artifact("timeline/diagnostics.json", "a timeline's diagnostics.json", _TIMELINE, expect=dict)
FUSION_MAP = Artifact("inductor/fusion_map.parquet", "a fusion map",
                      "write it with: opprof fusion-map --inductor-dir DIR --out FILE", ("graph", "kernel", "kind"))
LAYERS = Artifact("capture/layers.json", "the capture's layers.json", "it is written by the capture", expect=list)
RUN = Artifact("capture/run.json", "the capture's run.json",
               "pass capture/run.json, or leave --run out for a trace captured elsewhere", expect=dict)
CLOCKS = Artifact("capture/clocks_applied.json", "the capture's clocks_applied.json", "it is written by the capture",
                  expect=dict)
KERNEL_LAYERS = Artifact("layers/kernel_layers.parquet", "a kernel_layers table (layers/kernel_layers.parquet)",
                         "write it with: opprof classify --timeline DIR --layers LAYERS.json --out DIR",
                         ("kernel_id", "layer", "layer_class", "position"))
INSTANCES = Artifact("layers/instances.parquet", "a layer instances table", "write it with opprof classify",
                     ("layer", "layer_class", "iteration", "time_ns"))
CLASSES = Artifact("layers/classes.json", "classes.json of opprof classify", "write it with opprof classify",
                   expect=dict)
ATTRIBUTION = Artifact("attribution/kernels.parquet", "an attribution table", "write it with opprof attribute",
                       (*tables.ATTRIBUTION.names, "duration_ns", "operator_range_id"), nullable_ints=True)
NCU_COUNTERS = Artifact("ncu/{cls}.parquet", "an ncu counters table", "run 'opprof ncu' first",
                        ("ncu_id", "name", "match_key"))
REPLAY = Artifact("ncu/{cls}.replay.json", "an ncu replay record", "run the replay_ncu rule (GPU) first", expect=dict)
COUNTERS = Artifact("matched/kernel_metrics.parquet", "matched kernel counters (matched/kernel_metrics.parquet)",
                    _MATCH, ("kernel_id", "ncu_id", "counters_from"))
MATCHING = Artifact("matched/diagnostics.json", "matched/diagnostics.json", _MATCH, expect=dict)
WORK = Artifact("work/kernels.parquet", "a work table (work/kernels.parquet)", "write it with the compute_work rule",
               ("kernel_id", "flops", "bytes", "work_rule", "dtype", "work_note"))
CEILINGS = Artifact("ceilings.json", "a ceilings.json", "write it with the measure_ceilings rule (or opprof ceilings)",
                    expect=dict)
OPERATORS = Artifact("operators.parquet", "an operators table", _AGGREGATE, ("operator", "time_ns"))
MODULES = Artifact("modules.parquet", "a modules table", _AGGREGATE, ("module", "time_ns"))
LAYER_CLASSES = Artifact("layer_classes.parquet", "a layer classes table", _AGGREGATE, ("layer_class", "instances"))
PHASES = Artifact("phases.parquet", "a phases table (phases.parquet)", _AGGREGATE,
                  ("phase", "operator", "time_ns", "phase_share"))
COVERAGE = Artifact("coverage.json", "coverage.json", _AGGREGATE, expect=dict)
ADVICE = Artifact("advice.json", "an advice.json", "write it with: opprof advise --results FOLDER --out FILE",
                  expect=dict)


def read(artifact: Artifact, path: Path | str, columns: tuple[str, ...] | None = None, hint: str | None = None,
         nullable_ints: bool | None = None, omit: tuple[str, ...] = (), categorical: tuple[str, ...] = ()):
    """Read ``path`` as ``artifact`` (a DataFrame, or the JSON value), checked: it exists, parses, and has the
    artifact's columns (``columns`` instead, where a stage needs fewer) or JSON type; int64 columns nullable as the
    artifact says unless ``nullable_ints`` says otherwise; the columns in ``omit`` are not read (still checked), the
    string columns in ``categorical`` are read as categoricals.

    Raises:
        InputError: naming the file, what it should be and how to make it (``hint`` instead of the artifact's).
    """
    hint = hint or artifact.hint
    if artifact.is_json:
        return read_json_file(Path(path), artifact.what, hint, expect=artifact.expect)
    return read_parquet_file(Path(path), artifact.what, hint, artifact.columns if columns is None else columns,
                             nullable_ints=artifact.nullable_ints if nullable_ints is None else nullable_ints,
                             omit=omit, categorical=categorical)


def read_optional(artifact: Artifact, path: Path | str | None, **kwargs):
    """:func:`read`, or None when ``path`` is None."""
    return None if path is None else read(artifact, path, **kwargs)


@dataclass
class ReportPaths:
    """The files a report is made from. ``run`` is None for a trace captured elsewhere; the optional ones None
    when not collected (``matching``/``replays``/``counters``: CUDA only; ``phases``: older runs)."""

    coverage: Path
    operators: Path
    modules: Path
    layer_classes: Path
    run: Path | None = None
    diagnostics: Path | None = None
    matching: Path | None = None
    replays: list[Path] = field(default_factory=list)
    clocks: Path | None = None
    phases: Path | None = None
    attribution: Path | None = None
    counters: Path | None = None
    advice: Path | None = None

    @classmethod
    def of_folder(cls, folder: Path | str) -> ReportPaths:
        """The report inputs of a finished run's results folder, by the workflow's layout.

        Raises:
            InputError: not a folder, or no ``operators.parquet`` in it (not a results folder).
        """
        folder = Path(folder)
        if not folder.is_dir() or not (folder / OPERATORS.path).is_file():
            what = "is not a folder" if not folder.is_dir() else "holds no operators.parquet"
            raise InputError(f"{folder} {what}: not a results folder; pass results/<workload>/ of a finished run "
                             "(snakemake), or the --out folder of opprof aggregate")

        def optional(artifact: Artifact) -> Path | None:
            return folder / artifact.path if (folder / artifact.path).is_file() else None

        counters = optional(COUNTERS)
        return cls(coverage=folder / COVERAGE.path, operators=folder / OPERATORS.path, modules=folder / MODULES.path,
                   layer_classes=folder / LAYER_CLASSES.path, run=optional(RUN), diagnostics=optional(DIAGNOSTICS),
                   matching=optional(MATCHING), replays=sorted((folder / "ncu").glob("*.replay.json")),
                   clocks=optional(CLOCKS), phases=optional(PHASES),
                   attribution=optional(ATTRIBUTION) if counters else None, counters=counters,
                   advice=optional(ADVICE))


@dataclass
class ReportInputs:
    """What a report shows, read and checked (:meth:`read`): the capture's ``run`` (None for a trace captured
    elsewhere), ``coverage``, the ``operators``/``modules``/``layer_classes`` tables, the timeline's
    ``diagnostics``, the ``matching`` diagnostics, the ncu ``replays`` records, the capture's ``clocks``, the
    operators per train-step ``phases``, and ``counters_time`` (share of kernel time with ncu counters)."""

    coverage: dict
    operators: object
    modules: object
    layer_classes: object
    run: dict | None = None
    diagnostics: dict | None = None
    matching: dict | None = None
    replays: list[dict] | None = None
    clocks: dict | None = None
    phases: object = None
    counters_time: float | None = None
    advice: dict | None = None

    @classmethod
    def read(cls, paths: ReportPaths, counters_time: bool = False) -> ReportInputs:
        """Read every file of ``paths``; with ``counters_time`` also the share of kernel time whose kernels have
        matched counters (needs ``paths.attribution`` and ``paths.counters``).

        Raises:
            InputError: a missing or wrong file, a diagnostics.json or matching of another timeline.
        """
        coverage = read(COVERAGE, paths.coverage)
        diagnostics = read_optional(DIAGNOSTICS, paths.diagnostics)
        if diagnostics and "counts" in diagnostics:
            counts = diagnostics["counts"]
            in_timeline = counts.get("kernels", 0) + counts.get("cpu_kernels", 0) + counts.get("graph_launch_rows", 0)
            if in_timeline != coverage.get("kernel_count"):
                raise InputError(f"{paths.diagnostics} describes a timeline of {in_timeline} kernels, "
                                 f"{paths.coverage} {coverage.get('kernel_count')}: pass the timeline these results "
                                 "were made from")
        matching = read_optional(MATCHING, paths.matching, hint="run opprof match first")
        recorded = (matching or {}).get("timeline") or {}
        if recorded and coverage.get("timeline") and recorded != coverage["timeline"] or \
                recorded.get("kernels") is not None and recorded["kernels"] != coverage.get("kernel_count"):
            raise InputError(f"{paths.matching} was matched on another timeline ({recorded['kernels']} kernels) "
                             f"than {paths.coverage} describes ({coverage.get('kernel_count')} kernels): pass the "
                             "matching of these results")
        share = None
        if counters_time and paths.attribution is not None and paths.counters is not None:
            share = counters_time_share(paths.attribution, paths.counters)
        return cls(coverage=coverage, operators=read(OPERATORS, paths.operators), modules=read(MODULES, paths.modules),
                   layer_classes=read(LAYER_CLASSES, paths.layer_classes), run=read_optional(RUN, paths.run),
                   diagnostics=diagnostics, matching=matching,
                   replays=read_replay_records(paths.replays) if paths.replays else None,
                   clocks=read_optional(CLOCKS, paths.clocks), phases=read_optional(PHASES, paths.phases),
                   counters_time=share, advice=read_optional(ADVICE, paths.advice))


def counters_time_share(attribution_path: Path, counters_path: Path) -> float:
    """The share of kernel time (timeline durations) whose kernels have matched ncu counters."""
    attribution = read(ATTRIBUTION, attribution_path, columns=("kernel_id", "duration_ns"),
                       hint="run opprof attribute first", nullable_ints=False)
    counters = read(COUNTERS, counters_path, columns=("kernel_id",), hint="run opprof match first")
    total = int(attribution["duration_ns"].sum())
    with_counters = int(attribution.loc[attribution["kernel_id"].isin(counters["kernel_id"]), "duration_ns"].sum())
    return with_counters / total if total else 0.0


def read_replay_records(paths: list[Path]) -> list[dict]:
    """The ``ncu/{cls}.replay.json`` files of the ncu replays (:func:`operator_profiler.ncu.replay.run_replay`).

    Raises:
        InputError: a missing or unreadable file, or one without ``class``, ``window`` or ``wall_s``.
    """
    records = []
    for path in paths:
        record = read(REPLAY, path)
        for key in ("class", "window", "wall_s"):
            if key not in record:
                raise InputError(f"{path}: no {key!r} in this replay record; re-run the replay_ncu rule for this class")
        records.append(record)
    return records


def timeline_digest(kernels: pd.DataFrame) -> dict:
    """What identifies a timeline's kernels: their count and a SHA-1 of their names in ``kernel_id`` order. The
    matched counters and diagnostics carry it, so the stages that join them to an attribution table can refuse
    those of another timeline (kernel ids alone are 0..n-1 in every timeline)."""
    import hashlib

    ordered = kernels.sort_values("kernel_id")
    text = "\n".join(f"{k}\t{n}" for k, n in zip(ordered["kernel_id"].astype("int64"), ordered["name"].astype(str)))
    return {"kernels": int(len(kernels)), "sha1": hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()}


def check_matched_on(recorded: dict | None, attribution: pd.DataFrame, what: Path,
                             attribution_path: Path) -> None:
    """Counters/diagnostics of ``opprof match`` belong to the attribution's timeline, else one-line error."""
    if not recorded:
        return
    mine = timeline_digest(attribution)
    if recorded != mine:
        raise InputError(f"{what} was matched on another timeline ({recorded.get('kernels')} kernels) than "
                         f"{attribution_path} ({mine['kernels']} kernels, other kernel names): run opprof match on "
                         "the timeline this attribution came from")
