"""First contact with a GPU machine (``scripts/gpu-check --first-contact``): before any profiling, in a few minutes,
the facts the GPU path relies on that only the machine can tell, one printed line and one ``first_contact.json``
entry each, with the tool output kept beside it.

Each fact (:class:`Fact`) has a ``status``: ``ok`` (as the product assumes), ``problem`` (the product would fail
or mislead here: the line says what to do), ``unknown`` (could not be told) or ``skipped`` (needs what this
machine lacks, or the time budget ran out), and ``checks``: the assumption of the docs it settles
(docs/gpu.md "First contact" lists them). The facts:

- ``versions``, ``gpu``: driver, CUDA, torch, ncu, nsys; the GPU, its compute capability (nvidia-smi and torch),
  MIG and persistence mode.
- ``ncu_help``: ncu's defaults of ``--clock-control``, ``--cache-control``, ``--rename-kernels``,
  ``--print-kernel-base``.
- ``ncu_metrics``: which catalog metrics the chip lacks (``ncu --query-metrics-mode suffix``, the replay's own
  check).
- ``kineto_cuda``: the toy program (:mod:`operator_profiler.first_contact_toy`) under torch.profiler, read by the
  Kineto reader: the window's kernels and their names.
- ``ncu_counters``: whether ncu may read the performance counters (ERR_NVGPUCTRPERM, DCGM).
- ``ncu_nvtx_window``: ``--nvtx --nvtx-include opprof@opprof.measured`` profiles exactly the window's kernels.
- ``ncu_launch_skip_nvtx``: ``--launch-skip 1 --launch-count 2`` with the NVTX filter lands on the window's 2nd
  and 3rd kernels.
- ``ncu_profiler_range``: ``--profile-from-start off`` alone profiles the profiler range and nothing before it.
- ``ncu_launch_skip_profiler_api``: ``--launch-skip 1 --launch-count 2`` without the NVTX filter lands on the
  same kernels, i.e. launches before ``cudaProfilerStart`` are not counted (the ``ncu.window: profiler_api``
  fallback is sound).
- ``ncu_kernel_names``: ncu's mangled names against Kineto's for the cuBLAS and Triton kernels (the name rung on
  which they agree, :func:`operator_profiler.matching.names.names_agree`), and the demangled and function bases.
- ``ncu_raw_page``: the real raw page read by the product's reader (columns, units row, NVTX columns, IDs).
- ``ncu_locale``: the same page exported under ``LC_ALL=C`` and a grouping locale reads to equal values.
- ``ncu_catalog``: the whole catalog collected on one kernel: values present, replay passes.
- ``ncu_report``: NVIDIA's ``ncu_report`` Python module reads the report.
- ``nsys``: whether Nsight Systems is on PATH (the nsys timeline's checks need it).
- ``clocks``: policy ``base`` chosen, locked and read back while a CUDA process runs, then restored.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .naming import measured_range_include

FORMAT = "opprof.first_contact/1"
#: The facts of the toy's ncu runs, in order (one step).
NCU_RUN_KEYS = ("ncu_counters", "ncu_nvtx_window", "ncu_launch_skip_nvtx", "ncu_profiler_range",
                "ncu_launch_skip_profiler_api", "ncu_kernel_names", "ncu_raw_page", "ncu_locale")
STATUSES = ("ok", "problem", "unknown", "skipped")
#: One step's subprocess limit (s); the whole run has ``budget_s``.
STEP_TIMEOUT_S = 150
ONE_METRIC = "gpu__time_duration.sum"


@dataclass
class Fact:
    key: str
    status: str
    summary: str
    checks: str
    details: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"first contact: {self.key:30s} {self.status.upper():8s} {self.summary}"


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self) -> float:
        return max(1.0, min(STEP_TIMEOUT_S, self.left()))


def run(cmd: list[str], budget: Budget, env: dict | None = None, out: Path | None = None) -> tuple[int, str]:
    """Run ``cmd`` (no shell) within the budget (its whole process group is stopped at the limit); (exit status,
    stdout + stderr, decoded leniently); -1 with the reason when it timed out or did not start. ``out``: also
    write the text there (the capture set)."""
    from .tool_runs import run_tool

    done = run_tool(cmd, budget.timeout(), env={**os.environ, **(env or {})})
    text = done.text
    if done.timed_out:
        text += f"\n(no answer within {budget.timeout():.0f} s: stopped with everything it started)"
    if done.error:
        text += f"\n{done.error}"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"$ {' '.join(cmd)}\n(exit {done.code})\n{text}", errors="replace")
    return done.code, text


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.startswith("==ERROR==")), lines[-1] if lines else "no output")


# ------------------------------------------------------------------------------ judging (pure, tested on CPU)


def agreeing(kineto: list[str], ncu: list[str]) -> list[str | None]:
    """Per position, the name rung on which ncu's name agrees with Kineto's (None: they disagree or one is
    missing); a length mismatch leaves the extra positions None."""
    from .matching.names import names_agree

    n = max(len(kineto), len(ncu))
    return [names_agree(kineto[i], None, ncu[i]) if i < len(kineto) and i < len(ncu) else None for i in range(n)]


def judge_selection(key: str, checks: str, expected: list[str], got: list[str] | None, what: str,
                    if_wrong: str) -> Fact:
    """A fact saying whether an ncu run profiled exactly ``expected`` (Kineto's names of the kernels meant, in
    order) when it profiled ``got`` (its raw page's names, in ID order; None: the run failed)."""
    if got is None:
        return Fact(key, "unknown", f"{what}: the ncu run failed (see ncu_counters)", checks)
    rungs = agreeing(expected, got)
    details = {"expected": expected, "profiled": got, "rungs": rungs}
    if len(got) == len(expected) and all(rungs):
        return Fact(key, "ok", f"{what}: profiled the {len(got)} kernel(s) meant, in order", checks, details)
    return Fact(key, "problem", f"{what}: profiled {len(got)} kernel(s) where {len(expected)} were meant "
                f"({_names_cut(got)} vs {_names_cut(expected)}); {if_wrong}", checks, details)


def _names_cut(names: list[str], width: int = 28) -> str:
    from .matching.names import forms

    return "[" + ", ".join((forms(n)["function"] or str(n))[:width] for n in names) + "]"


def help_defaults(text: str) -> dict:
    """ncu's option defaults as ``--help`` prints them (``--clock-control arg (=base)``)."""
    out = {}
    for option in ("clock-control", "cache-control", "rename-kernels", "print-kernel-base", "replay-mode",
                   "profile-from-start", "nvtx-push-pop-scope"):
        found = re.search(rf"--{option} arg \(=([^)]*)\)", text)
        out[option] = found.group(1) if found else None
    return out


def passes(text: str) -> list[int]:
    """Replay passes per profiled kernel from ncu's ``==PROF== Profiling "k" - 0: 0%....100% - 8 passes`` lines."""
    return [int(m) for m in re.findall(r"- (\d+) pass(?:es)?\s*$", text, flags=re.MULTILINE)]


# ------------------------------------------------------------------------------ the steps


class FirstContact:
    """The steps, in order; each appends its facts. ``out``: the folder of ``first_contact.json`` and the tool
    output (the capture set); ``device``: torch's index of the GPU."""

    def __init__(self, out: Path, budget_s: float, device: int = 0):
        self.out = Path(out)
        self.files = self.out  # the tools' output beside first_contact.json
        self.files.mkdir(parents=True, exist_ok=True)
        self.budget = Budget(budget_s)
        self.device = device
        self.facts: list[Fact] = []
        self.cuda = False
        self.kineto: list[str] | None = None  # the toy's window kernel names (Kineto), K0..K3
        self.after_range: list[str] = []  # K4
        self.reports: dict[str, Path] = {}
        self.ncu = shutil.which("ncu")
        self.smi = shutil.which("nvidia-smi")

    def add(self, fact: Fact) -> Fact:
        assert fact.status in STATUSES, fact.status
        self.facts.append(fact)
        print(fact.line(), flush=True)
        return fact

    def step(self, keys: str | tuple[str, ...], checks: str, fn) -> None:
        """Run ``fn``, which adds the facts ``keys``; whichever of them it did not add (no budget left, or it
        raised) is added here: ``skipped`` for the budget, ``problem`` with the exception for the first, ``skipped``
        for the rest. So every fact key is always in the record, in order."""
        keys = (keys,) if isinstance(keys, str) else keys
        before = len(self.facts)
        if self.budget.left() < 5:
            for key in keys:
                self.add(Fact(key, "skipped", "the time budget ran out (--budget-s)", checks, {"budget": True}))
            return
        error = None
        try:
            fn()
        except Exception as exc:  # a step's own failure is a fact, not the end of first contact
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        added = {f.key for f in self.facts[before:]}
        for key in keys:
            if key in added:
                continue
            if error is not None:
                self.add(Fact(key, "problem", error, checks))
                error = None
            elif self.budget.left() < 5:
                self.add(Fact(key, "skipped", "the time budget ran out (--budget-s)", checks, {"budget": True}))
            else:
                self.add(Fact(key, "skipped", "not reached: an earlier fact of its step failed", checks))

    def all(self) -> list[Fact]:
        self.files.mkdir(parents=True, exist_ok=True)
        self.step("versions", "the tools the GPU path runs", self.versions)
        self.step("gpu", "compute capability for the metric names (ncu replay), MIG, persistence", self.gpu)
        self.step("ncu_help", "docs/formats.md ncu GPU checks: ncu's defaults", self.ncu_help)
        self.step("ncu_metrics", "docs/gpu.md ncu replay: the chip's metrics", self.ncu_metrics)
        self.step("kineto_cuda", "a torch timeline on CUDA: the toy's window kernels", self.kineto_toy)
        self.step(NCU_RUN_KEYS, "ncu may read the counters", self.ncu_runs)
        self.step("ncu_catalog", "docs/formats.md ncu metrics: the catalog on hardware, replay passes", self.catalog)
        self.step("ncu_report", "docs/formats.md ncu GPU checks: one .ncu-rep read with ncu_report", self.ncu_report)
        self.step("nsys", "the nsys timeline (capture and export)", self.nsys)
        self.step("clocks", "docs/gpu.md Clocks: lock, read back under a running process, restore", self.clocks)
        return self.facts

    # --------------------------------------------------------------------------------------------- versions

    def smi_query(self, fields: str) -> tuple[list[str] | None, str]:
        if self.smi is None:
            return None, "nvidia-smi not on PATH"
        code, text = run([self.smi, "-i", str(self.device), f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         self.budget)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if code != 0 or not lines:
            return None, _first_error(text)
        return [v.strip() for v in lines[0].split(",")], ""

    def versions(self) -> None:
        import importlib.util

        details = {"python": platform.python_version(), "platform": platform.platform(),
                   # without NVIDIA's nvtx package the harness's ranges fall back to torch.cuda.nvtx's default domain
                   "nvtx_package": importlib.util.find_spec("nvtx") is not None,
                   "measured_range_include": measured_range_include()}
        driver, why_driver = self.smi_query("driver_version")
        details["driver"] = driver[0] if driver and re.fullmatch(r"\d+(\.\d+)+", driver[0]) else None
        if details["driver"] is None:
            details["driver_said"] = (driver[0] if driver else why_driver)[:200]
        why = ""
        try:
            import torch

            details.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
            self.cuda = bool(torch.cuda.is_available())
            details["torch_sees_cuda"] = self.cuda
        except Exception as exc:
            why = f"torch: {exc}"
        for tool in ("ncu", "nsys"):
            path = shutil.which(tool)
            if path is None:
                details[tool] = None
                continue
            code, text = run([path, "--version"], self.budget, out=self.files / f"{tool}-version.txt")
            found = re.search(r"[Vv]ersion (\d+(?:\.\d+)+)", text) if code == 0 else None
            details[tool] = found.group(1) if found else None
            if found is None:
                details[f"{tool}_said"] = ("no answer within the time limit" if code == -1 else
                                           f"exit {code}: {_first_error(text)[:200]}")
        missing = [k for k in ("driver", "torch", "ncu") if not details.get(k)]
        status = "ok" if not missing and self.cuda else "problem"
        def said(tool):
            return details.get(tool) or (f"? ({details[tool + '_said']})" if details.get(tool + "_said") else
                                         "not on PATH" if tool in ("ncu", "nsys") else "?")

        summary = (f"driver {said('driver')}, torch {details.get('torch')} (CUDA {details.get('torch_cuda')}), "
                   f"ncu {said('ncu')}, nsys {said('nsys')}")
        if not self.cuda:
            summary += "; torch sees no CUDA GPU"
        if missing:
            summary += f"; missing: {', '.join(missing)}{' (' + why + ')' if why else ''}"
        self.add(Fact("versions", status, summary, "the tools the GPU path runs", details))

    def gpu(self) -> None:
        checks = "compute capability for the metric names (ncu replay), MIG, persistence"
        details: dict = {}
        for name in ("name", "uuid", "compute_cap", "persistence_mode", "mig.mode.current", "pci.bus_id",
                     "clocks.max.sm", "clocks.max.memory", "clocks.default_applications.graphics"):
            values, why = self.smi_query(name)  # one call each: a deprecated or removed field costs only itself
            details[name] = values[0] if values else f"(unavailable: {why})"
        torch_cc = None
        if self.cuda:
            import torch

            torch_cc = "%d.%d" % torch.cuda.get_device_capability(self.device)
            props = torch.cuda.get_device_properties(self.device)
            details.update(torch_name=props.name, torch_uuid=str(getattr(props, "uuid", "")),
                           multiprocessors=props.multi_processor_count)
        details["torch_compute_cap"] = torch_cc
        smi_cc = details["compute_cap"] if re.fullmatch(r"\d+\.\d+", str(details["compute_cap"])) else None
        cc = smi_cc or torch_cc
        if cc is None:
            self.add(Fact("gpu", "problem", "compute capability unknown to nvidia-smi and torch: the ncu replay "
                          "stops (it cannot choose the chip's metric names)", checks, details))
            return
        from .ncu.catalog import arch_for_cc

        details["arch"] = arch_for_cc(cc)
        agree = smi_cc is None or torch_cc is None or smi_cc == torch_cc
        status = "ok" if agree else "problem"
        self.add(Fact("gpu", status, f"{details['name']}: compute capability {cc} ({details['arch']}; nvidia-smi "
                      f"{smi_cc}, torch {torch_cc}), MIG {details['mig.mode.current']}, persistence "
                      f"{details['persistence_mode']}", checks, details))

    # --------------------------------------------------------------------------------------------- ncu static

    def ncu_help(self) -> None:
        checks = "docs/formats.md ncu GPU checks: ncu's defaults"
        if self.ncu is None:
            self.add(Fact("ncu_help", "skipped", "ncu is not on PATH", checks))
            return
        code, text = run([self.ncu, "--help"], self.budget, out=self.files / "ncu-help.txt")
        defaults = help_defaults(text)
        run([self.ncu, "--list-chips"], self.budget, out=self.files / "ncu-list-chips.txt")
        known = {k: v for k, v in defaults.items() if v is not None}
        self.add(Fact("ncu_help", "ok" if known else "unknown",
                      ", ".join(f"--{k} {v}" for k, v in known.items()) or f"no defaults in --help (exit {code})",
                      checks, {"defaults": defaults}))

    def ncu_metrics(self) -> None:
        from .ncu import availability
        from .ncu.catalog import ARCHS, arch_for_cc, load_catalog
        from .ncu.replay import compute_capability, ncu_version

        checks = "docs/gpu.md ncu replay: the chip's metrics"
        if self.ncu is None:
            self.add(Fact("ncu_metrics", "skipped", "ncu is not on PATH", checks))
            return
        cc, source = compute_capability(f"cuda:{self.device}", self.budget.timeout())
        arch = arch_for_cc(f"{cc[0]}.{cc[1]}")
        catalog = load_catalog()
        record = availability.check_metrics(catalog.replay_metrics(), self.device, cc,
                                            ncu_version(self.budget.timeout()), self.files / "ncu_metrics",
                                            timeout_s=self.budget.timeout())
        if "error" in record["query"]:
            self.add(Fact("ncu_metrics", "problem", f"ncu could not list the chip's metrics: {record['query']['error']}",
                          checks, record))
            return
        cmd = record["query"]["command"]
        run(cmd, self.budget, out=self.files / "ncu-query-metrics.txt")  # the raw answer, for the capture set
        dropped = {d["name"] for d in record["dropped"]}
        lacking = {a: [n for n in catalog.replay_metrics(a) if n in dropped] for a in ARCHS}
        record["lacking_per_arch"] = lacking
        record["arch"] = arch
        status = "ok" if not lacking[arch] else "problem"
        self.add(Fact("ncu_metrics", status,
                      f"chip {record['query']['chip']} ({source}): {arch} names lacking: "
                      f"{', '.join(lacking[arch]) or 'none'}; other architectures' names dropped: "
                      f"{sum(len(v) for a, v in lacking.items() if a != arch)}; unchecked attributes: "
                      f"{len(record['unchecked'])}", checks, record))

    # --------------------------------------------------------------------------------------------- the toy

    def toy_argv(self, out_run: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "operator_profiler.first_contact_toy", "--out", str(out_run), *extra]

    def toy_env(self) -> dict:
        src = str(Path(__file__).resolve().parents[1])
        return {"PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]),
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", str(self.device))}

    def kineto_toy(self) -> None:
        checks = "a torch timeline on CUDA: the toy's window kernels"
        if not self.cuda:
            self.add(Fact("kineto_cuda", "skipped", "torch sees no CUDA GPU", checks))
            return
        from .timeline.kineto import read_kineto

        trace = self.files / "toy.kineto.json.gz"
        code, text = run(self.toy_argv(self.files / "toy-kineto.run.json", "--profiler", "torch", "--trace",
                                       str(trace)), self.budget, self.toy_env(), self.files / "toy-kineto.log")
        if code != 0:
            self.add(Fact("kineto_cuda", "problem", f"the toy under torch.profiler failed: {_first_error(text)}",
                          checks))
            return
        kernels = read_kineto(trace).kernels.sort_values("start_ns")
        names = [str(n) for n in kernels["name"]]
        toy = json.loads((self.files / "toy-kineto.run.json").read_text())
        n = len(toy["window"])
        self.kineto, self.after_range = names[:n], names[n:]
        ok = len(names) >= n + 1
        self.add(Fact("kineto_cuda", "ok" if ok else "problem",
                      f"{len(names)} kernel(s) in the toy's profiler range: {_names_cut(names)}", checks,
                      {"kernels": names, "toy": toy}))

    def ncu_collect(self, label: str, *options: str, metrics: str = ONE_METRIC) -> tuple[list[str] | None, str]:
        """One ncu collection of the toy; (its raw page's kernel names in ID order, or None; ncu's output)."""
        from .ncu.csv_reader import export_report_csv, read_ncu_csv

        report = self.files / f"toy-{label}.ncu-rep"
        cmd = [self.ncu, *options, "--metrics", metrics, "--print-kernel-base", "mangled", "--export", str(report),
               "--force-overwrite", *self.toy_argv(self.files / f"toy-{label}.run.json")]
        code, text = run(cmd, self.budget, self.toy_env(), self.files / f"toy-{label}.ncu.log")
        if code != 0 or not report.exists():
            return None, text
        self.reports[label] = report
        csv = export_report_csv(report, self.files)
        long = read_ncu_csv(csv)
        return [str(n) for n in long.drop_duplicates("ncu_id")["name"]], text

    def ncu_runs(self) -> None:
        from .ncu.replay import _failure

        checks = "ncu may read the counters"
        if self.ncu is None or not self.cuda or self.kineto is None:
            why = "ncu is not on PATH" if self.ncu is None else "no CUDA GPU" if not self.cuda else "no Kineto run"
            for key in NCU_RUN_KEYS:
                self.add(Fact(key, "skipped", why, checks))
            return
        include = measured_range_include()
        nvtx = ["--profile-from-start", "off", "--nvtx", "--nvtx-include", include]
        window, text = self.ncu_collect("nvtx", *nvtx)
        error = _failure("", [], subprocess.CompletedProcess([], 0 if window is not None else 1, text, ""),
                         what="ncu on the toy program (toy-nvtx.ncu.log)")
        self.add(Fact("ncu_counters", "ok" if window is not None else "problem",
                      "ncu profiled the toy" if window is not None else (str(error) if error else _first_error(text)),
                      checks))
        if window is None:
            for key in NCU_RUN_KEYS[1:]:
                self.add(Fact(key, "skipped", "ncu did not profile the toy (ncu_counters)", checks))
            return
        expected = self.kineto
        self.add(judge_selection("ncu_nvtx_window", "docs/gpu.md ncu replay: the NVTX window filter", expected,
                                 window, f"--nvtx-include {include}",
                                 "the replay's default window (ncu.window: nvtx) does not select the measured "
                                 "iterations: set ncu.window: profiler_api if that check passes"))
        skipped, _ = self.ncu_collect("nvtx-skip", *nvtx, "--launch-skip", "1", "--launch-count", "2")
        self.add(judge_selection("ncu_launch_skip_nvtx", "docs/gpu.md ncu replay: --launch-skip with the NVTX filter",
                                 expected[1:3], skipped, "--launch-skip 1 --launch-count 2 with the NVTX filter",
                                 "launch positions would be off: keep the replay off this GPU until it is fixed"))
        api, _ = self.ncu_collect("api", "--profile-from-start", "off")
        self.add(judge_selection("ncu_profiler_range", "docs/gpu.md ncu replay: --profile-from-start off",
                                 expected + self.after_range, api, "--profile-from-start off",
                                 "the profiler-API window is not the toy's profiler range"))
        api_skip, _ = self.ncu_collect("api-skip", "--profile-from-start", "off", "--launch-skip", "1",
                                       "--launch-count", "2")
        self.add(judge_selection("ncu_launch_skip_profiler_api", "docs/gpu.md ncu replay: --launch-skip counts only "
                                 "launches after cudaProfilerStart", expected[1:3], api_skip,
                                 "--launch-skip 1 --launch-count 2 with --profile-from-start off alone",
                                 "--launch-skip counts launches before cudaProfilerStart: keep ncu.window: nvtx"))
        self.kernel_names(expected, window)
        self.raw_page()
        self.locale()

    def kernel_names(self, kineto: list[str], mangled: list[str]) -> None:
        from .matching.names import forms

        checks = "docs/formats.md ncu kernel names: ncu's names against the timeline's"
        bases = {"mangled": mangled}
        for base in ("demangled", "function"):
            code, text = run([self.ncu, "-i", str(self.reports["nvtx"]), "--csv", "--page", "raw", "--print-kernel-base",
                              base, "--rename-kernels", "off"], self.budget, out=self.files / f"toy-nvtx.{base}.csv")
            bases[base] = _csv_names(text) if code == 0 else None
        rungs = agreeing(kineto, mangled)
        roles = [("triton" if str(k).startswith("triton_") else "cuBLAS" if i == 1 else f"K{i}") for i, k in
                 enumerate(kineto)]
        details = {"kineto": kineto, **bases, "rungs": rungs, "roles": roles}
        summary = "; ".join(f"{role}: {rung or 'DISAGREE'}" for role, rung in zip(roles, rungs))
        ok = len(kineto) == len(mangled) and all(rungs)
        self.add(Fact("ncu_kernel_names", "ok" if ok else "problem", f"rung on which ncu and Kineto agree: {summary}"
                      + ("" if ok else f" (ncu {[forms(n)['function'] for n in mangled]})"), checks, details))

    def raw_page(self) -> None:
        from .ncu.csv_reader import read_ncu_csv

        checks = "docs/formats.md ncu pages, NVTX columns, ID: the raw page on hardware"
        csv = self.files / "toy-nvtx.raw.csv"
        header = next((ln for ln in csv.read_text().splitlines() if ln.startswith('"ID"')), "")
        long = read_ncu_csv(csv)
        columns = next(iter(__import__("csv").reader([header])), [])
        nvtx = [c for c in columns if "Push/Pop_Range" in c or "Start/Stop_Range" in c]
        ids = sorted(set(long["ncu_id"]))
        details = {"columns": columns, "nvtx_columns": nvtx, "ids": ids, "page": long.attrs.get("page"),
                   "locale": list(long.attrs.get("locale") or ())}
        ok = long.attrs.get("page") == "raw" and ids == list(range(len(ids)))
        self.add(Fact("ncu_raw_page", "ok" if ok else "problem", f"page {long.attrs.get('page')}, {len(columns)} "
                      f"columns, NVTX columns {nvtx or 'none'}, IDs {ids[:6]}", checks, details))

    def locale(self) -> None:
        from .ncu.csv_reader import read_ncu_csv

        checks = "docs/formats.md ncu numbers: digit grouping by locale"
        code, text = run(["locale", "-a"], self.budget)
        grouping = next((loc for loc in ("de_DE.utf8", "de_DE.UTF-8", "en_US.utf8", "en_US.UTF-8")
                         if loc.lower() in text.lower()), None)
        values = {}
        for loc in ["C", *([grouping] if grouping else [])]:
            path = self.files / f"toy-nvtx.raw.{loc}.csv"
            code, out = run([self.ncu, "-i", str(self.reports["nvtx"]), "--csv", "--page", "raw", "--print-units",
                             "base", "--print-kernel-base", "mangled", "--rename-kernels", "off"], self.budget,
                            {"LC_ALL": loc}, None)
            path.write_text(out)
            long = read_ncu_csv(path)
            values[loc] = {"locale": list(long.attrs.get("locale") or ()),
                           "values": long["value"].round(6).tolist()}
        same = len({json.dumps(v["values"]) for v in values.values()}) == 1
        self.add(Fact("ncu_locale", "ok" if same and grouping else "unknown" if same else "problem",
                      (f"LC_ALL=C and {grouping} read to equal values" if grouping and same else
                       "only LC_ALL=C available here" if same else "values differ between locales"), checks, values))

    def catalog(self) -> None:
        from .ncu.availability import check_metrics
        from .ncu.catalog import arch_for_cc, load_catalog
        from .ncu.replay import compute_capability, ncu_version

        checks = "docs/formats.md ncu metrics: the catalog on hardware, replay passes"
        if self.ncu is None or not self.cuda or self.kineto is None or "nvtx" not in self.reports:
            self.add(Fact("ncu_catalog", "skipped", "needs ncu, a CUDA GPU and the NVTX run", checks))
            return
        cc, _ = compute_capability(f"cuda:{self.device}", self.budget.timeout())
        record = check_metrics(load_catalog().replay_metrics(arch_for_cc(f"{cc[0]}.{cc[1]}")), self.device, cc,
                               ncu_version(self.budget.timeout()), self.files / "ncu_metrics",
                               timeout_s=self.budget.timeout())
        t0 = time.monotonic()
        names, text = self.ncu_collect("catalog", "--profile-from-start", "off", "--nvtx", "--nvtx-include",
                                       measured_range_include(), "--launch-skip", "1", "--launch-count", "1",
                                       metrics=",".join(record["collect"]))
        wall = time.monotonic() - t0
        if names is None:
            self.add(Fact("ncu_catalog", "problem", f"collecting the catalog failed: {_first_error(text)}", checks,
                          record))
            return
        from .ncu.availability import inaccessible_metrics
        from .ncu.csv_reader import read_ncu_csv

        long = read_ncu_csv(self.files / "toy-catalog.raw.csv")
        present = set(long.loc[long["value"].notna(), "metric"])
        missing = [n for n in record["collect"] if n not in present]
        said = inaccessible_metrics(text, record["collect"])
        # instanced metrics print several values in one cell ("158 (0: 158)", "a; b": docs/formats.md#ncu-numbers)
        instanced = long.loc[long["text"].astype(str).str.contains(r"\(|;", regex=True), ["metric", "text"]]
        details = {"collected": record["collect"], "without_value": missing, "ncu_said": said,
                   "passes": passes(text), "wall_s": round(wall, 1),
                   "instanced_cells": instanced.head(10).to_dict("records")}
        self.add(Fact("ncu_catalog", "ok" if not missing else "problem",
                      f"{len(record['collect']) - len(missing)} of {len(record['collect'])} catalog metrics have a "
                      f"value on {names[0][:40] if names else '?'}; {passes(text) or '?'} replay pass(es); "
                      f"{wall:.0f} s" + (f"; without value: {', '.join(missing)}" if missing else ""), checks, details))

    def ncu_report(self) -> None:
        checks = "docs/formats.md ncu GPU checks: one .ncu-rep read with ncu_report"
        if "nvtx" not in self.reports or self.ncu is None:
            self.add(Fact("ncu_report", "skipped", "no report of this run", checks))
            return
        folder = next((p for p in (Path(os.path.realpath(self.ncu)).parent / "extras" / "python",
                                   Path(os.path.realpath(self.ncu)).parent.parent / "extras" / "python")
                       if (p / "ncu_report.py").exists()), None)
        if folder is None:
            self.add(Fact("ncu_report", "unknown", "ncu_report.py not found beside ncu", checks))
            return
        code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import ncu_report; "
                "ctx = ncu_report.load_report(sys.argv[2]); rng = ctx.range_by_idx(0); "
                "acts = [rng.action_by_idx(i) for i in range(rng.num_actions())]; "
                "print(json.dumps([a.name(ncu_report.IAction.NameBase_MANGLED) for a in acts]))")
        rc, text = run([sys.executable, "-c", code, str(folder), str(self.reports["nvtx"])], self.budget,
                       out=self.files / "ncu-report-module.txt")
        try:
            names = json.loads(text.strip().splitlines()[-1]) if rc == 0 else None
        except (ValueError, IndexError):
            names = None
        self.add(Fact("ncu_report", "ok" if names else "problem",
                      f"ncu_report read {len(names)} action(s)" if names else f"ncu_report failed: {_first_error(text)}",
                      checks, {"folder": str(folder), "names": names}))

    def nsys(self) -> None:
        checks = "the nsys timeline (capture and export)"
        path = shutil.which("nsys")
        if path is None:
            self.add(Fact("nsys", "skipped", "nsys is not on PATH: the nsys capture and export stay unverified on "
                          "this machine (timeline: torch works without it)", checks))
            return
        code, text = run([path, "--version"], self.budget)
        found = re.search(r"[Vv]ersion (\d+(?:\.\d+)+)", text) if code == 0 else None
        self.add(Fact("nsys", "ok" if found else "problem",
                      f"nsys {found.group(1)}" if found else f"nsys --version gave no version (exit {code}): "
                      f"{_first_error(text)[:200]}", checks))

    # --------------------------------------------------------------------------------------------- clocks

    def clocks(self) -> None:
        from .capture.clocks import choose_target, locked_clocks

        checks = "docs/gpu.md Clocks: lock, read back under a running process, restore"
        if self.smi is None or not self.cuda:
            self.add(Fact("clocks", "skipped", "needs nvidia-smi and a CUDA GPU", checks))
            return
        target = choose_target({"policy": "base"}, f"cuda:{self.device}" if self.device else "cuda")
        job = [sys.executable, "-c", "import torch, time; a = torch.randn(4096, 4096, device='cuda'); t = time.time()\n"
               "while time.time() - t < 3: a = a @ a; a /= a.norm(); torch.cuda.synchronize()"]
        applied_path = self.files / "clocks_applied.json"
        try:
            with locked_clocks(target, applied_path, "cuda") as applied:
                code, text = run(job, self.budget, out=self.files / "clocks-job.log")
                applied["job_exit"] = code
        except Exception as exc:
            details = {"target": target}
            if applied_path.exists():
                details["applied"] = json.loads(applied_path.read_text())
            self.add(Fact("clocks", "problem", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", checks,
                          details))
            return
        applied = json.loads(applied_path.read_text())
        during = applied.get("readback_during_job") or {}
        held = applied.get("locked") is True
        self.add(Fact("clocks", "ok" if held and applied.get("restored") else "problem",
                      f"policy base ({target.get('base_definition') or target.get('reason')}): SM "
                      f"{target.get('sm_mhz')} MHz, memory {target.get('mem_mhz')} MHz; persistence "
                      f"{applied.get('persistence_mode')}; under a running CUDA process: "
                      + (f"held ({during.get('matching')}/{during.get('samples')} read-backs, SM "
                         f"{during.get('sm_mhz_min')}-{during.get('sm_mhz_max')} MHz)" if held else
                         f"NOT held ({applied.get('lock_lost') or applied.get('reason')})")
                      + f"; restored {applied.get('restored')}"
                      + (f"; warnings: {' | '.join(applied['warnings'])}" if applied.get("warnings") else ""),
                      checks, {"target": target, "applied": applied}))


def _csv_names(text: str) -> list[str]:
    import csv
    import io

    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows or "Kernel Name" not in rows[0]:
        return []
    i, id_col = rows[0].index("Kernel Name"), rows[0].index("ID")
    seen, names = set(), []
    for r in rows[1:]:
        if r and r[id_col].isdigit() and r[id_col] not in seen:
            seen.add(r[id_col])
            names.append(r[i])
    return names


def first_contact(out: Path, budget_s: float = 300.0, device: int = 0) -> dict:
    """Run every step (:class:`FirstContact`), print one line per fact, write ``out/first_contact.json`` (format
    :data:`FORMAT`: ``facts`` as :class:`Fact` dicts, ``duration_s``, ``problems`` and ``incomplete`` (skipped
    for the budget): their keys) and return it."""
    t0 = time.monotonic()
    contact = FirstContact(out, budget_s, device)
    facts = contact.all()
    record = {"format": FORMAT, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "duration_s": round(time.monotonic() - t0, 1), "budget_s": budget_s,
              "facts": [asdict(f) for f in facts], "problems": [f.key for f in facts if f.status == "problem"],
              "incomplete": [f.key for f in facts if f.status == "skipped" and f.details.get("budget")],
              "files": sorted(str(p.relative_to(out)) for p in Path(out).rglob("*") if p.is_file())}
    (Path(out) / "first_contact.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record
