"""Carry per-kernel results from one run of a program to another run of the same program.

Two captures of one harness (an nsys run for NVTX and timing, a torch.profiler run for path (a);
or a timeline and an ncu replay) launch the same kernels in the same order, but in different
processes, on different clocks. Their kernels are paired by **invocation order**, never by time:
the k-th launch of a kernel in a measured iteration of one run is the k-th launch of that kernel in
the same iteration of the other (DESIGN.md §4, "matching by invocation order").

Kernel names are compared by their *base name*: the demangled function name without return type,
template arguments and parameter list (``void at::native::vectorized_elementwise_kernel<4, ...>(int,
...)`` -> ``at::native::vectorized_elementwise_kernel``). The two tools demangle with different
demanglers (Kineto: the C++ ABI demangler on the CUPTI name; nsys: its own), which disagree on
spacing and on spelling of some template arguments, never on the function name.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

_ANONYMOUS = "\x00anonymous\x00"


@functools.lru_cache(maxsize=65536)
def kernel_base_name(name: str) -> str:
    """``void ns::kern<float, 4>(float*, int)`` -> ``ns::kern``; a Triton or C name is returned unchanged.

    Removes, at template depth 0, the parameter list (from the first ``(``), every template argument
    list ``<...>`` and a leading return type (the text before the last space outside brackets).
    ``(anonymous namespace)`` qualifiers are kept as written.
    """
    name = name.strip()
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(name):
        ch = name[i]
        if name.startswith("(anonymous namespace)", i) and depth == 0:
            out.append("(anonymous namespace)")
            i += len("(anonymous namespace)")
            continue
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            if ch == "(":
                break
            out.append(ch)
        i += 1
    base = "".join(out).strip().replace("(anonymous namespace)", _ANONYMOUS)
    # "void ns::kern" -> "ns::kern": the return type ends at the last space outside brackets.
    return base.rsplit(" ", 1)[-1].replace(_ANONYMOUS, "(anonymous namespace)")


def _invocation_keys(kernels: pd.DataFrame, use_iteration: bool) -> pd.DataFrame:
    """One row per kernel: ``kernel_id`` and the key (process rank, iteration, base name, occurrence)."""
    base = kernels["name"].astype(str).map(kernel_base_name)
    rank = kernels["pid"].astype("int64").rank(method="dense").astype("int64") - 1
    iteration = (kernels["iteration"].astype("Int64").fillna(-1).astype("int64") if use_iteration
                 else pd.Series(-1, index=kernels.index))
    order = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64")
    keyed = pd.DataFrame({"kernel_id": kernels["kernel_id"].astype("int64").to_numpy(), "rank": rank.to_numpy(),
                          "iteration": iteration.to_numpy(), "base": base.to_numpy(), "order": order.to_numpy(),
                          "start": kernels["start_ns"].astype("int64").to_numpy()})
    keyed = keyed.sort_values(["order", "start", "kernel_id"], kind="stable")
    keyed["occurrence"] = keyed.groupby(["rank", "iteration", "base"]).cumcount()
    return keyed


def align_runs(target: pd.DataFrame, source: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Pair the kernels of two runs of one program by invocation order.

    Args:
        target, source: timeline kernels tables (DESIGN.md §3: ``kernel_id, pid, name, iteration,
            launch_start_ns, start_ns``).

    Returns:
        ``(pairs, summary)``: ``pairs`` has columns ``kernel_id`` (target) and ``source_kernel_id``
        for every target kernel that has a partner; ``summary`` counts ``target_kernels``,
        ``source_kernels``, ``paired``, ``keyed_by`` (``iteration`` when both runs mark measured
        iterations, else ``run``: occurrence over the whole window) and ``mismatched_iterations``
        (iterations whose kernel multiset differs between the runs, a sign the runs diverged).
    """
    use_iteration = bool(len(target)) and bool(len(source)) and target["iteration"].notna().any() \
        and source["iteration"].notna().any()
    t = _invocation_keys(target, use_iteration)
    s = _invocation_keys(source, use_iteration)
    key = ["rank", "iteration", "base", "occurrence"]
    pairs = t[["kernel_id", *key]].merge(s[[*key, "kernel_id"]].rename(columns={"kernel_id": "source_kernel_id"}),
                                         on=key, how="inner")
    mismatched: list[int] = []
    if use_iteration:
        tc = t.groupby(["iteration", "base"]).size()
        sc = s.groupby(["iteration", "base"]).size()
        common = sorted(set(t["iteration"]) & set(s["iteration"]) - {-1})
        for it in common:
            if not tc.xs(it, level="iteration").equals(sc.xs(it, level="iteration")):
                mismatched.append(int(it))
    summary = {
        "target_kernels": int(len(target)),
        "source_kernels": int(len(source)),
        "paired": int(len(pairs)),
        "keyed_by": "iteration" if use_iteration else "run",
        "mismatched_iterations": mismatched,
    }
    return pairs[["kernel_id", "source_kernel_id"]].astype(np.int64), summary
