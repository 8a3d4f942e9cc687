"""Capture stages: run the harness under a timeline tool, and compile with Inductor's debug output.

Kept apart from the analysis stages (:mod:`operator_profiler.stages`) so the GPU rules depend only on
this module, the harness and the workloads: an analysis change never re-runs a capture.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .clocks import locked_clocks, select_clocks  # noqa: F401  (select_clocks: kept importable from here)
from .files import InputError, read_json_file, write_json


class GpuStageUnavailable(RuntimeError):
    """A GPU stage that this version cannot run yet (or cannot run on this machine)."""


def capture_timeline(workload_name: str, workload: dict, harness_cfg: dict, device: str, timeline_tool: str,
                     out_trace: Path, out_run: Path, out_layers: Path, out_clocks: Path,
                     clocks_target: Path | dict | None = None) -> None:
    """Run the harness under torch.profiler (CPU, or CUDA with ``timeline: torch``).

    On CUDA the run happens inside :func:`operator_profiler.clocks.locked_clocks` with ``clocks_target``
    (the ``clocks/target.json`` path, or its dict), which writes ``out_clocks`` (``clocks_applied.json``)
    and restores the clocks whatever happens.

    Raises:
        InputError: CUDA without a readable ``clocks_target``.
        ClockError, ClockPermissionError: see :func:`~operator_profiler.clocks.locked_clocks`.
    """
    from . import harness

    if device == "cuda" and timeline_tool == "nsys":
        raise GpuStageUnavailable(
            "capture_timeline with nsys needs a CUDA GPU and the nsys capture stage (issue #6, not built yet); "
            "set timeline: torch or device: cpu"
        )
    out_trace = Path(out_trace)
    tmp_trace = Path(str(out_trace) + ".partial.gz")
    if device == "cpu":
        run = harness.run_capture(workload, harness_cfg, device, tmp_trace, out_layers, out_run,
                                  workload_name=workload_name)
        os.replace(tmp_trace, out_trace)
        write_json(out_clocks, {"locked": False, "device": device, "reason": "CPU run: no GPU clocks",
                                "workload": workload_name, "measured_s": run["measured_s"]})
        return
    if not isinstance(clocks_target, dict):
        if clocks_target is None:
            raise InputError("capture_timeline on device cuda needs the clock target (clocks/target.json from "
                             "select_clocks); pass it")
        clocks_target = read_json_file(Path(clocks_target), "the clock target", "run the select_clocks rule",
                                       expect=dict)
    with locked_clocks(clocks_target, Path(out_clocks), device) as applied:
        applied["workload"] = workload_name
        run = harness.run_capture(workload, harness_cfg, device, tmp_trace, out_layers, out_run,
                                  workload_name=workload_name)
        os.replace(tmp_trace, out_trace)
        applied["measured_s"] = run["measured_s"]


def compile_artifacts(workload: dict, harness_cfg: dict, device: str, out_dir: Path) -> None:
    """Compile the workload once with TORCH_COMPILE_DEBUG on, writing Inductor's debug directories
    (``output_code.py``, FX graphs, provenance JSON) under ``out_dir``. One warm-up + one iteration,
    same seed and shapes as the capture, so kernel names and call sites are the capture's."""
    from . import harness

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    short = dict(harness_cfg, warmup=1, iterations=1)
    harness.run_capture(workload, short, device, None, tmp / "layers.json", tmp / "run.json",
                        inductor_dir=tmp, profiler="none")
    if not any(tmp.rglob("output_code.py")):
        raise RuntimeError(f"torch.compile wrote no Inductor debug directory under {tmp}; is the workload compiled?")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


