"""Run the pipeline's stages on a generated case (:mod:`ground_truth`) and score its answers against the truth
(test support, not a test).

The stages are the library functions the CLI calls (``operator_profiler.stages``: ``export_timeline``,
``build_fusion_map``, ``attribute_files``, ``parse_ncu_files``, ``match_files``); only their output files are read
back: ``timeline/kernels.parquet`` (``kernel_id`` -> ``device, start_ns``), ``attribution/kernels.parquet``
(``operator``, ``source_nodes``), ``matched/kernel_metrics.parquet`` (the token metric of the attached row) and
``matched/diagnostics.json`` (refusal reasons). A stage that raises is recorded as an error of the case; the
stages after it that need its output are skipped.

A refusal must be visible: a kernel with an ncu row but no counters must be listed in ``timeline_only_kernels``
and an ncu row attached to no kernel in ``ncu_only_rows`` (``silent_kernels``/``silent_rows`` count those that
are not).

``extra_in_timeline`` counts the timeline's kernels beyond the truth's (a kernel record the reader counted twice).

Figures (:class:`Score`): an *answer* is a non-null operator, a non-empty ``source_nodes`` list, or an attached
counter row. Precision = right answers / answers (over every kernel, determined or not; an answer for a kernel
whose truth is "no operator" is wrong); recall = right answers / kernels whose answer the input determines.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
from truth_formats import TOKEN_METRIC


@dataclass
class Score:
    """Counts of one or more cases; see the module docstring."""

    cases: int = 0
    kernels: int = 0
    not_in_timeline: int = 0
    extra_in_timeline: int = 0  # timeline kernels beyond the truth's: a record counted twice, or one never run
    op_answers: int = 0
    op_right: int = 0
    op_determined: int = 0
    op_recalled: int = 0
    nodes_answers: int = 0
    nodes_right: int = 0
    nodes_determined: int = 0
    nodes_recalled: int = 0
    pairs: int = 0  # kernels with a true ncu row
    ctr_attached: int = 0
    ctr_right: int = 0
    ctr_determined: int = 0
    ctr_recalled: int = 0
    refused: Counter = field(default_factory=Counter)  # timeline_only_kernels reasons, kernels with a true row
    silent_kernels: int = 0  # kernels with an ncu row, no counters and not in timeline_only_kernels
    silent_rows: int = 0  # ncu rows attached to no kernel and not in ncu_only_rows
    ncu_only: Counter = field(default_factory=Counter)  # ncu_only_rows reasons
    errors: list = field(default_factory=list)  # (seed, stage, message)
    wrong_operators: list = field(default_factory=list)  # (seed, kernel, truth, answer)
    wrong_counters: list = field(default_factory=list)  # (seed, kernel, truth token, attached token)
    missed_counters: list = field(default_factory=list)  # (seed, kernel, reason)
    missed_operators: list = field(default_factory=list)  # (seed, kernel, truth)
    seconds: float = 0.0

    def add(self, other: Score) -> None:
        for name, value in vars(other).items():
            mine = getattr(self, name)
            if isinstance(value, Counter):
                mine.update(value)
            elif isinstance(value, list):
                mine.extend(value)
            else:
                setattr(self, name, mine + value)

    @staticmethod
    def ratio(num: int, den: int) -> float | None:
        return num / den if den else None

    @property
    def op_precision(self):
        return self.ratio(self.op_right, self.op_answers)

    @property
    def op_recall(self):
        return self.ratio(self.op_recalled, self.op_determined)

    @property
    def ctr_precision(self):
        return self.ratio(self.ctr_right, self.ctr_attached)

    @property
    def ctr_recall(self):
        return self.ratio(self.ctr_recalled, self.ctr_determined)

    @property
    def nodes_precision(self):
        return self.ratio(self.nodes_right, self.nodes_answers)

    @property
    def nodes_recall(self):
        return self.ratio(self.nodes_recalled, self.nodes_determined)


# ================================================================================================================
# Running the stages


@contextlib.contextmanager
def _quiet():
    """The stages' warnings off while scoring (the benchmark runs hundreds of programs), restored after."""
    package = logging.getLogger("operator_profiler")
    level = package.level
    package.setLevel(logging.ERROR)
    try:
        yield
    finally:
        package.setLevel(level)


def _kernel_ids(timeline_dir: Path, pairs: list[list[int]]) -> list[int]:
    """The reader's kernel ids of kernels named by ``[device, start_ns]``."""
    table = pq.read_table(timeline_dir / "kernels.parquet", columns=["kernel_id", "device", "start_ns"]).to_pydict()
    by_identity = {(d, s): k for k, d, s in zip(table["kernel_id"], table["device"], table["start_ns"])}
    return sorted(by_identity[(d, s)] for d, s in pairs if (d, s) in by_identity)


def match_window(truth: dict, timeline_dir: Path) -> dict | None:
    """The ``window`` argument of ``match_files``: declared windows per ncu file (its file name); kernel windows
    as the reader's kernel ids."""
    if not truth["windows"]:
        return None
    sources = {}
    for name, window in truth["windows"].items():
        if "kernels" in window:
            sources[name] = {"kernel_ids": _kernel_ids(timeline_dir, window["kernels"])}
        else:
            sources[name] = dict(window)
    return {"sources": sources}


def run_stages(folder: Path, truth: dict) -> list[tuple[str, str]]:
    """Run the stages on a case folder into ``folder/out``; returns the errors as ``(stage, message)``."""
    with _quiet():
        return _run_stages(folder, truth)


def _run_stages(folder: Path, truth: dict) -> list[tuple[str, str]]:
    from operator_profiler import stages

    folder, out = Path(folder), Path(folder) / "out"
    errors: list[tuple[str, str]] = []

    def attempt(stage: str, fn, *args, **kwargs) -> bool:
        try:
            fn(*args, **kwargs)
            return True
        except Exception as exc:  # noqa: BLE001 -- any failure of the code under test is a finding
            where = traceback.extract_tb(exc.__traceback__)[-1]
            first = str(exc).splitlines()[0] if str(exc) else ""
            errors.append((stage, f"{type(exc).__name__}: {first} ({Path(where.filename).name}:{where.lineno})"))
            return False

    timeline = out / "timeline"
    if not attempt("timeline", stages.export_timeline, folder / truth["timeline"], timeline):
        return errors
    fusion = None
    if truth.get("inductor_dir"):
        fusion = out / "fusion_map.parquet"
        if not attempt("fusion_map", stages.build_fusion_map, folder / truth["inductor_dir"], fusion):
            fusion = None
    (out / "attribution").mkdir(parents=True, exist_ok=True)
    attempt("attribute", stages.attribute_files, timeline, None, fusion, out / "attribution" / "kernels.parquet")
    parquets = []
    (out / "ncu").mkdir(parents=True, exist_ok=True)
    for csv in truth["ncu_files"]:
        parquet = out / "ncu" / (Path(csv).stem + ".parquet")
        if attempt("ncu", stages.parse_ncu_files, [folder / csv], parquet):
            parquets.append(parquet)
    if parquets:
        (out / "matched").mkdir(parents=True, exist_ok=True)
        kwargs = {"window": match_window(truth, timeline)}
        if truth.get("process_map"):
            if "process_map" in inspect.signature(stages.match_files).parameters:
                kwargs["process_map"] = {int(a): int(b) for a, b in truth["process_map"].items()}
            else:
                errors.append(("match", "match_files takes no process_map (the --process-map option of opprof match)"))
        attempt("match", stages.match_files, timeline, parquets, out / "matched" / "kernel_metrics.parquet",
                out / "matched" / "diagnostics.json", **kwargs)
    return errors


# ================================================================================================================
# Scoring


def _read(path: Path, columns: list[str]) -> dict | None:
    if not path.is_file():
        return None
    schema = pq.read_schema(path)
    return pq.read_table(path, columns=[c for c in columns if c in schema.names]).to_pydict()


def score_case(folder: Path, truth: dict, errors: list[tuple[str, str]] = ()) -> Score:
    """Score the stage outputs in ``folder/out`` against ``truth``."""
    folder, out = Path(folder), Path(folder) / "out"
    seed = truth["seed"]
    s = Score(cases=1, kernels=len(truth["kernels"]), errors=[(seed, stage, msg) for stage, msg in errors])
    timeline = _read(out / "timeline" / "kernels.parquet", ["kernel_id", "device", "start_ns"])
    id_of = {}
    if timeline is not None:
        id_of = {(d, t): k for k, d, t in zip(timeline["kernel_id"], timeline["device"], timeline["start_ns"])}
        truth_keys = {(k["device"], k["start_ns"]) for k in truth["kernels"]}
        s.extra_in_timeline = len(timeline["kernel_id"]) - len(truth_keys & set(id_of))
    attribution = _read(out / "attribution" / "kernels.parquet", ["kernel_id", "operator", "source_nodes"])
    answers = {}
    if attribution is not None:
        answers = {k: (op, nodes) for k, op, nodes in zip(attribution["kernel_id"], attribution["operator"],
                                                            attribution["source_nodes"])}
    matched = _read(out / "matched" / "kernel_metrics.parquet", ["kernel_id", TOKEN_METRIC])
    attached = {}
    if matched is not None and TOKEN_METRIC in matched:
        attached = {k: round(v) for k, v in zip(matched["kernel_id"], matched[TOKEN_METRIC])
                    if v is not None and not math.isnan(v)}
    diagnostics = {}
    if (out / "matched" / "diagnostics.json").is_file():
        diagnostics = json.loads((out / "matched" / "diagnostics.json").read_text())
    refused_reason = {int(t["kernel_id"]): t.get("reason") for t in diagnostics.get("timeline_only_kernels", [])}
    s.ncu_only.update(r.get("reason") for r in diagnostics.get("ncu_only_rows", []))
    listed_rows = {(Path(str(r.get("source"))).name, int(r["ncu_id"])) for r in diagnostics.get("ncu_only_rows", [])}
    attached_tokens = set(attached.values())
    if matched is not None:
        s.silent_rows = sum(1 for r in truth["ncu_rows"]
                            if r["token"] not in attached_tokens and (r["file"], r["id"]) not in listed_rows)

    for k in truth["kernels"]:
        kid = id_of.get((k["device"], k["start_ns"]))
        if kid is None:
            s.not_in_timeline += 1
            continue
        label = f"{k['name'][:60]} @ {k['start_ns']}"
        operator, nodes = answers.get(kid, (None, None))
        if operator is not None:
            s.op_answers += 1
            if operator == k["operator"]:
                s.op_right += 1
            else:
                s.wrong_operators.append((seed, label, k["operator"], operator))
        if k["operator"] is not None and k["operator_determined"]:
            s.op_determined += 1
            if operator == k["operator"]:
                s.op_recalled += 1
            else:
                s.missed_operators.append((seed, label, k["operator"]))
        if k["source_nodes"] is not None:
            if nodes is not None and len(nodes):
                s.nodes_answers += 1
                s.nodes_right += list(nodes) == list(k["source_nodes"])
            if k["source_nodes_determined"]:
                s.nodes_determined += 1
                s.nodes_recalled += nodes is not None and list(nodes) == list(k["source_nodes"])
        token = attached.get(kid)
        if k["ncu"] is not None:
            s.pairs += 1
        if token is not None:
            s.ctr_attached += 1
            if token == k["token"]:
                s.ctr_right += 1
            else:
                s.wrong_counters.append((seed, label, k["token"], token))
        if k["counters_determined"]:
            s.ctr_determined += 1
            if token is not None and token == k["token"]:
                s.ctr_recalled += 1
            else:
                s.missed_counters.append((seed, label, refused_reason.get(kid, "no answer")))
        if k["ncu"] is not None and token is None:
            s.refused[refused_reason.get(kid, "no_reason")] += 1
            s.silent_kernels += matched is not None and kid not in refused_reason
    return s


def run_case(scenario: str, seed: int, folder: Path) -> tuple[Score, dict]:
    """Generate, run and score one case in ``folder``."""
    import time

    from ground_truth import generate

    start = time.perf_counter()
    truth = generate(scenario, seed, folder)
    errors = run_stages(folder, truth)
    score = score_case(folder, truth, errors)
    score.seconds = time.perf_counter() - start
    return score, truth
