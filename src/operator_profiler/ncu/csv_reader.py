"""Read Nsight Compute ``ncu --csv`` output (details or raw page, any ncu version seen) into one long,
normalised table: ids, process, device, kernel name, launch configuration, metric, value in base units;
refusing what it cannot read (errors of a failed run, a non-numeric metric) in one line.
Details: docs/modules.md#ncu-csv-reader."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from ..errors import NcuCsvError

__all__ = ["KERNEL_COLUMNS", "LONG_COLUMNS", "NcuCsvError", "normalize_unit", "read_ncu_csv", "wide_metrics"]

#: Columns of :func:`read_ncu_csv`'s result, in order.
LONG_COLUMNS = ["ncu_id", "pid", "device", "name", "stream", "grid", "block", "section", "metric", "value", "text", "unit",
                "raw_unit"]
#: Per-kernel columns kept by :func:`wide_metrics`.
KERNEL_COLUMNS = ["ncu_id", "pid", "device", "name", "stream", "grid", "block"]

# Identity (non-metric) columns of both pages (docs/formats.md#ncu-pages, #ncu-nvtx-columns); NVTX columns are matched by substring.
_IDENTITY = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time", "Context", "Stream",
             "Block Size", "Grid Size", "Device", "CC"}
_DETAILS = {"Section Name", "Metric Name", "Metric Unit", "Metric Value"}
_RULE_COLS = ["Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup"]
_TOOL_LINE = re.compile(r"^==[A-Z]+==")
#: Base units (``normalize_unit``) whose values are amounts: a negative one is a damaged file, not a measurement
#: (a duration, a byte count, a cycle count).
_NEVER_NEGATIVE = {"second": "a duration", "byte": "a byte count", "cycle": "a cycle count"}

PERMISSION_URL = "https://developer.nvidia.com/ERR_NVGPUCTRPERM"


# ---------------------------------------------------------------- units (docs/formats.md#ncu-units)

_PREFIX = {"": 1.0, "n": 1e-9, "u": 1e-6, "µ": 1e-6, "m": 1e-3, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
# base word -> normalised name; words that take SI prefixes
_SCALABLE = {"byte": "byte", "second": "second", "hz": "hz", "Hz": "hz", "cycle": "cycle", "inst": "inst",
             "warp": "warp", "block": "block", "thread": "thread", "sector": "sector", "request": "request",
             "wavefront": "wavefront", "register": "register", "transaction": "transaction"}
_ALIASES = {"ns": ("second", 1e-9), "us": ("second", 1e-6), "µs": ("second", 1e-6), "ms": ("second", 1e-3),
            "s": ("second", 1.0), "sec": ("second", 1.0), "B": ("byte", 1.0), "KB": ("byte", 1e3),
            "MB": ("byte", 1e6), "GB": ("byte", 1e9), "TB": ("byte", 1e12)}


def _unit_part(part: str) -> tuple[str, float]:
    if part in _ALIASES:
        return _ALIASES[part]
    for word, base in _SCALABLE.items():
        if part.endswith(word) and part[: -len(word)] in _PREFIX:
            return base, _PREFIX[part[: -len(word)]]
    return part, 1.0


def normalize_unit(raw_unit: str) -> tuple[str, float]:
    """Map a unit as ncu prints it to ``(base unit, factor)``; ``value_in_base = printed_value * factor``.

    ``nsecond``/``ns``/``usecond``/``msecond`` -> ``second``; ``Kbyte``/``Mbyte`` (SI 1000) -> ``byte``;
    ``cycle/second``, ``hz``, ``Ghz``, ``cycle/nsecond`` -> ``hz``; ``Gbyte/second`` -> ``byte/second``;
    ``register/thread``, ``byte/block``, ``%``, ``inst`` etc. keep their names (docs/formats.md#ncu-units). Unknown -> (as is, 1).
    """
    u = (raw_unit or "").strip()
    if not u or u == "%":
        return u, 1.0
    parts = u.split("/")
    if len(parts) > 2:
        return u, 1.0
    num, f = _unit_part(parts[0])
    if len(parts) == 2:
        den, g = _unit_part(parts[1])
        f /= g
        if num == "cycle" and den == "second":
            return "hz", f
        return f"{num}/{den}", f
    return num, f


# ---------------------------------------------------------------- numbers (docs/formats.md#ncu-numbers)

_NUMLIKE = re.compile(r"^[+-]?[\d.,]*\d[\d.,]*$")
_LEADING = re.compile(r"^\s*([+-]?[\d.,]*\d)\s*(?:\(|;)")  # instanced "158 (0: 158)" / "a; b; c"
_SCIENTIFIC = re.compile(r"^[+-]?\d+(\.\d+)?[eE][+-]?\d+$")  # not seen in ncu output; accepted defensively
_MISSING = {"", "n/a", "N/A", "nan", "NaN"}


def _detect_locale(cells: list[str]) -> tuple[str, str]:
    """Return ``(group, decimal)`` separators for a file from its number-like cells.

    Evidence for ``,`` grouping / ``.`` decimal: ``1,234.5``, ``1,234,567``, ``12.5`` (a ``.`` not followed by
    exactly three digits). Evidence for ``.`` grouping / ``,`` decimal: ``1.234,5``, ``2.508.800``, ``12,5``.
    ``1,234`` or ``1.234`` alone is ambiguous. No evidence -> ``(",", ".")`` (every real file, docs/formats.md#ncu-numbers).
    """
    en = de = None
    for c in cells:
        if "," in c and "." in c:
            if c.rfind(".") > c.rfind(","):
                en = en or c
            else:
                de = de or c
        elif c.count(",") > 1:
            en = en or c
        elif c.count(".") > 1:
            de = de or c
        elif "." in c and not re.search(r"\.\d{3}$", c):
            en = en or c
        elif "," in c and not re.search(r",\d{3}$", c):
            de = de or c
        if en and de:
            break
    if de and not en:
        return ".", ","
    if en and de:
        raise ValueError(f"both {en!r} (1,234.5 style) and {de!r} (1.234,5 style)")
    return ",", "."


_COUNT_UNITS = {"byte", "inst", "cycle", "sector", "request", "wavefront", "warp", "thread", "block", "register",
                "transaction"}


def _is_count(metric: str, unit: str) -> bool:
    """A ``.sum`` counter in a base count unit (``dram__bytes.sum`` in ``byte``): its value is a whole number."""
    return str(metric).strip().endswith(".sum") and str(unit).strip() in _COUNT_UNITS


def _count_evidence(cells: list[str]) -> list[str]:
    """Whole-number cells read as locale evidence: ``4.096`` of a byte count can only be 4,096 (``.`` groups).
    Returned as unambiguous spellings for :func:`_detect_locale`."""
    out = []
    for c in cells:
        c = c.strip()
        if re.fullmatch(r"\d{1,3}(?:\.\d{3})+", c):
            out.append(c + ",0")  # 1.234 of a count: 1.234,0 is the same reading
        elif re.fullmatch(r"\d{1,3}(?:,\d{3})+", c):
            out.append(c + ".0")
    return out


def _to_float(cell: str, group: str, decimal: str) -> float | None:
    """Parse one cell; ``None`` when it is not a number (text value)."""
    s = cell.strip()
    if s in _MISSING:
        return math.nan
    m = _LEADING.match(s)
    if m:
        s = m.group(1)
    if _SCIENTIFIC.match(s):
        return float(s)
    if not _NUMLIKE.match(s):
        return None
    s = s.replace(group, "").replace(decimal, ".")
    try:
        return float(s)
    except ValueError:
        return None


# ---------------------------------------------------------------- reading


#: What ``ncu --csv`` prints first on both pages (the details page then ends in Section Name, Metric Name, Metric
#: Unit, Metric Value; the raw page has one column per metric), named in errors.
EXPECTED_HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name",...'


def _check_header(path: Path, lineno: int, col: dict) -> None:
    """The columns every row needs: ``Kernel Name`` (names are how rows meet kernels) spelled as ncu spells it.

    Raises:
        NcuCsvError: naming the file, the header line, the missing column and the expected header.
    """
    if "Kernel Name" in col:
        return
    near = [h for h in col if h.lower().replace("_", " ") in ("kernel name", "function name", "name", "kernel")]
    seen = f" (it has {', '.join(repr(h) for h in near)})" if near else ""
    raise _err(path, f"line {lineno}, the header", f"no 'Kernel Name' column{seen}",
               "Pass the CSV as ncu writes it (ncu -i run.ncu-rep --csv --page raw, column names as ncu spells "
               f"them); the expected header starts {EXPECTED_HEADER}")


def _err(path: Path, where: str, what: str, fix: str) -> NcuCsvError:
    return NcuCsvError(f"{path}: {where}: {what}. {fix}")


def _failed_run_error(path: Path, tool_lines: list[tuple[int, str]]) -> NcuCsvError | None:
    errors = [(n, ln) for n, ln in tool_lines if ln.startswith("==ERROR==") or "ERR_" in ln]
    if not errors:
        return None
    n, first = errors[0]
    said = first.strip()
    if any("ERR_NVGPUCTRPERM" in ln for _, ln in errors):
        fix = (f"ncu was not allowed to read the GPU performance counters (ERR_NVGPUCTRPERM). Re-run ncu with "
               f"permission to access GPU performance counters: as root / with sudo, in a container started with "
               f"--cap-add=SYS_ADMIN, or after an administrator enables counter access for all users (driver option "
               f"NVreg_RestrictProfilingToAdminUsers=0); see {PERMISSION_URL}. If locking clocks is also refused, "
               f"pin clocks with nvidia-smi and pass --clock-control none (docs/DESIGN.md §3, ncu)")
    else:
        fix = "Fix what ncu reported and re-run the profile; this file holds no results"
    return _err(path, f"line {n}", f"this is the output of a failed ncu run, ncu reported: {said!r}", fix)


def _lines(text: str, start: int, tool_lines: list[tuple[int, str]], cur: list[int]) -> Iterator[str]:
    """Yield physical lines from index ``start``, skipping ``==XXX==`` lines; ``cur[0]`` = 1-based line number."""
    for i, line in enumerate(text.splitlines(keepends=True)[start:], start=start + 1):
        if _TOOL_LINE.match(line):
            tool_lines.append((i, line.rstrip("\r\n")))
            continue
        cur[0] = i
        yield line


def _dims(cell: str) -> str | None:
    """``"(384, 1, 1)"`` -> ``"384,1,1"`` (docs/formats.md#ncu-pages Block Size / Grid Size)."""
    if cell is None:
        return None
    s = cell.strip().strip("()[]").replace(" ", "")
    return s or None


def _int_or_none(cell: str | None):
    if cell is None:
        return None
    s = cell.strip().replace(",", "")
    return int(s) if re.fullmatch(r"-?\d+", s) else (cell.strip() or None)


def read_ncu_csv(path) -> pd.DataFrame:
    """Read an ``ncu --csv`` file (``--page details`` or ``--page raw``) into a long, normalised DataFrame.

    One row per (profiled result, metric). Columns (:data:`LONG_COLUMNS`):

    * ``ncu_id`` (int): the ncu ``ID`` column, 0-based profiling order, global across kernel names (docs/formats.md#ncu-id).
    * ``pid`` (Int64, null if no ``Process ID`` column), ``device`` (Int64: the ``Device`` column, the CUDA
      ordinal as the process sees it; null in the 2021-era layout, which lacks it), ``name`` (``Kernel Name`` as printed),
      ``stream`` (Int64 when numeric), ``grid``/``block`` (``"x,y,z"`` from ``Grid Size``/``Block Size``; null in
      the 2021-era ``Kernel Time`` layout, which lacks them, docs/formats.md#ncu-pages).
    * ``section``: ``Section Name`` (details page; e.g. ``Command line profiler metrics``), null on the raw page.
    * ``metric``: as ncu spells it (raw metric name, or the label such as ``Duration`` on the details page).
    * ``value`` (float): in ``unit``; NaN for ``n/a``, empty or text values. ``text``: the cell as printed.
    * ``unit``: normalised base unit (:func:`normalize_unit`); ``raw_unit``: the unit as printed.

    ``df.attrs``: ``"source"`` (path), ``"page"`` (``"details"``/``"raw"``), ``"locale"`` (grouping, decimal),
    ``"rules"`` (list of dicts: ncu_id, section, rule, type, description, speedup_type, speedup; details page),
    ``"compute_capability"`` (device ordinal, or None without a ``Device`` column -> the ``CC`` cell as printed,
    e.g. ``"12.0"``; empty without a ``CC`` column).
    Rows are sorted by ``ncu_id`` (stable: file order within one result).

    Raises:
        NcuCsvError: empty file, no CSV header, output of a failed ncu run (``==ERROR==``, ERR_NVGPUCTRPERM),
            a row whose ID is not an integer, mixed number locales, or a non-number in a metric with a unit.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise NcuCsvError(f"{path}: cannot read the ncu CSV ({e.strerror or e}). Check the path given.") from e
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff")
    if not text.strip():
        raise _err(path, "line 1", "the file is empty",
                   "Re-export it with `ncu -i run.ncu-rep --csv --page raw --print-units base > file.csv`; with "
                   "-o/--export and no --page, ncu prints nothing (docs/DESIGN.md §3, ncu)")
    all_lines = text.splitlines()
    header_idx = None
    for i, line in enumerate(all_lines):
        if _TOOL_LINE.match(line):
            continue
        try:
            first = next(csv.reader([line]))
        except csv.Error:
            continue
        if first and first[0].strip() == "ID" and len(first) > 1:
            header_idx = i
            break
    pre_tool = [(i + 1, ln) for i, ln in enumerate(all_lines[: header_idx if header_idx is not None else None])
                if _TOOL_LINE.match(ln)]
    if header_idx is None:
        failed = _failed_run_error(path, pre_tool)
        if failed:
            raise failed
        raise _err(path, f"lines 1-{len(all_lines)}",
                   'no ncu CSV header (a line starting with "ID",) was found',
                   "Pass the output of `ncu --csv` (details or raw page), not the console report; "
                   f"the expected header starts {EXPECTED_HEADER}")

    tool_lines: list[tuple[int, str]] = list(pre_tool)
    cur = [header_idx + 1]
    reader = csv.reader(_lines(text, header_idx, tool_lines, cur))
    header = [h.strip() for h in next(reader)]
    col = {h: i for i, h in enumerate(header)}
    _check_header(path, header_idx + 1, col)
    rows: list[tuple[int, list[str]]] = []
    for r in reader:
        if not r or all(not c.strip() for c in r):
            continue
        rows.append((cur[0], r + [""] * (len(header) - len(r))))  # ragged rows (docs/formats.md#ncu-pages)
    page = "details" if _DETAILS <= set(col) else "raw"

    def cell(r, name):
        i = col.get(name)
        return r[i] if i is not None else None

    units_row = None
    if page == "raw" and rows and not rows[0][1][col["ID"]].strip():
        units_row = rows.pop(0)[1]  # docs/formats.md#ncu-pages: second row = units
    if not rows:
        failed = _failed_run_error(path, tool_lines)
        if failed:
            raise failed
        raise _err(path, f"line {header_idx + 1}", "the CSV header has no result rows: ncu profiled no kernel",
                   "Check the kernel/NVTX filters (-k, --nvtx-include needs a trailing '/' for push/pop ranges, "
                   "docs/DESIGN.md §3, ncu) and that the workload launched kernels")

    unnamed = [lineno for lineno, r in rows if not r[col["Kernel Name"]].strip()
               and not (page == "details" and not (cell(r, "Metric Name") or "").strip())]
    if unnamed:
        raise _err(path, f"line {unnamed[0]}, field 'Kernel Name'",
                   f"{len(unnamed)} of {len(rows)} rows have an empty kernel name",
                   "Without it no row can be matched to a kernel: export the CSV as ncu writes it "
                   f"(ncu -i run.ncu-rep --csv --page raw); the expected header starts {EXPECTED_HEADER}")
    for lineno, r in rows:
        if not re.fullmatch(r"\d+", r[col["ID"]].strip()):
            raise _err(path, f"line {lineno}, field ID", f"{r[col['ID']]!r} is not a result ID (an integer)",
                       "The CSV is corrupted or application output is mixed into it; write ncu's CSV to its own "
                       "file with --log-file or redirect the application's stdout (docs/DESIGN.md §3, ncu)")
    previous, seen = -1, {}
    for lineno, r in rows:  # ncu writes results in ID order; an ID that goes back starts another run's output
        current = int(r[col["ID"]])
        if current < previous:
            raise _err(path, f"line {lineno}, field ID", f"ID {current} follows ID {previous}: the IDs start again, "
                       "so this file holds the output of more than one ncu run (concatenated)",
                       "Pass each run's CSV as a file of its own (opprof ncu A.csv B.csv), so that no result is "
                       "merged with another run's result of the same ID")
        previous = current
        if page == "details" and not (cell(r, "Metric Name") or "").strip():
            continue  # a rule row (its Stream cell can differ from its result's, seen in real 2021-era files)
        # one result per ID: its kernel (and on the details page each section's metric) once
        identity = tuple(cell(r, c) for c in ("Process ID", "Kernel Name", "Grid Size", "Block Size", "Device",
                                              "Stream"))
        entry = (current, cell(r, "Section Name"), cell(r, "Metric Name")) if page == "details" else (current,)
        if seen.get(current, identity) != identity or entry in seen:
            raise _err(path, f"line {lineno}, field ID", f"ID {current} names more than one result",
                       "Each ncu result has an ID of its own; this file numbers two results alike (per process, or "
                       "merged by hand): pass each run's CSV as a file of its own, as ncu wrote it")
        seen.setdefault(current, identity)
        seen[entry] = True

    if page == "details":
        value_cells = [r[col["Metric Value"]] for _, r in rows]
        counts = [r[col["Metric Value"]] for _, r in rows if _is_count(r[col["Metric Name"]], r[col["Metric Unit"]])]
    else:
        metric_cols = [h for h in header if h not in _IDENTITY and "Push/Pop_Range" not in h
                       and "Start/Stop_Range" not in h and h]
        value_cells = [r[col[m]] for _, r in rows for m in metric_cols]
        counts = [r[col[m]] for _, r in rows for m in metric_cols
                  if _is_count(m, units_row[col[m]] if units_row else "")]
    cells = [c.strip() for c in value_cells if _NUMLIKE.match(c.strip())]
    try:
        group, decimal = _detect_locale(cells + _count_evidence(counts))
    except ValueError as e:
        raise _err(path, "Metric Value cells", f"numbers use two different digit-grouping conventions ({e})",
                   "Export the whole report in one locale, e.g. `LC_ALL=C ncu -i run.ncu-rep --csv ...` "
                   "(docs/DESIGN.md §3, ncu)") from None

    out: list[tuple] = []
    rules: list[dict] = []

    compute_capability: dict = {}

    def kernel(r):
        device = _int_or_none(cell(r, "Device"))
        cc = (cell(r, "CC") or "").strip()
        if cc:
            compute_capability.setdefault(device, cc)
        return (int(r[col["ID"]]), _int_or_none(cell(r, "Process ID")), device, cell(r, "Kernel Name"),
                _int_or_none(cell(r, "Stream")), _dims(cell(r, "Grid Size")), _dims(cell(r, "Block Size")))

    def add(lineno, r, k, section, metric, txt, raw_unit, field):
        unit, factor = normalize_unit(raw_unit)
        v = _to_float(txt, group, decimal)
        if v is None and txt.strip().lower().lstrip("+-") in ("inf", "infinity"):
            v = math.inf  # refused below, as 1e400 is
        if v is None:
            if unit:  # a unit means ncu printed a number here
                raise _err(path, f"line {lineno}, field {field!r} (metric {metric!r}, ID {k[0]})",
                           f"{txt!r} is not a number but the metric has unit {raw_unit!r}",
                           "The file is damaged or not ncu output; re-export it with `ncu -i run.ncu-rep --csv "
                           "--print-units base` (docs/DESIGN.md §3, ncu)")
            v = math.nan
        where = f"line {lineno}, field {field!r} (metric {metric!r}, ID {k[0]})"
        if math.isinf(v) or (not math.isnan(v) and math.isinf(v * factor)):
            raise _err(path, where, f"{txt!r} is not a finite number",
                       "ncu prints finite values only: the file is damaged or was edited: re-export it with "
                       "`ncu -i run.ncu-rep --csv --print-units base`")
        if v < 0 and unit in _NEVER_NEGATIVE:
            raise _err(path, where, f"{txt!r} is negative, which {_NEVER_NEGATIVE[unit]} cannot be",
                       "The file is damaged or was edited: re-export it with `ncu -i run.ncu-rep --csv "
                       "--print-units base`")
        out.append((*k, section, metric, v * factor if not math.isnan(v) else v, txt, unit, raw_unit))

    if page == "details":
        for lineno, r in rows:
            k = kernel(r)
            metric = r[col["Metric Name"]]
            if not metric.strip():
                rule = {c: cell(r, c) for c in _RULE_COLS}
                if any(rule.values()):
                    rules.append({"ncu_id": k[0], "section": r[col["Section Name"]], "rule": rule["Rule Name"],
                                  "type": rule["Rule Type"], "description": rule["Rule Description"],
                                  "speedup_type": rule["Estimated Speedup Type"],
                                  "speedup": _to_float(rule["Estimated Speedup"] or "", group, decimal)})
                continue
            add(lineno, r, k, r[col["Section Name"]], metric, r[col["Metric Value"]], r[col["Metric Unit"]],
                "Metric Value")
    else:
        for lineno, r in rows:
            k = kernel(r)
            for m in metric_cols:
                add(lineno, r, k, None, m, r[col[m]], units_row[col[m]] if units_row else "", m)

    df = pd.DataFrame(out, columns=LONG_COLUMNS)
    df = df.sort_values("ncu_id", kind="stable").reset_index(drop=True)  # ncu writes ID order; keep it guaranteed
    df["ncu_id"] = df["ncu_id"].astype("int64")
    for c in ("pid", "device", "stream"):
        if df[c].map(lambda x: x is None or isinstance(x, int)).all():
            df[c] = df[c].astype("Int64")
    df["value"] = df["value"].astype("float64")
    ambiguous = [c for c in cells if re.fullmatch(r"\d{1,3}[.,]\d{3}", c)]
    guessed = bool(ambiguous) and not any(not re.fullmatch(r"\d{1,3}[.,]\d{3}|\d+", c) for c in cells) \
        and not _count_evidence(counts)
    df.attrs.update({"source": str(path), "page": page, "locale": (group, decimal), "rules": rules,
                     "locale_guessed": ambiguous[0] if guessed else None,
                     "compute_capability": compute_capability})
    return df


def wide_metrics(long_df: pd.DataFrame) -> pd.DataFrame:
    """One row per ``ncu_id`` (ascending): :data:`KERNEL_COLUMNS`, then one column per metric name (base units).

    Text-valued metrics are NaN here (their text stays in the long table). ``df.attrs["units"]`` maps each metric
    column to its base unit. A metric name that occurs in several sections for one result (labels such as
    ``Duration`` on a details page) is named ``"<section>: <metric>"`` instead, to keep the values apart.
    """
    df = long_df.copy()
    dup = df.duplicated(["ncu_id", "metric"], keep=False)
    if dup.any():
        clash = set(df.loc[dup, "metric"])
        df["metric"] = [f"{s}: {m}" if m in clash else m for s, m in zip(df["section"], df["metric"])]
    kernels = df.drop_duplicates("ncu_id")[KERNEL_COLUMNS].set_index("ncu_id")
    values = df.pivot_table(index="ncu_id", columns="metric", values="value", aggfunc="first", dropna=False,
                            sort=False)
    order = list(dict.fromkeys(df["metric"]))
    values = values.reindex(columns=order)
    wide = kernels.join(values).sort_index().reset_index()
    wide.columns.name = None
    wide.attrs["units"] = dict(zip(df["metric"], df["unit"]))
    return wide


def export_report_csv(report: Path, out_dir: Path) -> Path:
    """``.ncu-rep`` -> raw-page CSV with ``ncu -i REPORT --csv --page raw --print-units base
    --print-kernel-base mangled --rename-kernels off`` (docs/formats.md#ncu-export).

    Raises:
        NcuCsvError: ncu is not on PATH, or the import failed (its message is included).
    """
    import shutil
    import subprocess

    report = Path(report)
    ncu = shutil.which("ncu")
    if ncu is None:
        raise NcuCsvError(f"{report}: reading a .ncu-rep needs Nsight Compute's 'ncu' on PATH; where it is installed "
                          f"run 'ncu -i {report.name} --csv --page raw --print-units base --print-kernel-base mangled "
                          "--rename-kernels off > report.csv' and pass the CSV")
    out = Path(out_dir) / (report.stem + ".raw.csv")
    with open(out, "w") as fh:
        proc = subprocess.run([ncu, "-i", str(report), "--csv", "--page", "raw", "--print-units", "base",
                               "--print-kernel-base", "mangled", "--rename-kernels", "off"],
                              stdout=fh, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        detail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise NcuCsvError(f"{report}: 'ncu -i ... --csv --page raw' failed (exit {proc.returncode}): {detail}")
    return out


def counters_table(long: pd.DataFrame, source: str) -> pd.DataFrame:
    """One ncu file's rows (:func:`read_ncu_csv`) as the counters table (one row per profiled kernel, docs/DESIGN.md
    §3): ``source``, ``ncu_id``, ``pid``, ``device`` (nullable ints), ``name``, ``match_key`` (the name as printed),
    ``occurrence`` (index among the kernels of the same process, device and name, in ``ncu_id`` order; pid and
    device only where every row has them), the launch columns and one column per metric in base units
    (``attrs["units"]``)."""
    wide = wide_metrics(long)
    for column in ("pid", "device"):  # a non-numeric cell (never seen) must not pass for an id
        wide[column] = pd.array(pd.to_numeric(wide[column], errors="coerce"), dtype="Int64")
    wide.insert(0, "source", source)
    wide.insert(wide.columns.get_loc("name") + 1, "match_key", wide["name"])
    keys = [c for c in ("pid", "device") if wide[c].notna().all()] + ["match_key"]
    wide.insert(wide.columns.get_loc("match_key") + 1, "occurrence",
                wide.sort_values("ncu_id").groupby(keys, dropna=False).cumcount().reindex(wide.index).astype("int64"))
    return wide
