"""Processes that used one pid in turn in an nsys export (docs/field-cases.md C25).

DataLoader workers re-spawned every epoch, or any short-lived child process, can get the pid of an earlier one.
nsys identifies a process by its pid alone (``globalPid``, and ``PROCESSES`` holds one row per pid, without
start time: checked on the real exports, docs/formats.md#nsys-identifiers), and CUPTI correlation ids restart
at 1 in every process, so ``(pid, correlation id)`` can name a launch call of each of those processes. Joined by
it, a kernel of the second process took the first one's launch call, and with it the first one's operator.

A process's *life* is known here by its pid and its first launch call (its first event among the calls the
reader keeps): within a pid, sorted by start, a call whose correlation id is not larger than the one before it and
that starts at least :data:`LIFE_GAP_NS` after every earlier call of the pid ended begins a new life (a process
hands out correlation ids in increasing order; a new one starts again from 1, after the old one exited and the
new one started and initialised CUDA). Two calls of one key in one life always have such a step between them (the
ids go up from the first and come back to it), so the rule separates every reuse it can; where the step comes
without the gap the key stays ambiguous. Lives are looked for only in a pid where two calls that do not overlap in
time carry one correlation id (a reuse: a backtrace copy of a call overlaps the call); every other export reads
exactly as before. Processes whose ids do not repeat need no separating: their keys are unique in the pid.

A GPU activity (kernel, graph launch, memcpy/memset) joins the launch call of its own life: the life whose first
call started before the activity (:data:`LIFE_SKEW_NS` of clock skew allowed). It is left without a launch call,
marked :data:`REFUSED`, when its process cannot be told: its key names two calls of one life (the lives could
not be separated), it starts within the skew allowance before its life's first call while the life before holds
its key too, or its key is found only in another life (its own call is missing, and the other life's is not its).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .model import shared_values

#: A new life's first launch call starts at least this long (ns) after every earlier call of the pid ended: between
#: them the old process exited and the new one started and initialised CUDA (tens of ms at the very least).
LIFE_GAP_NS = 1_000_000
#: A GPU activity this long (ns) before a life's first launch call may still be that life's (GPU/CPU clock skew is
#: sub-µs to several µs, docs/field-cases.md C17).
LIFE_SKEW_NS = 1_000_000
#: Lives told apart per pid; beyond, the later ones are one life, whose repeated keys stay ambiguous (refused).
MAX_LIVES = 127
#: The ``launch_refused`` value (and attribution reason) of an activity whose process life cannot be told.
REFUSED = "pid_reused"


def life_keys(proc, correlation_id) -> np.ndarray:
    """One int64 per (process life, correlation id): ``proc`` is :meth:`ProcessLives.proc` (31 bits), correlation ids
    32 bits; -1 where the id is null or <= 0 (such a row never joins)."""
    corr = pd.array(correlation_id, dtype="Int64").to_numpy(dtype=np.int64, na_value=0)
    keys = (np.asarray(proc, dtype=np.int64) << 32) | (corr & 0xFFFFFFFF)
    return np.where(corr > 0, keys, -1)


def repeated_calls(keys: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of rows carrying ``keys`` (in start order), those that repeat a key of an earlier row: ``(copies, reuses)``,
    bool arrays aligned with the rows. A copy overlaps in time the first row of its key (a backtrace duplicate of
    the call, schemas without ``eventClass``); a reuse does not (another call with the same key). Keys < 0 never
    repeat."""
    n = len(keys)
    copies, reuses = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    valid = np.flatnonzero(keys >= 0)
    if len(valid) < 2:
        return copies, reuses
    rows = valid[shared_values(keys[valid])]
    if not len(rows):
        return copies, reuses
    order = rows[np.argsort(keys[rows], kind="stable")]  # by key, then start (the rows' order)
    k = keys[order]
    first = np.r_[True, k[1:] != k[:-1]]
    first_row = order[np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))]
    overlap = start[order] <= end[first_row]
    copies[order[~first & overlap]] = True
    reuses[order[~first & ~overlap]] = True
    return copies, reuses


@dataclass
class ProcessLives:
    """The lives of the pids several processes used (:func:`find_lives`).

    ``starts``: pid -> the start (ns) of each life's first launch call, ascending (life 0 first), for every pid
    where calls repeat a correlation id (a pid whose lives could not be separated has one start). ``calls``:
    pid -> launch calls per life. ``ambiguous``: keys (:func:`life_keys`) that two calls of one life carry.
    """

    starts: dict[int, np.ndarray]
    calls: dict[int, list[int]]
    ambiguous: np.ndarray

    @staticmethod
    def proc(pid, life) -> np.ndarray:
        """The process-life id: ``life << 24 | pid`` (pid is 24 bits: docs/formats.md#nsys-identifiers); the pid itself
        for life 0."""
        return (np.asarray(life, dtype=np.int64) << 24) | np.asarray(pid, dtype=np.int64)

    @property
    def reused(self) -> dict[int, np.ndarray]:
        """The pids with more than one life, and their starts."""
        return {p: s for p, s in self.starts.items() if len(s) > 1}

    def life_at(self, pid: np.ndarray, times: np.ndarray, skew: int = LIFE_SKEW_NS) -> np.ndarray:
        """The life of each (pid, time in ns): the last life whose first launch call starts at or before
        ``time + skew``; 0 for a pid with one life and for a time before the pid's first call."""
        pid, times = np.asarray(pid, dtype=np.int64), np.asarray(times, dtype=np.int64)
        life = np.zeros(len(pid), dtype=np.int64)
        for p, starts in self.reused.items():
            mine = np.flatnonzero(pid == p)
            if len(mine):
                life[mine] = np.maximum(np.searchsorted(starts, times[mine] + skew, side="right") - 1, 0)
        return life

    def join(self, index: pd.Index, pid, correlation_id, times) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions in ``index`` (the launch calls' :func:`life_keys`) of each GPU activity's own launch call, given
        its ``pid``, ``correlation_id`` and start time (ns). Returns ``(position, life, refused)``: -1 where no call
        joins, the life each activity was placed in, and True where its life cannot be told (module docstring)."""
        pid = np.asarray(pid, dtype=np.int64)
        times = np.asarray(times, dtype=np.int64)
        corr = pd.array(correlation_id, dtype="Int64")
        life = self.life_at(pid, times)
        keys = life_keys(self.proc(pid, life), corr)
        position = index.get_indexer(keys) if len(index) else np.full(len(keys), -1, dtype=np.int64)
        position[keys < 0] = -1
        refused = pd.Series(keys, copy=False).isin(self.ambiguous).to_numpy(dtype=bool) & (keys >= 0)
        for p, starts in self.reused.items():
            mine = np.flatnonzero(pid == p)
            if not len(mine):
                continue
            mine_life, mine_corr = life[mine], corr[mine]

            def found(lives: np.ndarray) -> np.ndarray:
                at = life_keys(self.proc(p, lives), mine_corr)
                return (index.get_indexer(at) >= 0) & (at >= 0) if len(index) else np.zeros(len(at), dtype=bool)

            # before its life's first call (skew) while the life before has its key: either life's
            early = (mine_life >= 1) & (times[mine] < starts[mine_life]) & found(np.maximum(mine_life - 1, 0))
            # not in its own life but in another: its own call is missing, the other life's is not its call
            elsewhere = np.zeros(len(mine), dtype=bool)
            for other in range(len(starts)):
                elsewhere |= (mine_life != other) & found(np.full(len(mine), other))
            refused[mine] |= early | ((position[mine] < 0) & elsewhere)
        position[refused] = -1
        return position, life, refused


def find_lives(launches: pd.DataFrame) -> ProcessLives | None:
    """The lives of the pids of ``launches`` (the launch calls: ``pid``, ``start_ns``, ``end_ns``,
    ``correlation_id``, in start order) where two calls that do not overlap carry one correlation id; None when
    there is no such pid (then every pid is one process). See the module docstring for the rule."""
    pid = launches["pid"].to_numpy(dtype=np.int64)
    start = launches["start_ns"].to_numpy(dtype=np.int64)
    end = launches["end_ns"].to_numpy(dtype=np.int64)
    corr = pd.array(launches["correlation_id"], dtype="Int64")
    keys = life_keys(pid, corr)
    _, reuses = repeated_calls(keys, start, end)
    if not reuses.any():
        return None
    life = np.zeros(len(launches), dtype=np.int64)
    starts: dict[int, np.ndarray] = {}
    calls: dict[int, list[int]] = {}
    values = corr.to_numpy(dtype=np.int64, na_value=0)
    for p in np.unique(pid[reuses]).tolist():
        mine = np.flatnonzero((pid == p) & (keys >= 0))
        c, s, e = values[mine], start[mine], end[mine]
        gap = s[1:] - np.maximum.accumulate(e)[:-1]
        boundary = (np.flatnonzero((c[1:] <= c[:-1]) & (gap >= LIFE_GAP_NS)) + 1)[:MAX_LIVES]
        step = np.zeros(len(mine), dtype=np.int64)
        step[boundary] = 1
        life[mine] = np.cumsum(step)
        starts[p] = np.r_[s[:1], s[boundary]].astype(np.int64)
        calls[p] = np.bincount(life[mine], minlength=len(starts[p])).tolist()
    proc_keys = life_keys(ProcessLives.proc(pid, life), corr)
    _, still = repeated_calls(proc_keys, start, end)
    return ProcessLives(starts, calls, np.unique(proc_keys[still]))


def life_of_calls(launches: pd.DataFrame, lives: ProcessLives | None) -> np.ndarray:
    """The life of each launch call (0 everywhere without ``lives``): a call is in the last life of its pid that
    started at or before it."""
    if lives is None:
        return np.zeros(len(launches), dtype=np.int64)
    return lives.life_at(launches["pid"].to_numpy(dtype=np.int64), launches["start_ns"].to_numpy(dtype=np.int64),
                         skew=0)
