"""Align an ncu launch sequence with a timeline launch sequence and keep only the pairs every optimal
alignment (longest common subsequence) contains: a pair two equally good alignments disagree on is
refused, never guessed.
Details: docs/modules.md#matching-align."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

UNALIGNED, AMBIGUOUS, PINNED = 0, 1, 2
MAX_CELLS = 400_000_000


@dataclass
class Alignment:
    """Result of :func:`pin` on a timeline sequence ``t`` (length m) and an ncu sequence ``n`` (length k).

    ``n_to_t``: per ncu row, the pinned timeline index or -1. ``n_state``/``t_state``: UNALIGNED, AMBIGUOUS or
    PINNED per row / per timeline launch (a timeline launch is AMBIGUOUS when some optimal alignment pairs it but
    none pins it). ``lcs``: launches paired by an optimal alignment. ``exhaustive``: False when the sequences were
    too large to analyse (``max_cells``); then nothing is pinned."""

    n_to_t: np.ndarray
    n_state: np.ndarray
    t_state: np.ndarray
    lcs: int
    exhaustive: bool = True


def pin(t, n, max_cells: int = MAX_CELLS) -> Alignment:
    """The pinned pairs of two token sequences (module docstring). Tokens are non-negative integers."""
    t = np.asarray(t, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    m, k = len(t), len(n)
    n_to_t = np.full(k, -1, dtype=np.int64)
    n_state = np.full(k, UNALIGNED, dtype=np.int8)
    t_state = np.full(m, UNALIGNED, dtype=np.int8)
    common = np.intersect1d(t, n)
    t_idx = np.flatnonzero(np.isin(t, common))
    n_idx = np.flatnonzero(np.isin(n, common))
    t2, n2 = t[t_idx], n[n_idx]
    if len(n2) == 0:
        return Alignment(n_to_t, n_state, t_state, 0)
    if len(t2) == len(n2) and np.array_equal(t2, n2):  # identical: the identity is the only optimal alignment
        n_to_t[n_idx] = t_idx
        n_state[n_idx] = PINNED
        t_state[t_idx] = PINNED
        return Alignment(n_to_t, n_state, t_state, len(n2))
    positions = token_positions(t2)
    left = embed(n2, positions, forward=True)
    if left is not None:
        right = embed(n2, positions, forward=False)
        sub_to_t, sub_n, sub_t = _from_embeddings(n2, left, right, positions, len(t2))
        lcs, exhaustive = len(n2), True
    elif len(t2) * len(n2) <= max_cells:
        sub_to_t, sub_n, sub_t, lcs = _bit_parallel(t2, n2, positions)
        exhaustive = True
    else:
        sub_to_t = np.full(len(n2), -1, dtype=np.int64)
        sub_n = np.full(len(n2), AMBIGUOUS, dtype=np.int8)
        sub_t = np.full(len(t2), AMBIGUOUS, dtype=np.int8)
        lcs, exhaustive = 0, False
    n_state[n_idx] = sub_n
    t_state[t_idx] = sub_t
    pinned = sub_to_t >= 0
    n_to_t[n_idx[pinned]] = t_idx[sub_to_t[pinned]]
    return Alignment(n_to_t, n_state, t_state, int(lcs), exhaustive)


def token_positions(t: np.ndarray) -> dict[int, list[int]]:
    order = np.argsort(t, kind="stable")
    values, starts = np.unique(t[order], return_index=True)
    bounds = list(starts[1:]) + [len(t)]
    return {int(v): order[s:e].tolist() for v, s, e in zip(values, starts, bounds)}


def embed(n: np.ndarray, positions: dict[int, list[int]], forward: bool) -> np.ndarray | None:
    """The leftmost (``forward``) or rightmost embedding of ``n`` into the timeline, or None if there is none."""
    out = np.empty(len(n), dtype=np.int64)
    if forward:
        cur = 0
        for j, tok in enumerate(n.tolist()):
            pos = positions[tok]
            p = bisect.bisect_left(pos, cur)
            if p == len(pos):
                return None
            out[j] = pos[p]
            cur = pos[p] + 1
    else:
        cur = np.iinfo(np.int64).max
        for j in range(len(n) - 1, -1, -1):
            pos = positions[int(n[j])]
            p = bisect.bisect_left(pos, cur) - 1
            if p < 0:
                return None
            out[j] = pos[p]
            cur = pos[p]
    return out


def _from_embeddings(n, left, right, positions, m):
    sub_to_t = np.where(left == right, left, -1)
    sub_n = np.where(left == right, PINNED, AMBIGUOUS).astype(np.int8)
    sub_t = np.full(m, UNALIGNED, dtype=np.int8)
    for j in np.flatnonzero(left != right).tolist():  # every launch of the token between the two bounds
        pos = positions[int(n[j])]
        lo, hi = bisect.bisect_left(pos, int(left[j])), bisect.bisect_right(pos, int(right[j]))
        sub_t[pos[lo:hi]] = AMBIGUOUS
    sub_t[sub_to_t[sub_to_t >= 0]] = PINNED
    return sub_to_t, sub_n, sub_t


def _zero_prefix(v: int, m: int) -> np.ndarray:
    """``out[i]`` = number of zero bits of ``v`` among bits ``0 .. i-1`` (length m + 1)."""
    raw = np.frombuffer(v.to_bytes((m + 7) // 8 or 1, "little"), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little")[:m]
    out = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(1 - bits.astype(np.int64), out=out[1:])
    return out


def _bit_parallel(t, n, positions):
    m, k = len(t), len(n)
    full = (1 << m) - 1
    forward_masks: dict[int, int] = {}
    backward_masks: dict[int, int] = {}
    for tok, pos in positions.items():
        forward_masks[tok] = sum(1 << p for p in pos)
        backward_masks[tok] = sum(1 << (m - 1 - p) for p in pos)
    rows = [full]  # rows[j]: F(j, .) after n[:j]
    v = full
    for tok in n.tolist():
        u = v & forward_masks[tok]
        v = ((v + u) | (v - u)) & full
        rows.append(v)
    lcs = m - bin(v).count("1")
    sub_to_t = np.full(k, -1, dtype=np.int64)
    sub_n = np.full(k, UNALIGNED, dtype=np.int8)
    sub_t = np.full(m, UNALIGNED, dtype=np.int8)
    w = full  # backward rows: after n[j+1:] (reversed), over the reversed timeline
    for j in range(k - 1, -1, -1):
        f = _zero_prefix(rows[j], m)  # f[i] = F(j, i)
        b = _zero_prefix(w, m)[::-1]  # b[i] = B(j+1, i) = LCS(n[j+1:], t[i:])
        pos = np.asarray(positions[int(n[j])], dtype=np.int64)
        optimal = pos[f[pos] + 1 + b[pos + 1] == lcs]
        if len(optimal):
            sub_t[optimal] = np.maximum(sub_t[optimal], AMBIGUOUS)
            skippable = int((f + b).max()) == lcs
            if len(optimal) == 1 and not skippable:
                sub_to_t[j] = int(optimal[0])
                sub_n[j] = PINNED
            else:
                sub_n[j] = AMBIGUOUS
        u = w & backward_masks[int(n[j])]
        w = ((w + u) | (w - u)) & full
    sub_t[sub_to_t[sub_to_t >= 0]] = PINNED
    return sub_to_t, sub_n, sub_t, lcs
