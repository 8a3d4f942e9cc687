"""Which catalog metrics the profiled GPU's chip has, asked of Nsight Compute before the first replay.

``ncu --metrics`` with a name the chip lacks fails the collection (older ncu: ``==ERROR== Failed to access the
following N metrics``) or leaves it empty (newer: ``==WARNING== Unable to access ...``), and the catalog holds
names of one architecture only (Hopper's ``*_gmma*``, Blackwell's ``*_subpipe_hmma*``). So the replay first asks
ncu which full metric names exist (:func:`query_command`: ``ncu --query-metrics-mode suffix --metrics <bases>``
for the local device, else for the chip the compute capability names), drops the names the answer lacks with a
visible warning, and records what was dropped in ``replay.json`` (``metrics``). The answer is cached per chip and
ncu version under the results folder (``results/ncu_metrics/<chip>.ncu-<version>.json``).

What ncu prints (docs/formats.md#ncu-metric-query, real output of ncu 2024.1.1): a header line ``Chip gh100``
(with ``--chips``) or ``Device NVIDIA A100-PCIE-40GB (GA100)`` (a local device), a dashed table of ``Metric Name,
Metric Type, Metric Unit, Metric Description`` with one full name per row (descriptions wrap onto indented
lines), bases that are not metrics listed after ``==WARNING== The below metrics are either invalid or don't have
suffixes.`` on one comma-separated line. Names without a rollup suffix (``launch__registers_per_thread``,
``sm__maximum_warps_per_active_cycle_pct``: launch and occupancy attributes) are not in that query at all: they
are kept unchecked, never dropped for it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

from ..files import write_json

log = logging.getLogger(__name__)

NCU = "ncu"
QUERY_TIMEOUT_S = 120
CACHE_FORMAT = "opprof.ncu_metrics/1"
_METRIC = re.compile(r"^[A-Za-z0-9_.]*[a-z0-9]__[A-Za-z0-9_.]+$")
_DEVICE_HEADER = re.compile(r"^Device (?P<name>.+) \((?P<chip>[A-Za-z0-9_]+)\)\s*$")
_CHIP_HEADER = re.compile(r"^Chip (?P<chip>[A-Za-z0-9_]+)\s*$")
_INVALID = "The below metrics are either invalid or don't have suffixes"
#: The chip ncu calls a compute capability's flagship die (``ncu --list-chips``): used only when the query of
#: the local device fails; chips of one capability share their metric names.
CHIP_FOR_CC = {(7, 0): "gv100", (7, 5): "tu102", (8, 0): "ga100", (8, 6): "ga102", (8, 7): "ga10b",
               (8, 9): "ad102", (9, 0): "gh100", (10, 0): "gb100", (12, 0): "gb202"}


def base_name(name: str) -> str:
    """``sm__throughput.avg.pct_of_peak_sustained_elapsed`` -> ``sm__throughput``."""
    return name.split(".", 1)[0]


def checkable(name: str) -> bool:
    """Whether ``--query-metrics`` can answer for ``name``: only names with a rollup suffix (``.sum``, ``.avg...``,
    ``.pct``, ``.ratio``); launch and occupancy attributes have none and are not listed by the query."""
    return "." in name


def query_command(bases: list[str], device: int | str | None = None, chip: str | None = None) -> list[str]:
    """``ncu --query-metrics-mode suffix --metrics <bases> (--devices N | --chips CHIP)``: every full name of
    each base metric on that device or chip (Nsight Compute CLI guide, ``--query-metrics-mode``)."""
    where = ["--chips", chip] if chip else (["--devices", str(device)] if device is not None else [])
    return [NCU, "--query-metrics-mode", "suffix", "--metrics", ",".join(bases), *where]


def parse_query_output(text: str) -> dict:
    """Parse ``ncu --query-metrics[-mode suffix]`` text output.

    Returns ``{"chips": [chip, ...] (lower case, one per table), "device": name or None, "names": set of metric
    names listed (first column), "invalid": [names ncu called invalid or suffix-less]}``. Description lines that
    wrap (indented), dashed rules, the column heading and ``==PROF==`` notes are skipped."""
    chips: list[str] = []
    device = None
    names: set[str] = set()
    invalid: list[str] = []
    expect_invalid = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        if expect_invalid:  # one comma-separated line; a list wrapped after a comma goes on on the next line
            tokens = [n.strip() for n in line.split(",") if n.strip()]
            if tokens and all(re.fullmatch(r"[A-Za-z0-9_.]+", t) for t in tokens):
                invalid += tokens
                expect_invalid = line.rstrip().endswith(",")
                continue
            expect_invalid = False
        if line.startswith("=="):
            expect_invalid = _INVALID in line
            continue
        if line[0].isspace() or line.startswith("---") or line.startswith("Metric Name"):
            continue
        found = _DEVICE_HEADER.match(line)
        if found:
            device = found["name"]
            chips.append(found["chip"].lower())
            continue
        found = _CHIP_HEADER.match(line)
        if found:
            chips.append(found["chip"].lower())
            continue
        token = line.split(None, 1)[0].rstrip(".")  # (no metric name ends with a period)
        if _METRIC.match(token):
            names.add(token)
    return {"chips": chips, "device": device, "names": names, "invalid": invalid}


def _run(cmd: list[str], timeout_s: float) -> tuple[int, str]:
    from ..tool_runs import run_tool

    done = run_tool(cmd, timeout_s)
    return done.code, done.text + (f"\n{done.said()}" if done.timed_out or done.error else "")


def _cache_path(cache_dir: Path, chip: str, ncu_version: str | None) -> Path:
    return Path(cache_dir) / f"{chip}.ncu-{ncu_version or 'unknown'}.json"


def _cached(cache_dir: Path | None, chip: str | None, ncu_version: str | None, bases: set[str]) -> dict | None:
    if cache_dir is None or chip is None:
        return None
    path = _cache_path(cache_dir, chip, ncu_version)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if entry.get("format") != CACHE_FORMAT or not bases <= set(entry.get("bases") or []):
        return None  # another layout, or the catalog asks for bases that were not queried then
    return {**entry, "cache": str(path), "from_cache": True}


def query_metrics(bases: list[str], device: int | str | None, cc: tuple[int, int] | None, ncu_version: str | None,
                  cache_dir: Path | None = None, gpu_name: str | None = None,
                  timeout_s: float = QUERY_TIMEOUT_S) -> dict:
    """The full metric names ncu knows for the profiled GPU, for the base metrics ``bases``.

    Asks the local device first (``--devices``), then, when that fails (no driver access, an older ncu), the chip
    :data:`CHIP_FOR_CC` gives for ``cc``, each within ``timeout_s`` seconds together. An answer that lists neither a
    full name nor an "invalid" entry for some queried base is incomplete (cut short) and is an error, never cached.
    A cached answer for the same chip, ncu version and bases is reused (the chip is known before the query only
    through ``cc``). Returns ``{"chip", "chip_source", "ncu_version",
    "device", "command", "names" (sorted list), "invalid", "bases", "cache", "from_cache"}``, or ``{"error":
    text, "commands": [...]}`` when ncu could not answer (the replay then keeps every name and says so)."""
    wanted = set(bases)
    guessed = CHIP_FOR_CC.get(tuple(cc)) if cc else None
    hit = _cached(cache_dir, guessed, ncu_version, wanted)
    if hit is not None:
        return hit
    if shutil.which(NCU) is None:
        return {"error": f"'{NCU}' is not on PATH", "commands": []}
    attempts = [("device", query_command(sorted(wanted), device=device))] if device is not None else []
    if guessed:
        attempts.append((f"compute capability {cc[0]}.{cc[1]}", query_command(sorted(wanted), chip=guessed)))
    errors = []
    import time

    deadline = time.monotonic() + timeout_s
    for source, cmd in attempts:
        left = deadline - time.monotonic()
        if left <= 0:
            errors.append(f"`{' '.join(cmd[:3])} ... {' '.join(cmd[-2:])}`: not run, no time left")
            continue
        code, text = _run(cmd, left)
        parsed = parse_query_output(text) if code == 0 else None
        unanswered = sorted(b for b in wanted if parsed and b not in {base_name(n) for n in parsed["names"]}
                            and b not in set(parsed["invalid"]))
        if not parsed or not parsed["chips"] or not parsed["names"] or unanswered:
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            said = next((ln for ln in lines if ln.startswith("==ERROR==")), lines[-1] if lines else "no output")
            if parsed and parsed["names"] and unanswered:
                said = (f"an incomplete answer: {len(unanswered)} queried base(s) neither listed nor called invalid "
                        f"({', '.join(unanswered[:3])}{', ...' if len(unanswered) > 3 else ''})")
            errors.append(f"`{' '.join(cmd[:3])} ... {' '.join(cmd[-2:])}` (exit {code}): {said}")
            continue
        chip = parsed["chips"][0]
        entry = {"format": CACHE_FORMAT, "chip": chip, "chip_source": source, "ncu_version": ncu_version,
                 "device": parsed["device"] or gpu_name, "command": cmd, "bases": sorted(wanted),
                 "names": sorted(parsed["names"]), "invalid": parsed["invalid"]}
        path = None
        if cache_dir is not None:
            path = _cache_path(cache_dir, chip, ncu_version)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, entry)
        return {**entry, "cache": str(path) if path else None, "from_cache": False}
    return {"error": "; ".join(errors) or "no device or chip to query", "commands": [c for _, c in attempts]}


def check_metrics(requested: list[str], device: int | str | None, cc: tuple[int, int] | None,
                  ncu_version: str | None, cache_dir: Path | None = None, gpu_name: str | None = None,
                  timeout_s: float = QUERY_TIMEOUT_S) -> dict:
    """Split ``requested`` (catalog order) into the names to collect and those the chip lacks.

    Returns the ``replay.json`` ``metrics`` record: ``requested``, ``collect`` (requested minus ``dropped``),
    ``dropped`` ([{name, reason}]: checkable names the query did not list), ``unchecked`` (names without a rollup
    suffix, :func:`checkable`), ``query`` (chip, ncu version, command, cache file, or the error), ``warnings``
    (one line listing the dropped names, or saying the check could not run)."""
    bases = sorted({base_name(n) for n in requested if checkable(n)})
    answer = (query_metrics(bases, device, cc, ncu_version, cache_dir, gpu_name, timeout_s) if bases
              else {"error": "nothing to check"})
    record = {"requested": list(requested), "collect": list(requested), "dropped": [],
              "unchecked": [n for n in requested if not checkable(n)], "warnings": []}
    if "error" in answer:
        record["query"] = {"error": answer["error"], "commands": answer.get("commands", [])}
        record["warnings"].append(f"the chip's metrics could not be queried ({answer['error']}): every catalog name "
                                  "is requested; names ncu cannot access are dropped after its first answer")
        return record
    known = set(answer["names"])
    record["query"] = {k: answer.get(k) for k in ("chip", "chip_source", "ncu_version", "device", "command", "cache",
                                                   "from_cache")}
    lacking = [n for n in requested if checkable(n) and n not in known]
    if lacking:
        record["dropped"] = [{"name": n, "reason": f"not a metric of chip {answer['chip']} (ncu {ncu_version})"}
                             for n in lacking]
        record["collect"] = [n for n in requested if n not in set(lacking)]
        record["warnings"].append(f"{len(lacking)} catalog metric(s) do not exist on chip {answer['chip']} and are not "
                                  f"collected: {', '.join(lacking)}")
        log.warning("replay_ncu: %s", record["warnings"][-1])
    return record


# ------------------------------------------------------------------------------ what a replay said about metrics

_UNABLE = re.compile(r"(?:Unable|Failed) to access the following (?:\d+ )?metrics?:?\s*(?P<names>.*)")
_NOT_FOUND = re.compile(r"Failed to find metric\s+(?P<name>.+?)\s*$")


def _listed(names: str) -> list[str]:
    """The names of ``a, b, c.`` up to the end of that sentence (the MIG variant adds one after it)."""
    cut = re.split(r"\.\s", names + " ", maxsplit=1)[0]
    return [n.strip().strip("'\"").rstrip(".") for n in cut.split(",") if n.strip()]


def _named_by(name: str, requested: list[str]) -> list[str]:
    """The requested names one ``Failed to find metric NAME`` line names: NAME itself, or those its ``regex:`` form
    matches (ncu's regexes here are plain ECMAScript ones, read with Python's ``re``; one that does not compile
    falls back to its leading base name)."""
    name = name.strip().strip("'\"")
    if not name.startswith("regex:"):
        name = name.strip("'\". ")
        return [name] if name in requested else []
    pattern = name.removeprefix("regex:")
    try:
        compiled = re.compile(pattern)
    except re.error:
        base = pattern.lstrip("^(").split("\\.", 1)[0].split("(", 1)[0].split("|", 1)[0]
        return [n for n in requested if base_name(n) == base]
    return [n for n in requested if compiled.search(n)]


def inaccessible_metrics(output: str, requested: list[str]) -> dict:
    """Metric names an ncu collection's output says it could not collect.

    ``{"unable": [...]}`` from ``==WARNING== Unable to access the following N metrics: a, b.`` (newer ncu: the
    collection went on without them) and ``==ERROR== Failed to access the following N metrics: a, b`` (older ncu:
    the collection failed), ``{"not_found": [...]}`` from ``==ERROR== Failed to find metric NAME`` (NAME may be
    ``regex:^base\\.(sum|...)$``, matched against the requested names): only ``requested`` names ncu named, never
    another. Source: real ncu output (docs/formats.md#ncu-errors)."""
    wanted = set(requested)
    unable: list[str] = []
    not_found: list[str] = []
    for line in output.splitlines():
        found = _UNABLE.search(line)
        if found:
            unable += [n for n in _listed(found["names"]) if n in wanted]
            continue
        found = _NOT_FOUND.search(line)
        if found:
            not_found += _named_by(found["name"], requested)
    return {"unable": list(dict.fromkeys(unable)), "not_found": list(dict.fromkeys(not_found))}
