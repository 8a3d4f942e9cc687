"""What machine a measurement runs on, read without torch: the CPU (``/proc/cpuinfo``), its last-level cache
(``/sys/devices/system/cpu/cpu*/cache``), the GPUs (``nvidia-smi -L``), the installed torch version
(``importlib.metadata``) and the other processes' CPU use (``/proc/stat``).

:func:`machine_identity` is what decides when the workflow measures the machine's ceilings again (the
``measure_ceilings`` rule's params, computed when the DAG is built: DESIGN.md, "Machine ceilings"); the rest
describes the machine in ``ceilings.json``. Linux files; elsewhere the fields are None.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
PROC_STAT = Path("/proc/stat")
CPU_DEVICES = Path("/sys/devices/system/cpu")
#: /proc/cpuinfo flags (x86) or Features (aarch64) of a CPU that computes bfloat16 natively; without one, a
#: bfloat16 GEMM is converted to and computed in float32 (emulated).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
#: The SIMD flags worth recording next to a GEMM peak (the vector width decides the FLOPs per cycle).
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2", "bf16", "i8mm")
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)i?B?\s*$", re.IGNORECASE)


def cpu_info(path: Path = CPUINFO) -> dict:
    """The CPU as /proc/cpuinfo describes it (its first processor block; Linux x86 and aarch64 spellings).

    Returns ``{"model", "vendor", "family", "model_id", "stepping", "logical_cpus", "flags"}``: ``model`` the
    ``model name`` line (aarch64 without one: ``implementer 0x.. part 0x..``), ``logical_cpus`` the number of
    ``processor`` entries, ``flags`` the ``flags`` (x86) or ``Features`` (aarch64) words, sorted; a field the
    file lacks is None (all of them when the file is unreadable).
    """
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return {"model": None, "vendor": None, "family": None, "model_id": None, "stepping": None,
                "logical_cpus": None, "flags": []}
    first: dict[str, str] = {}
    processors = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor":
            processors += 1
        if processors <= 1:
            first.setdefault(key, value)
    model = first.get("model name")
    if model is None and "CPU implementer" in first:
        model = f"implementer {first['CPU implementer']} part {first.get('CPU part', '?')}"
    flags = (first.get("flags") or first.get("Features") or "").split()
    return {"model": model, "vendor": first.get("vendor_id") or first.get("CPU implementer"),
            "family": first.get("cpu family"), "model_id": first.get("model"), "stepping": first.get("stepping"),
            "logical_cpus": processors or None, "flags": sorted(set(flags))}


def native_bf16(flags: list[str]) -> list[str]:
    """The flags among ``flags`` that mean native bfloat16 arithmetic (:data:`NATIVE_BF16_FLAGS`); empty:
    bfloat16 GEMMs are emulated."""
    return [f for f in NATIVE_BF16_FLAGS if f in set(flags)]


def _bytes(text: str) -> int | None:
    """A /sys cache size (``49152K``, ``2M``, ``512 KiB``) in bytes; None when not one."""
    m = _SIZE.match(text)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2).upper()]


def last_level_cache(cpu_devices: Path = CPU_DEVICES) -> dict | None:
    """The CPU's last-level data cache from ``/sys/devices/system/cpu/cpu*/cache/index*`` (``level``, ``type``,
    ``size``, ``shared_cpu_list``): the highest level of type Data or Unified.

    Returns ``{"level", "bytes_per_instance", "instances", "bytes"}``: ``instances`` the distinct CPU sets sharing
    one (an L3 per socket or per chiplet), ``bytes`` all of them together (what a multi-threaded sweep can keep
    cached); None when /sys does not say.
    """
    found: dict[int, tuple[int, set[str]]] = {}
    for index in sorted(Path(cpu_devices).glob("cpu[0-9]*/cache/index[0-9]*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text().strip())
            size = _bytes((index / "size").read_text().strip())
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind not in ("Data", "Unified") or size is None:
            continue
        per_level = found.setdefault(level, (size, set()))
        per_level[1].add(shared)
    if not found:
        return None
    level = max(found)
    size, instances = found[level]
    return {"level": level, "bytes_per_instance": size, "instances": len(instances),
            "bytes": size * len(instances)}


def gpu_list() -> list[str] | None:
    """``nvidia-smi -L``'s lines (``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``); None when nvidia-smi is
    not on PATH or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def installed_torch() -> str | None:
    """The version of the torch distribution this interpreter would import (no import); None if none."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_identity(device: str, threads: int | None, torch_version: str | None = None) -> dict:
    """What identifies the machine a ceiling holds for: ``{"device", "cpu_model", "logical_cpus", "gpus",
    "torch", "threads"}`` (``gpus``: ``nvidia-smi -L`` on ``cuda``, else None; ``torch``: ``torch_version``, or the
    installed distribution's). Reads files and runs nvidia-smi only: no torch import (the workflow computes it
    when the DAG is built)."""
    cpu = cpu_info()
    return {"device": device, "cpu_model": cpu["model"], "logical_cpus": cpu["logical_cpus"],
            "gpus": gpu_list() if device == "cuda" else None,
            "torch": torch_version if torch_version is not None else installed_torch(), "threads": threads}


def fingerprint(identity: dict) -> str:
    """A short stable digest (16 hex digits of SHA-256) of ``identity``'s sorted JSON."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def cpu_busy_seconds(path: Path = PROC_STAT) -> float | None:
    """CPU seconds all CPUs have spent busy since boot (the ``cpu`` line of /proc/stat: user, nice, system,
    irq, softirq and steal; idle and iowait are not busy); None when unreadable. Units: the kernel's clock
    ticks (``os.sysconf("SC_CLK_TCK")``), converted to seconds."""
    try:
        for line in Path(path).read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu":
                ticks = [int(v) for v in fields[1:9]]
                busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7]
                return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return None


def usable_cpus() -> int | None:
    """The CPUs this process may run on (its affinity: a cgroup or SLURM allocation narrows it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


#: A window shorter than this gives no load figure by default: /proc/stat and os.times count clock ticks of 10 ms
#: (per CPU), so over 0.25 s each figure is good to about 0.1 CPU, well inside the 0.5 CPU margin of "busy".
MIN_LOAD_WINDOW_S = 0.25
#: Other processes may keep the CPUs beside a measurement's threads busy, plus this much, before the machine counts
#: as busy (the timing worker's and the captures' rule: docs/optimize.md, "A busy machine").
BUSY_MARGIN_CPUS = 0.5


def process_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds process ``pid`` has used (user + system: fields 14 and 15 of ``/proc/PID/stat``, clock ticks;
    proc(5)); None when unreadable (no such process, not Linux)."""
    try:
        text = (Path(proc) / str(pid) / "stat").read_text()
        fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def load_window_start() -> dict:
    """The start of a window over which :func:`other_cpu_load` measures the other processes' CPU use: the
    machine's busy CPU seconds, this process's own and its parent's, and the wall clock."""
    import time

    own = os.times()
    parent = os.getppid()
    return {"busy": cpu_busy_seconds(), "own": own.user + own.system, "parent_pid": parent,
            "parent": process_cpu_seconds(parent), "wall": time.perf_counter()}


def other_cpu_load(start: dict, threads: int | None, min_window_s: float | None = None) -> dict:
    """How many CPUs other processes kept busy on average since ``start`` (:func:`load_window_start`): the busy
    time of all CPUs (/proc/stat) less this process's (every thread) and its parent's (a profiler that launched
    it, such as nsys, is part of the measurement, not a load beside it), over the window's wall time.

    Returns ``{"other_cpu_load", "usable_cpus", "threads", "threshold", "busy", "window_s", "how"}``:
    ``other_cpu_load`` in CPUs (None when /proc/stat is unreadable or the window is shorter than
    ``min_window_s``, default :data:`MIN_LOAD_WINDOW_S`); ``threshold`` = the usable CPUs beside ``threads`` (never below 0) plus
    :data:`BUSY_MARGIN_CPUS`; ``busy`` = the load above it (None when the load is unknown)."""
    import time

    wall = time.perf_counter() - start["wall"]
    busy_now, own = cpu_busy_seconds(), os.times()
    parent_now = process_cpu_seconds(start["parent_pid"])
    others = None
    shortest = MIN_LOAD_WINDOW_S if min_window_s is None else min_window_s
    if start["busy"] is not None and busy_now is not None and wall >= shortest:
        spent = (own.user + own.system) - start["own"]
        if start["parent"] is not None and parent_now is not None:
            spent += parent_now - start["parent"]
        others = round(max(0.0, (busy_now - start["busy"] - spent) / wall), 3)
    usable = usable_cpus()
    threads = threads or usable or 1
    threshold = max(0, (usable or threads) - threads) + BUSY_MARGIN_CPUS
    return {"other_cpu_load": others, "usable_cpus": usable, "threads": threads, "threshold": threshold,
            "busy": None if others is None else others > threshold, "window_s": round(wall, 3),
            "min_window_s": shortest,
            "how": "/proc/stat busy CPU time less this process's and its parent's, over the window"}
