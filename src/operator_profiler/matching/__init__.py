"""ncu rows <-> timeline kernels: scoped, windowed alignment by invocation order, never by time (DESIGN.md §4).

:mod:`.names` the name ladder, :mod:`.align` the alignment that pins pairs, :mod:`.windows` what a file
covers, :mod:`.processes` which timeline process an ncu process is, :mod:`.bags` launches without a fixed order,
:mod:`.match` one matching run over scopes, :mod:`.diagnostics` reasons and summaries, :mod:`.broadcast` layer-class
dedup.
"""

from ..naming import COMMUNICATION
from .broadcast import broadcast_to_instances
from .diagnostics import REASONS, REFUSED, counters_summary
from .match import KERNEL_COLUMNS, match_invocations
from .names import ORDER_RUNG, RUNGS, base_name, demangle, names_agree, normalize
from .processes import parse_process_map
from .windows import Window, parse_window_specs

__all__ = ["COMMUNICATION", "KERNEL_COLUMNS", "ORDER_RUNG", "REASONS", "REFUSED", "RUNGS", "Window", "base_name",
           "broadcast_to_instances", "counters_summary", "demangle", "match_invocations", "names_agree", "normalize",
           "parse_process_map", "parse_window_specs"]
