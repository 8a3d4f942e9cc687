"""File-level stage runners: read a stage's input files, call the library, write its outputs.

The Snakemake scripts and the ``opprof`` CLI both call these, so a stage behaves the same inside and
outside the workflow. Every writer is atomic (temp file + rename) so a failing stage leaves no
partial output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from . import aggregate as agg
from . import layers as layer_classes
from . import report as report_md
from . import tables
from .attribution import inductor
from .attribution.merge import attribute
from .capture import GpuStageUnavailable
from .files import write_json, write_parquet_atomic, write_text_atomic
from .timeline import kineto


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


def require_files(*paths: Path, hint: str) -> None:
    """Raise FileNotFoundError naming every missing input and how to make it."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"missing input {', '.join(missing)}; {hint}")


def read_timeline(timeline_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``kernels.parquet`` and ``ranges.parquet`` of a timeline folder."""
    timeline_dir = Path(timeline_dir)
    kernels, ranges = timeline_dir / "kernels.parquet", timeline_dir / "ranges.parquet"
    require_files(kernels, ranges, hint=f"write the timeline first: opprof timeline --kineto TRACE --out {timeline_dir}")
    return tables.read_table(kernels), tables.read_table(ranges)


def export_timeline(trace: Path, out_dir: Path) -> kineto.Timeline:
    """Kineto trace -> ``kernels.parquet``, ``launches.parquet``, ``ranges.parquet`` in ``out_dir``."""
    trace = Path(trace)
    if trace.suffix in (".nsys-rep", ".sqlite"):
        raise GpuStageUnavailable(
            f"{trace}: reading Nsight Systems exports is not built yet (issue #3); use a torch.profiler trace"
        )
    timeline = kineto.read_kineto(trace)
    kineto.write_timeline(timeline, out_dir)
    return timeline


def classify(timeline_dir: Path, layers_json: Path, out_instances: Path, out_kernel_layers: Path,
             out_summary: Path, out_classes_dir: Path) -> dict[str, dict]:
    """The layer-class checkpoint: instances table, per-kernel layer table, one JSON per class."""
    kernels, ranges = read_timeline(timeline_dir)
    require_files(layers_json, hint="it is written by the capture (capture/layers.json); for a trace "
                  "captured elsewhere pass a file containing [] (no layers)")
    layers = json.loads(Path(layers_json).read_text())
    kernel_layers, instances, classes = layer_classes.classify_layers(kernels, ranges, layers)
    write_parquet_atomic(instances, out_instances)
    write_parquet_atomic(kernel_layers, out_kernel_layers)
    write_json(out_summary, classes)
    layer_classes.write_classes(classes, out_classes_dir)
    return classes


def attribute_files(timeline_dir: Path, kernel_layers: Path | None, fusion_map: Path | pd.DataFrame | None,
                    out: Path) -> pd.DataFrame:
    """Attribution of every kernel of a Kineto timeline (paths a and c) -> ``attribution/kernels.parquet``.

    ``fusion_map`` is a ``fusion_map.parquet`` path or an already loaded fusion map.
    """
    kernels, ranges = read_timeline(timeline_dir)
    if kernel_layers is not None:
        require_files(kernel_layers, hint="write it with: opprof classify --timeline DIR --layers LAYERS.json --out DIR")
        kl = pd.read_parquet(kernel_layers)
    else:
        kl, _, _ = layer_classes.classify_layers(kernels, ranges, [])
    if isinstance(fusion_map, (str, Path)):
        require_files(fusion_map, hint="write it with: opprof fusion-map --inductor-dir DIR --out FILE")
        fusion_map = pd.read_parquet(fusion_map)
    fusion = fusion_map
    result = attribute(kernels, ranges, kl, fusion)
    tables.write_table(result, tables.ATTRIBUTION, out)
    return result


def aggregate_files(attribution_path: Path, instances_path: Path, classes_path: Path, options: dict, out_operators_parquet: Path, out_operators_csv: Path, out_modules: Path,
                    out_layer_classes: Path, out_coverage: Path) -> None:
    attribution = tables.read_table(attribution_path)
    instances = pd.read_parquet(instances_path)
    classes = json.loads(Path(classes_path).read_text())
    operators = agg.operators_table(attribution, options["per_iteration"])
    write_parquet_atomic(operators, out_operators_parquet)
    write_parquet_atomic(agg.modules_table(attribution), out_modules)
    write_parquet_atomic(agg.layer_classes_table(instances, classes), out_layer_classes)
    write_text_atomic(out_operators_csv, operators.to_csv(index=False))
    write_json(out_coverage, agg.coverage(attribution, counters_collected=False))


def report_files(workload: str, run_path: Path, coverage_path: Path, operators_path: Path, modules_path: Path,
                 layer_classes_path: Path, options: dict, out: Path) -> None:
    text = report_md.render_markdown(
        workload,
        json.loads(Path(run_path).read_text()),
        json.loads(Path(coverage_path).read_text()),
        pd.read_parquet(operators_path),
        pd.read_parquet(modules_path),
        pd.read_parquet(layer_classes_path),
        options["top_operators"],
    )
    write_text_atomic(out, text)
