"""Results that no longer follow from their inputs after a failed, interrupted or partial run: found from
Snakemake's own record of what each output was made from, and removed, so the next run rebuilds them
instead of saying "Nothing to be done" over old reports.
Details: docs/modules.md#stale."""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

# Snakemake dates a directory output by this file inside it (a directory's own mtime changes with its content).
DIRECTORY_TIMESTAMP = ".snakemake_timestamp"


@dataclass(frozen=True)
class Made:
    """What one output was made from: its job's input files, and the checksums Snakemake recorded for them
    (``{path: "sha256:<hex>"}``)."""

    inputs: tuple[str, ...]
    checksums: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stale:
    """Why an output is stale: ``cause`` is the missing (``missing=True``) or changed workflow output it
    descends from."""

    cause: str
    missing: bool


def mtime(path: str | Path) -> float:
    """Modification time in s, as Snakemake dates the path: a directory by its timestamp file when it has one."""
    path = Path(path)
    stamp = path / DIRECTORY_TIMESTAMP
    return (stamp if path.is_dir() and stamp.is_file() else path).stat().st_mtime


def _sha256(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def find_stale(made: Mapping[str, Made], is_workflow_output: Callable[[str], bool],
               check_changed: bool = True) -> dict[str, Stale]:
    """The outputs of ``made`` (files or directory outputs, with what each was made from; those that do not
    exist are skipped) that descend from a missing or changed workflow output, each with its cause.

    ``is_workflow_output(path)``: whether a rule makes ``path`` (inputs that no rule makes, such as the library
    modules, are never a cause). ``check_changed=False`` (Snakemake run without its ``mtime`` rerun trigger)
    considers missing outputs only.
    """
    checksums: dict[str, str | None] = {}
    exists: dict[str, bool] = {}

    def changed(inp: str, out: str, recorded: str | None) -> bool:
        if mtime(inp) <= mtime(out):
            return False
        if recorded is None:
            return True
        if inp not in checksums:
            checksums[inp] = _sha256(inp)
        return checksums[inp] != recorded

    def root_cause(out: str, record: Made) -> Stale | None:
        for inp in record.inputs:
            if not is_workflow_output(inp):
                continue
            if inp not in exists:
                exists[inp] = os.path.lexists(inp)
            if not exists[inp]:
                return Stale(inp, missing=True)
            if check_changed and changed(inp, out, record.checksums.get(inp)):
                return Stale(inp, missing=False)
        return None

    made = {out: record for out, record in made.items() if os.path.lexists(out)}
    stale: dict[str, Stale] = {}
    for out, record in made.items():
        cause = root_cause(out, record)
        if cause is not None:
            stale[out] = cause
    # Everything made from a stale output is stale too, for the same cause.
    grew = bool(stale)
    while grew:
        grew = False
        for out, record in made.items():
            if out in stale:
                continue
            upstream = next((inp for inp in record.inputs if inp in stale), None)
            if upstream is not None:
                stale[out] = stale[upstream]
                grew = True
    return stale


def remove(paths: Iterable[str]) -> None:
    """Delete files and directory outputs (a directory output is removed whole)."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


def describe(stale: Mapping[str, Stale], action: str, shown: int = 12) -> str:
    """One line: how many outputs are stale, why (the missing and the changed results they were made from),
    which (``shown`` of them, the shallowest paths first: the reports before the intermediate tables), and
    ``action``: what was or will be done, e.g. "removed them; this run rebuilds them"."""
    outs = sorted(stale, key=lambda p: (len(Path(p).parts), p))
    listed = ", ".join(outs[:shown]) + (f" and {len(outs) - shown} more" if len(outs) > shown else "")
    missing = sorted({why.cause for why in stale.values() if why.missing})
    changed = sorted({why.cause for why in stale.values() if not why.missing})
    causes = []
    if missing:
        causes.append(f"{', '.join(missing)}, now missing (a job failed or was interrupted, or a file was deleted)")
    if changed:
        causes.append(f"{', '.join(changed)}, changed since")
    return f"stale results: {len(outs)} output(s) were made from {'; and from '.join(causes)}: {listed}; {action}"
