"""Which launches of the timeline one ncu file covers: its window (DESIGN.md §4, matching step 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from .names import base_name


@dataclass
class Window:
    """The launches one ncu file covers (module docstring, step 2)."""

    kind: str = "unknown"  # kernel_ids | launches | contiguous | unknown
    kernel_ids: list[int] | None = None
    launch_skip: int = 0
    launch_count: int | None = None
    kernel: str | None = None  # launches: count only launches of this kernel (function name, or regex:...)
    pid: int | None = None  # the timeline process (our replays record it)

    @classmethod
    def from_spec(cls, spec: dict | None) -> Window:
        """A window from its JSON form (:func:`.match.match_invocations`).

        Raises:
            ValueError: a spec that is not an object, an unknown key, or a value that is not a non-negative
                integer (ids, skip, count, pid) / a string (kernel); the message names the key.
        """
        if not spec:
            return cls()
        if not isinstance(spec, dict):
            raise ValueError(f"a window is a JSON object, not {type(spec).__name__} ({spec!r})")
        unknown = set(spec) - {"kernel_ids", "pid", "contiguous", "launch_skip", "launch_count", "kernel"}
        if unknown:
            raise ValueError(f"unknown window key(s) {sorted(unknown)}: use kernel_ids, launch_skip, launch_count, "
                             "kernel, contiguous or pid")
        kinds = [k for k, present in (("kernel_ids", spec.get("kernel_ids") is not None),
                                      ("contiguous", "contiguous" in spec),
                                      ("launch_skip/launch_count", spec.get("launch_skip") is not None
                                       or spec.get("launch_count") is not None)) if present]
        if len(kinds) > 1:
            raise ValueError(f"a window is one of kernel_ids, contiguous or launch_skip/launch_count; this one has "
                             f"{' and '.join(kinds)}")
        if "contiguous" in spec and spec["contiguous"] is not True:
            raise ValueError(f"window contiguous must be true (leave it out otherwise), got {spec['contiguous']!r}")
        if spec.get("kernel") is not None and kinds != ["launch_skip/launch_count"]:
            raise ValueError("window kernel filters the launches counted by launch_skip/launch_count: give those too")
        pid = None if spec.get("pid") is None else _count(spec, "pid")
        if spec.get("kernel_ids") is not None:
            ids = spec["kernel_ids"]
            if not isinstance(ids, list) or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0
                                                    for k in ids):
                raise ValueError(f"window kernel_ids must be a list of kernel ids (non-negative integers), got {ids!r}")
            return cls("kernel_ids", kernel_ids=list(ids), pid=pid)
        if spec.get("contiguous"):
            return cls("contiguous", pid=pid)
        if spec.get("launch_skip") is not None or spec.get("launch_count") is not None:
            kernel = spec.get("kernel")
            if kernel is not None and (not isinstance(kernel, str) or not kernel):
                raise ValueError(f"window kernel must be a kernel name (or regex:...), got {kernel!r}")
            if kernel is not None and kernel.startswith("regex:"):
                try:
                    re.compile(kernel[len("regex:"):])
                except re.error as exc:
                    raise ValueError(f"window kernel {kernel!r} is not a valid regular expression ({exc})") from None
            count = None if spec.get("launch_count") is None else _count(spec, "launch_count")
            if count == 0:
                raise ValueError("window launch_count must be at least 1 (ncu --launch-count 0 profiles no launch, so "
                                 "a file of that run has no rows to place)")
            return cls("launches", launch_skip=_count(spec, "launch_skip") if spec.get("launch_skip") is not None
                       else 0, launch_count=count, kernel=kernel, pid=pid)
        return cls(pid=pid)

    def describe(self) -> dict:
        if self.kind == "kernel_ids":
            return {"kind": self.kind, "kernels": len(self.kernel_ids or [])}
        if self.kind == "launches":
            return {"kind": self.kind, "launch_skip": self.launch_skip, "launch_count": self.launch_count,
                    **({"kernel": self.kernel} if self.kernel else {})}
        return {"kind": self.kind}


def _count(spec: dict, key: str) -> int:
    value = spec[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"window {key} must be a non-negative integer, got {value!r}")
    return value


def check_window(window: dict | None, sources: list[str]) -> None:
    """A ``window`` argument before any matching: every window valid, every named file one of ``sources``.

    Raises:
        ValueError: naming the window and what is wrong with it (a typo in a file name would otherwise leave that
            file without its window, silently).
    """
    if not window:
        return
    if not isinstance(window, dict):
        raise ValueError(f"the window must be a JSON object, not {type(window).__name__}")
    if "sources" not in window:
        Window.from_spec(window)
        return
    if set(window) != {"sources"}:
        raise ValueError(f"a window with 'sources' has nothing beside it (found {sorted(set(window) - {'sources'})}): "
                         "put each file's window under sources")
    if not isinstance(window["sources"], dict):
        raise ValueError("window 'sources' must map ncu file names to windows")
    if not window["sources"]:
        raise ValueError("window 'sources' is empty: name each ncu file's window ({\"sources\": {\"NAME\": "
                         "{\"launch_skip\": S, \"launch_count\": C}}}), or pass no window")
    for name, spec in window["sources"].items():
        try:
            Window.from_spec(spec)
        except ValueError as exc:
            raise ValueError(f"window of {name}: {exc}") from None
        named = [s for s in sources if source_window({name: True}, s)]
        if not named:
            names = ", ".join(sorted({str(s).replace(chr(92), "/").rsplit("/", 1)[-1] for s in sources}))
            raise ValueError(f"a window names {name!r}, which is none of the ncu files ({names}); name a file by its "
                             "path, file name or stem")
        if len(named) > 1:
            raise ValueError(f"a window names {name!r}, which fits {len(named)} ncu files ({', '.join(named)}); name "
                             "each file by its path")
    for source in sources:
        names = [name for name in window["sources"] if source_window({name: True}, source)]
        if len(names) > 1:
            raise ValueError(f"{source} has {len(names)} windows ({', '.join(names)}); give it one")


def source_window(windows: dict, source) -> dict | None:
    """The window of one ncu file: looked up by the source as given, its file name, its stem, or a trailing part
    of its path (``run1/prof.csv``, ``./prof.csv``)."""
    text = "" if source is None else str(source)
    parts = [p for p in text.replace("\\", "/").split("/") if p not in ("", ".")]
    name = parts[-1] if parts else text
    for key in (text, name, name.rsplit(".", 1)[0]):
        if key in windows:
            return windows[key]
    for key, value in windows.items():
        wanted = [p for p in str(key).replace("\\", "/").split("/") if p not in ("", ".")]
        if wanted and parts[-len(wanted):] == wanted:
            return value
    return None


def window_segment(process: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The process's launches the file covers (kernel_id order)."""
    if window.kind == "kernel_ids":
        return process[process["kernel_id"].isin(set(window.kernel_ids or []))]
    if window.kind == "launches":
        cand = process
        if window.kernel:
            cand = process[[_kernel_filter(window.kernel, n, m) for n, m in zip(process["name"], process["mangled_name"])]]
        end = None if window.launch_count is None else window.launch_skip + window.launch_count
        return cand.iloc[window.launch_skip:end]
    return process


def _kernel_filter(pattern: str, name, mangled) -> bool:
    """ncu ``-k`` semantics on the function base: ``regex:<expr>`` searches it, anything else must equal it."""
    base = base_name(name if isinstance(name, str) else mangled)
    if pattern.startswith("regex:"):
        return re.search(pattern[len("regex:"):], base) is not None
    return pattern in (base, name, mangled)


_WINDOW_SPEC = re.compile(r"^(?P<name>.+?)=(?:(?P<contiguous>contiguous)|(?P<skip>\d+):(?P<count>\d+)(?::(?P<kernel>.+))?)$")


def parse_window_specs(specs: list[str]) -> dict:
    """``--window`` values -> the ``window`` argument of :func:`match_invocations`.

    ``NAME=SKIP:COUNT`` (the ncu run's ``--launch-skip``/``--launch-count``), ``NAME=SKIP:COUNT:KERNEL`` (with
    ``-k KERNEL``: only that kernel's launches are counted), ``NAME=contiguous`` (consecutive launches, start
    unknown); NAME is the ncu CSV's path, file name or stem.

    Raises:
        ValueError: a value in none of these forms, or one file given two windows (the message says which).
    """
    sources: dict = {}
    for spec in specs:
        m = _WINDOW_SPEC.match(spec.strip())
        if m is None:
            raise ValueError(f"--window {spec!r}: expected NAME=SKIP:COUNT, NAME=SKIP:COUNT:KERNEL or NAME=contiguous "
                             "(NAME: the ncu CSV's path, file name or stem; SKIP/COUNT: the ncu run's --launch-skip "
                             "and --launch-count), or a JSON file")
        name = m.group("name")
        if name in sources:
            raise ValueError(f"--window {spec!r}: {name} already has a window")
        if m.group("contiguous"):
            sources[name] = {"contiguous": True}
        else:
            sources[name] = {"launch_skip": int(m.group("skip")), "launch_count": int(m.group("count")),
                             **({"kernel": m.group("kernel")} if m.group("kernel") else {})}
    return {"sources": sources}


def check_replay_windows(sources: dict, matched: pd.DataFrame, diagnostics: dict) -> None:
    """Our own replays must profile exactly the planned kernels: a replay that profiled others (the
    launch window shifted: launches counted that the timeline does not have) would attach a neighbour's
    counters to a kernel. Unplanned ncu rows, planned kernels left without counters or a name
    disagreement the alignment could not explain fail the stage. Kernels refused as ``order_ambiguous``
    (CUDA-graph nodes that ran in another order on several streams) are not a shifted window: they stay
    visible as refusals.

    Raises:
        ValueError: naming the class, the counts and the first disagreement.
    """
    got = set(matched["kernel_id"].astype("int64")) if len(matched) else set()
    problems = []
    sources = {cls: win for cls, win in sources.items() if (win or {}).get("kernel_ids") is not None}
    if not sources:  # declared launch windows of imported files: refusals are reported, not fatal
        return
    unordered = {k["kernel_id"] for k in diagnostics.get("timeline_only_kernels", [])
                 if k.get("reason") == "order_ambiguous"}
    for cls, win in sorted(sources.items()):
        planned = set(int(k) for k in (win or {}).get("kernel_ids") or [])
        missing = planned - got - unordered
        extra = [r for r in diagnostics.get("ncu_only_rows", []) if r.get("reason") != "order_ambiguous"
                 and source_window({cls: True}, r.get("source"))]
        if missing or extra:
            problems.append(f"ncu file {cls}: {len(planned) - len(planned - got)} of {len(planned)} planned kernels "
                            f"matched, {len(extra)} profiled kernel(s) not planned")
    if problems or diagnostics.get("name_disagreements"):
        first = (diagnostics.get("name_disagreements") or [None])[0]
        raise ValueError("the ncu files with a kernel_ids window (our replays' windows) did not profile exactly "
                         "those kernels (" + "; ".join(problems or ["names disagree"])
                         + (f"; first disagreement: {first}" if first else "") + "): the launch window is shifted "
                         "(the replayed run launched other kernels than the timeline, e.g. autotuning or a different "
                         "input); counters are not attached: recapture, or check the replay's ncu/{cls}.replay.json")
