"""Carry per-kernel results from one run of a program to another run of the same program (an nsys and a
torch.profiler capture, a timeline and an ncu replay): kernels paired by invocation order, never by time.
Details: docs/modules.md#attribution-transfer."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd


@functools.lru_cache(maxsize=65536)
def kernel_signature(name: str) -> str:
    """The kernel's name without its parameter list and without whitespace, for pairing two runs:
    ``void k<4, F<float> >(int, F<float>)`` -> ``voidk<4,F<float>>``. Template arguments are kept (they
    tell ``vectorized_elementwise_kernel<4, FillFunctor>`` from ``<4, AbsFunctor>``); the anonymous
    namespace is written ``(anonymous namespace)`` by the C++ ABI demangler and ``{anonymous}`` by others."""
    text = name.replace("(anonymous namespace)", "{anon}").replace("{anonymous}", "{anon}")
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0:
            text = text[:i]
            break
    return "".join(text.split())


def _invocation_keys(kernels: pd.DataFrame, use_iteration: bool) -> pd.DataFrame:
    """One row per kernel, in launch order: ``kernel_id``, the group (process rank, iteration) and
    the kernel's signature."""
    rank = kernels["pid"].astype("int64").rank(method="dense").astype("int64") - 1
    iteration = (kernels["iteration"].astype("Int64").fillna(-1).astype("int64") if use_iteration
                 else pd.Series(-1, index=kernels.index))
    order = kernels["launch_start_ns"].fillna(kernels["start_ns"]).astype("int64")
    keyed = pd.DataFrame({"kernel_id": kernels["kernel_id"].astype("int64").to_numpy(), "rank": rank.to_numpy(),
                          "iteration": iteration.to_numpy(),
                          "signature": kernels["name"].astype(str).map(kernel_signature).to_numpy(),
                          "order": order.to_numpy(), "start": kernels["start_ns"].astype("int64").to_numpy()})
    return keyed.sort_values(["rank", "iteration", "order", "start", "kernel_id"], kind="stable")


def align_runs(target: pd.DataFrame, source: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Pair the kernels of two runs of one program by invocation order.

    Per process (ranked by pid) and measured iteration (when both runs mark iterations; else the
    whole window), the two runs' kernel sequences must be identical kernel by kernel (signature:
    :func:`kernel_signature`); then the i-th kernel pairs with the i-th. A group whose sequences
    differ (another program, a different input, autotuning in one run only) pairs nothing: a
    positional pairing there would name kernels after unrelated ops.

    Args:
        target, source: timeline kernels tables (DESIGN.md §3: ``kernel_id, pid, name, iteration,
            launch_start_ns, start_ns``).

    Returns:
        ``(pairs, summary)``: ``pairs`` has columns ``kernel_id`` (target) and ``source_kernel_id``;
        ``summary`` counts ``target_kernels``, ``source_kernels``, ``paired``, ``keyed_by``
        (``iteration`` or ``run``), ``mismatched_iterations`` (iterations, or ``[-1]`` for the whole
        run, whose sequences differ) and ``first_difference`` (group, position and the two
        signatures where the first differing group diverges), null when none.
    """
    use_iteration = bool(len(target)) and bool(len(source)) and target["iteration"].notna().any() \
        and source["iteration"].notna().any()
    t = _invocation_keys(target, use_iteration)
    s = _invocation_keys(source, use_iteration)
    t_groups = {key: g for key, g in t.groupby(["rank", "iteration"], sort=True)}
    s_groups = {key: g for key, g in s.groupby(["rank", "iteration"], sort=True)}
    pairs_t, pairs_s = [], []
    mismatched: list[int] = []
    first_difference = None
    for key, tg in t_groups.items():
        sg = s_groups.get(key)
        if sg is None or (use_iteration and key[1] < 0):
            continue  # kernels outside the measured iterations are not compared
        ts, ss = tg["signature"].to_numpy(), sg["signature"].to_numpy()
        if len(ts) == len(ss) and (ts == ss).all():
            pairs_t.append(tg["kernel_id"].to_numpy())
            pairs_s.append(sg["kernel_id"].to_numpy())
            continue
        mismatched.append(int(key[1]))
        if first_difference is None:
            common = min(len(ts), len(ss))
            diff = np.flatnonzero(ts[:common] != ss[:common])
            at = int(diff[0]) if len(diff) else common
            first_difference = {"rank": int(key[0]), "iteration": int(key[1]), "position": at,
                                "target": str(ts[at]) if at < len(ts) else None,
                                "source": str(ss[at]) if at < len(ss) else None,
                                "target_kernels": int(len(ts)), "source_kernels": int(len(ss))}
    pairs = pd.DataFrame({
        "kernel_id": np.concatenate(pairs_t) if pairs_t else np.array([], dtype=np.int64),
        "source_kernel_id": np.concatenate(pairs_s) if pairs_s else np.array([], dtype=np.int64),
    }).astype(np.int64)
    summary = {
        "target_kernels": int(len(target)),
        "source_kernels": int(len(source)),
        "paired": int(len(pairs)),
        "keyed_by": "iteration" if use_iteration else "run",
        "mismatched_iterations": sorted(set(mismatched)),
        "first_difference": first_difference,
    }
    return pairs, summary


def pairing_warnings(summary: dict, source) -> list[str]:
    """What an :func:`align_runs` ``summary`` of this timeline against the torch.profiler run ``source`` leaves
    unpaired, as warning lines (none when every kernel paired)."""
    out = []
    if summary["paired"] < summary["target_kernels"]:
        out.append(f"{summary['target_kernels'] - summary['paired']} of {summary['target_kernels']} kernels have no "
                   f"partner in the torch.profiler run {source} (paired by invocation order): they keep the NVTX "
                   "answer only")
    if summary["mismatched_iterations"]:
        diff = summary["first_difference"]
        where = "the whole run" if diff["iteration"] < 0 else f"iteration {diff['iteration']}"
        out.append(f"the torch.profiler run {source} launched a different kernel sequence than this timeline in {where} "
                   f"({diff['target_kernels']} vs {diff['source_kernels']} kernels; first difference at position "
                   f"{diff['position']}: {diff['target']} here, {diff['source']} there): those kernels keep the NVTX "
                   "answer only. Are both captures of the same program, shapes and settings?")
    return out
