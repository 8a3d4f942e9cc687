"""The torch.profiler capture writes the Inductor debug output of the compile it profiles (one compile per workload):
the fusion map built from it names exactly the generated kernels the trace holds; an eager workload's debug folder
holds only a note; and the library's compile_artifacts (the debug output alone) refuses an eager workload."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import torch_flags_kept

from operator_profiler import stages
from operator_profiler.attribution import inductor
from operator_profiler.capture import jobs as capture
from operator_profiler.errors import CaptureError
from operator_profiler.naming import MODULE_PATHS_JSON

MLP = {"kind": "mlp", "compile": True, "width": 16, "expansion": 2, "n_block": 2, "batch_size": 2, "seq_len": 4}
HARNESS = {"seed": 0, "warmup": 1, "warmup_max": 1, "iterations": 2}


def _capture(tmp_path, workload):
    out = Path(tmp_path) / "w"
    with torch_flags_kept():
        capture.capture_timeline("w", workload, HARNESS, "cpu", "torch", out / "capture" / "timeline.kineto.json.gz",
                                 out / "capture" / "run.json", out / "capture" / "layers.json",
                                 out / "capture" / "clocks_applied.json",
                                 out_shapes=out / "capture" / "shapes.kineto.json.gz",
                                 out_debug=out / "inductor" / "debug")
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _capture(tmp_path_factory.mktemp("compiled"), MLP)


def test_the_fusion_map_names_every_generated_kernel_of_the_trace(compiled):
    out = compiled
    debug = out / "inductor" / "debug"
    assert not list(out.glob("inductor/*.partial"))  # renamed into place
    graphs = inductor.find_graph_dirs(debug)
    assert graphs and all((g / "output_code.py").is_file() and (g / MODULE_PATHS_JSON).is_file() for g in graphs)
    # The names output_code.py gives its kernels' record functions (graph_<n>_<kernel>, n Inductor's graph counter
    # of the compiling process), read here from the files themselves: they are the trace's names only if the
    # capture's own compile wrote them.
    defined = set()
    for g in graphs:
        defined |= set(re.findall(r'RAIIAtenRecordFunctionHandle \w+\("(graph_\d+_\w+)"', (g / "output_code.py").read_text()))
    stages.export_timeline(out / "capture" / "timeline.kineto.json.gz", out / "timeline")
    kernels = pd.read_parquet(out / "timeline" / "kernels.parquet")
    generated = set(kernels["name"][kernels["name"].str.match(r"^graph_\d+_")])
    assert generated and generated == defined
    fusion = stages.build_fusion_map(debug, out / "inductor" / "fusion_map.parquet")
    assert set(fusion["profiler_name"]) >= generated


def test_an_eager_workload_gets_a_debug_folder_with_only_a_note(tmp_path):
    out = _capture(tmp_path, {**MLP, "compile": False})
    debug = out / "inductor" / "debug"
    assert [p.name for p in debug.iterdir()] == [capture.EAGER_DEBUG_NOTE]
    assert "compile: false" in (debug / capture.EAGER_DEBUG_NOTE).read_text()
    assert (out / "capture" / "timeline.kineto.json.gz").is_file()


def test_compile_artifacts_refuses_an_eager_workload(tmp_path):
    with pytest.raises(CaptureError, match="compile is false"):
        capture.compile_artifacts({**MLP, "compile": False}, {"seed": 0}, "cpu", tmp_path / "debug",
                                  workload_name="w")
    assert not (tmp_path / "debug").exists()


def test_the_nsys_capture_itself_takes_no_debug_output(tmp_path):
    with pytest.raises(ValueError, match="Kineto run beside it"):
        capture.capture_timeline("w", MLP, HARNESS, "cuda", "nsys", tmp_path / "t.nsys-rep", tmp_path / "run.json",
                                 tmp_path / "layers.json", tmp_path / "clocks.json", out_debug=tmp_path / "debug")



def test_max_autotunes_gemm_template_kernels_are_kernels_of_the_timeline_and_of_the_fusion_map(tmp_path):
    """With max_autotune + freezing on the CPU, Inductor calls C++ GEMM template kernels (``graph_0_gemm_m32n16k32_
    kernel``), not only ``cpp_fused_*`` ones: each generated kernel the compile wraps in a record function (its
    ``RAIIAtenRecordFunctionHandle`` name in output_code.py, read here from the files) is a kernel of the timeline,
    and the fusion map attributes every one of them."""
    gpt2 = {"kind": "gpt2", "compile": True, "n_layer": 1, "n_embd": 64, "n_head": 4, "vocab_size": 512,
            "n_positions": 128, "batch_size": 2, "seq_len": 32,
            "compile_options": {"max_autotune": True, "freezing": True}}
    out = _capture(tmp_path, gpt2)
    debug = out / "inductor" / "debug"
    wrapped = set()
    for g in inductor.find_graph_dirs(debug):
        wrapped |= set(re.findall(r'RAIIAtenRecordFunctionHandle \w+\("(graph_\d+_\w+)"', (g / "output_code.py").read_text()))
    templates = {n for n in wrapped if "_gemm_" in n}
    assert templates, wrapped  # (autotuning picked a template for some GEMM: what this test is about)
    stages.export_timeline(out / "capture" / "timeline.kineto.json.gz", out / "timeline")
    kernels = pd.read_parquet(out / "timeline" / "kernels.parquet")
    assert set(kernels["name"][kernels["name"].str.startswith("graph_")]) == wrapped
    fusion = out / "inductor" / "fusion_map.parquet"
    stages.build_fusion_map(debug, fusion)
    attributed = stages.attribute_files(out / "timeline", None, fusion, out / "attribution.parquet")
    generated = attributed[attributed["name"].isin(wrapped)]
    assert len(generated) and generated["operator"].notna().all()
    assert set(generated["path"]) == {"inductor"}, set(generated["path"])  # path (c), the fusion map
