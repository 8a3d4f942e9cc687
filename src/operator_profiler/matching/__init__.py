"""ncu rows <-> timeline kernels: scoped, windowed alignment by invocation order, never by time (DESIGN.md §4).

:mod:`.names` the name ladder, :mod:`.align` the alignment that pins pairs, :mod:`.match` scopes, windows and
reasons, :mod:`.broadcast` layer-class dedup.
"""

from .broadcast import broadcast_to_instances
from ..naming import COMMUNICATION
from .match import (KERNEL_COLUMNS, REASONS, REFUSED, Window, counters_summary, match_invocations,
                    parse_process_map, parse_window_specs)
from .names import RUNGS, base_name, demangle, names_agree, normalize

__all__ = ["COMMUNICATION", "KERNEL_COLUMNS", "REASONS", "REFUSED", "RUNGS", "Window", "base_name",
           "broadcast_to_instances", "counters_summary", "demangle", "match_invocations", "names_agree", "normalize",
           "parse_process_map", "parse_window_specs"]
