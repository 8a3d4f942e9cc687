"""Names shared by the capture side and the analysis (no torch import).

- iteration range: ``opprof.iteration:<i>``
- layer range:     ``opprof.layer:<module path>`` (e.g. ``opprof.layer:transformer.h.3``)
- phase range:     ``opprof.phase:<phase>`` around each part of a train step (:data:`PHASES`)
- NVTX domain:     ``opprof``
- communication kernels (NCCL): :data:`COMMUNICATION` (ncu does not profile them; they wait on other ranks)
"""

import re

NVTX_DOMAIN = "opprof"
ITERATION_PREFIX = "opprof.iteration:"
LAYER_PREFIX = "opprof.layer:"
PHASE_PREFIX = "opprof.phase:"
#: The parts of a train step, in order: model forward + loss, ``loss.backward()``, optimizer
#: ``step()`` + ``zero_grad()``. Inference iterations have no phase ranges.
PHASES = ("forward", "backward", "optimizer")

#: Communication (NCCL) kernel names, demangled or mangled.
COMMUNICATION = re.compile(r"^(?:void )?nccl|ncclDevKernel|ncclKernel|_Z\d+nccl", re.IGNORECASE)
