"""Rows that share a value, as integer codes: evidence text is written once per distinct value and then
taken for every row (a million kernels, a few thousand distinct evidence texts)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def group_codes(columns: list[np.ndarray]) -> np.ndarray:
    """One code per row, equal where the rows agree on every column (None is a value), numbered 0..k-1
    in order of first appearance."""
    key = np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
    bound = 1  # every key is below it
    for column in columns:
        column = np.asarray(column)
        low, high = (int(column.min()), int(column.max())) if column.dtype.kind in "iu" and len(column) else (0, -1)
        if 0 <= high - low < 2**31 and high < 2**63:  # integers of a narrow span: their offset from the least is a code
            codes, width = column.astype(np.int64) - low, high - low + 1
        else:
            codes, distinct = pd.factorize(column, use_na_sentinel=True)
            codes, width = codes + 1, len(distinct) + 1
        if width == 1:
            continue  # one value: no row differs
        if bound * width >= 2**62:  # renumber densely before the product could overflow
            key, distinct_keys = pd.factorize(key)
            bound = len(distinct_keys)
        key = key * width + codes
        bound *= width
    return pd.factorize(key)[0] if len(key) else key


def path_codes(parent: np.ndarray, name_code: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows`` (positions into a range table; -1: none), a code of the list of names from
    its outermost ancestor down to it: equal lists, equal codes; -1 for -1.

    ``parent``: each range's parent position (-1: a root); ``name_code``: each range's name as an
    integer (equal names, equal codes). Only ``rows`` and their ancestors are visited, level by level
    (a range's list is its parent's plus its own name). Raises ValueError when parents form a cycle.
    """
    n = len(parent)
    needed = np.zeros(n, dtype=bool)
    up = pd.unique(rows[rows >= 0])
    while len(up):
        up = up[~needed[up]]
        needed[up] = True
        up = parent[up]
        up = up[up >= 0]
    visited = np.flatnonzero(needed)
    depth = np.zeros(len(visited), dtype=np.int64)
    up = parent[visited].copy()
    for _ in range(n + 1):
        live = np.flatnonzero(up >= 0)
        if not live.size:
            break
        depth[live] += 1
        up[live] = parent[up[live]]
    else:
        raise ValueError("range parents form a cycle")
    path = np.full(n, -1, dtype=np.int64)
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2 if len(depth) else 1))
    names = np.asarray(name_code, dtype=np.int64)
    width = int(names.max()) + 2 if len(names) else 1
    count = 0
    for level in range(len(bounds) - 1):
        at = visited[order[bounds[level]:bounds[level + 1]]]
        key = names[at] + 1 if level == 0 else path[parent[at]] * width + names[at] + 1
        codes, distinct = pd.factorize(key)
        path[at] = codes + count
        count += len(distinct)
    out = path[np.maximum(rows, 0)]
    out[rows < 0] = -1
    return out
