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
