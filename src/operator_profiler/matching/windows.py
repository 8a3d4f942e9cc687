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
        if not spec:
            return cls()
        if spec.get("kernel_ids") is not None:
            return cls("kernel_ids", kernel_ids=[int(k) for k in spec["kernel_ids"]],
                       pid=None if spec.get("pid") is None else int(spec["pid"]))
        if spec.get("contiguous"):
            return cls("contiguous", pid=None if spec.get("pid") is None else int(spec["pid"]))
        if spec.get("launch_skip") is not None or spec.get("launch_count") is not None:
            count = spec.get("launch_count")
            return cls("launches", launch_skip=int(spec.get("launch_skip") or 0),
                       launch_count=None if count is None else int(count), kernel=spec.get("kernel"),
                       pid=None if spec.get("pid") is None else int(spec["pid"]))
        return cls(pid=None if spec.get("pid") is None else int(spec["pid"]))

    def describe(self) -> dict:
        if self.kind == "kernel_ids":
            return {"kind": self.kind, "kernels": len(self.kernel_ids or [])}
        if self.kind == "launches":
            return {"kind": self.kind, "launch_skip": self.launch_skip, "launch_count": self.launch_count,
                    **({"kernel": self.kernel} if self.kernel else {})}
        return {"kind": self.kind}


def source_window(windows: dict, source) -> dict | None:
    """The window of one ncu file: looked up by the source as given, its file name, or its stem."""
    text = "" if source is None else str(source)
    name = text.replace("\\", "/").rsplit("/", 1)[-1]
    for key in (text, name, name.rsplit(".", 1)[0]):
        if key in windows:
            return windows[key]
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
