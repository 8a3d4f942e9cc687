"""Names shared by the capture side and the analysis (no torch import).

- iteration range: ``opprof.iteration:<i>``
- layer range:     ``opprof.layer:<module path>`` (e.g. ``opprof.layer:transformer.h.3``)
- phase range:     ``opprof.phase:<phase>`` around each part of a train step (:data:`PHASES`)
- model range:     ``opprof.model`` (whole-model compile: around each call of the compiled model)
- measured range:  ``opprof.measured``, an NVTX start/end range (process-wide) around the measured iterations of
  a CUDA profiler-API run: what ``ncu --nvtx --nvtx-include opprof@opprof.measured`` selects
- NVTX domain:     ``opprof``
- module paths of compiled FX nodes: :data:`MODULE_PATHS_JSON` in each Inductor graph debug dir
- communication kernels (NCCL): :data:`COMMUNICATION` (ncu does not profile them; they wait on other ranks)
"""

import importlib.util
import re

NVTX_DOMAIN = "opprof"
ITERATION_PREFIX = "opprof.iteration:"
# The iteration the capture runs after the measured window to record input shapes (ITERATION_PREFIX + this; not
# a number, so never taken for a measured iteration).
SHAPES_ITERATION = "shapes"
# ... and the second one, recorded to check that the model's input shapes do not change between iterations.
SHAPES_CHECK_SUFFIX = ".check"
LAYER_PREFIX = "opprof.layer:"
PHASE_PREFIX = "opprof.phase:"
#: The parts of a train step, in order: model forward + loss, ``loss.backward()``, optimizer
#: ``step()`` + ``zero_grad()``. Inference iterations have no phase ranges.
PHASES = ("forward", "backward", "optimizer")
#: Around each call of a whole-model compiled model (outside the compiled code): kernels inside it (or whose
#: forward op is) are the model's, those outside are the harness's (loss, backward of the loss, optimizer).
MODEL_RANGE = "opprof.model"
#: NVTX start/end range (domain :data:`NVTX_DOMAIN`) around the measured iterations of a CUDA profiler-API run
#: (nsys capture, ncu replay). Start/end ranges are not per thread, so ncu's include filter on it selects every
#: kernel of the window, the autograd thread's too; never an operator, never a region in the attribution.
MEASURED_RANGE = "opprof.measured"


def measured_range_include() -> str:
    """ncu's ``--nvtx-include`` for :data:`MEASURED_RANGE` as the harness in this environment opens it: in our domain
    with NVIDIA's ``nvtx`` package (``opprof@opprof.measured``), else in the default domain through
    ``torch.cuda.nvtx`` (``opprof.measured``). Start/end syntax: no trailing ``/`` (that is a push/pop filter)."""
    return f"{NVTX_DOMAIN}@{MEASURED_RANGE}" if importlib.util.find_spec("nvtx") else MEASURED_RANGE
#: Written by the torch.profiler capture into each Inductor graph debug dir: FX node -> module path
#: (:mod:`operator_profiler.capture.fx_module_paths`), read by the fusion map (column ``module_paths``).
MODULE_PATHS_JSON = "opprof_module_paths.json"
MODULE_PATHS_FORMAT = "opprof.module_paths/1"

#: Communication (NCCL) kernel names, demangled or mangled.
COMMUNICATION = re.compile(r"^(?:void )?nccl|ncclDevKernel|ncclKernel|_Z\d+nccl", re.IGNORECASE)

#: The layer class of the kernels outside every layer instance (layers.classify_layers).
REST_CLASS = "rest"
