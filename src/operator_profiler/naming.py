"""Names our harness gives its ranges (shared by the harness and the timeline readers; no torch import).

- iteration range: ``opprof.iteration:<i>``
- layer range:     ``opprof.layer:<module path>`` (e.g. ``opprof.layer:transformer.h.3``)
- NVTX domain:     ``opprof``
"""

NVTX_DOMAIN = "opprof"
ITERATION_PREFIX = "opprof.iteration:"
LAYER_PREFIX = "opprof.layer:"
