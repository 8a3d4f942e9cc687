"""Input shapes for the measured op calls from the capture's separate shapes iteration.

The capture records the measured window without ``record_shapes`` (recording them costs time per op call) and
then one more iteration with them (``capture/shapes.kineto.json.gz``, in the range
``opprof.iteration:shapes``). The calls are paired by invocation order, as ncu rows are: per thread, the k-th
outermost dispatcher op of a measured iteration is the k-th of the shapes iteration, provided the two
iterations ran the same ops in the same order on that thread. Where they did not (a model whose ops depend on
its data), nothing is paired for that iteration and thread, and the note says so: never another call's shapes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..naming import ITERATION_PREFIX, SHAPES_CHECK_SUFFIX, SHAPES_ITERATION
from ..timeline.model import iteration_at, top_level_ops


def _calls_by_thread(ranges: pd.DataFrame, tops: np.ndarray, iteration: np.ndarray | None,
                     window: tuple[int, int, int] | None) -> dict[tuple, list[int]]:
    """{(iteration or None, pid, tid): [range ids of outermost dispatcher ops, in start order]}."""
    is_top = tops == np.arange(len(ranges))
    rows = ranges[is_top]
    if window is not None:
        pid, start, end = window
        rows = rows[(rows["pid"] == pid) & (rows["start_ns"] >= start) & (rows["start_ns"] <= end)]
        keys = [(None, p, t) for p, t in zip(rows["pid"], rows["tid"])]
    else:
        its = iteration[rows.index.to_numpy()]
        keys = [(None if pd.isna(i) else int(i), p, t) for i, p, t in zip(its, rows["pid"], rows["tid"])]
    order = np.lexsort((rows["range_id"].to_numpy(), rows["start_ns"].to_numpy()))
    out: dict[tuple, list[int]] = {}
    ids = rows["range_id"].to_numpy()
    for j in order:
        out.setdefault(keys[j], []).append(int(ids[j]))
    return out


def _comparable(text):
    """A call's recorded inputs as the shapes check compares them: the text (``[shapes, types, concrete inputs,
    strides]``, docs/formats.md#kineto-record_shapes) with the value of every ``Scalar`` input that is a non-integral
    number left out. Such a value never sizes anything, and a train step's optimizer passes a new one every step
    (AdamW's bias-corrected step size: ``addcdiv_(..., value=-lr / (1 - beta1^t))``), which would otherwise make every
    train profile's shapes "change between iterations". Integral values (an ``arange`` end, a repeat count) stay."""
    if not isinstance(text, str) or "Scalar" not in text:
        return text
    import json

    try:
        parsed = json.loads(text)
        types, concrete = parsed[1], parsed[2]
    except (ValueError, TypeError, IndexError, KeyError):
        return text
    if not isinstance(types, list) or not isinstance(concrete, list):
        return text
    kept = list(concrete)
    for i, (kind, value) in enumerate(zip(types, concrete)):
        if kind == "Scalar" and isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                continue
            if number != number or number in (float("inf"), float("-inf")) or not number.is_integer():
                kept[i] = "(float scalar)"
    return json.dumps([parsed[0], types, kept, *parsed[3:]])


def shapes_for_measured_calls(ranges: pd.DataFrame, shapes_ranges: pd.DataFrame) -> tuple[pd.Series, dict[int, str]]:
    """The ``input_shapes`` of ``ranges`` (by position), filled from ``shapes_ranges`` (the shapes trace's
    timeline ranges) where the measured call has none; and a note per outermost op call left without shapes."""
    ranges = ranges.sort_values("range_id").reset_index(drop=True)
    shapes_ranges = shapes_ranges.sort_values("range_id").reset_index(drop=True)
    filled = (ranges["input_shapes"].astype(object).copy() if "input_shapes" in ranges
              else pd.Series([None] * len(ranges), dtype=object))
    notes: dict[int, str] = {}
    marker = shapes_ranges[shapes_ranges["name"] == f"{ITERATION_PREFIX}{SHAPES_ITERATION}"]
    tops = top_level_ops(ranges)
    iteration = np.asarray(iteration_at(ranges["pid"].to_numpy(), ranges["start_ns"].to_numpy(), ranges),
                           dtype=object)
    measured = _calls_by_thread(ranges, tops, iteration, None)
    if marker.empty:
        for ids in measured.values():
            for r in ids:
                notes[r] = "the shapes trace has no opprof.iteration:shapes range"
        return filled, notes
    m = marker.iloc[0]
    shape_tops = top_level_ops(shapes_ranges)
    recorded = _calls_by_thread(shapes_ranges, shape_tops, None, (int(m["pid"]), int(m["start_ns"]), int(m["end_ns"])))
    shape_names = shapes_ranges["name"].to_numpy(dtype=object)
    shape_text = shapes_ranges["input_shapes"].to_numpy(dtype=object) if "input_shapes" in shapes_ranges else None
    # The second shapes iteration: a thread whose calls got other shapes there changes shapes between iterations,
    # so the measured iterations' shapes are not known from the first (ops alike are not shapes alike).
    check = shapes_ranges[shapes_ranges["name"] == f"{ITERATION_PREFIX}{SHAPES_ITERATION}{SHAPES_CHECK_SUFFIX}"]
    varying: set[tuple] = set()
    if not check.empty and shape_text is not None:
        c = check.iloc[0]
        again = _calls_by_thread(shapes_ranges, shape_tops, None, (int(c["pid"]), int(c["start_ns"]), int(c["end_ns"])))
        for key, first in recorded.items():
            second = again.get(key, [])
            if [(shape_names[r], _comparable(shape_text[r])) for r in first] != \
                    [(shape_names[r], _comparable(shape_text[r])) for r in second]:
                varying.add(key)
    names = ranges["name"].to_numpy(dtype=object)
    for (it, pid, tid), ids in measured.items():
        if it is None:
            for r in ids:
                notes[r] = "outside the measured iterations: no shapes recorded for it"
            continue
        other = recorded.get((None, pid, tid))
        if (None, pid, tid) in varying:
            reason = (f"the two shapes iterations recorded other ops or input shapes on thread {tid}: the model's "
                      "shapes change between iterations, so the measured calls' shapes are not known")
        elif other is None or shape_text is None:
            reason = "the shapes iteration ran nothing on this thread"
        elif [names[r] for r in ids] != [shape_names[r] for r in other]:
            reason = (f"measured iteration {it} ran other ops than the shapes iteration on thread {tid} "
                      f"({len(ids)} vs {len(other)} op calls): its calls are not paired")
        else:
            reason = None
        for k, r in enumerate(ids):
            if reason is not None:
                if pd.isna(filled.iloc[r]):
                    notes[r] = reason
            elif pd.isna(filled.iloc[r]):
                filled.iloc[r] = shape_text[other[k]]
    return filled, notes
