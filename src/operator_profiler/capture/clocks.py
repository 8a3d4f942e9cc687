"""GPU clocks: choose what to lock (``clocks/target.json``), lock them around a GPU tool, verify, and always
restore (also on SIGTERM). All values in MHz; everything through the ``nvidia-smi`` command line (visible
in the logs, replaceable by a fake in tests), never NVML.
Details: docs/modules.md#capture-clocks."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from ..config import ConfigError
from ..errors import ClockError, ClockPermissionError, ClocksInterrupted
from ..files import write_json

log = logging.getLogger(__name__)

NVIDIA_SMI = "nvidia-smi"
GPU_FIELDS = ("name", "uuid", "clocks.current.sm", "clocks.current.memory", "clocks.max.sm", "clocks.max.memory",
              "clocks.default_applications.graphics", "clocks.default_applications.memory")
POLICIES = ("base", "max", "fixed", "none")
# A read-back clock this far (MHz) from the request is reported as a warning: the driver rounds to its
# supported clock steps (15 MHz on recent data-center GPUs).
TOLERANCE_MHZ = 15
# Locking clocks (nvidia-smi -lgc/-lmc, NVML nvmlDeviceSetGpuLockedClocks / SetMemoryLockedClocks) "Requires root/admin
# permissions"; `nvidia-smi -acp` only relaxes the deprecated application clocks (-ac/-rac), not -lgc/-lmc.
NO_PERMISSION_FIXES = ("run the GPU jobs as root (locking clocks with nvidia-smi -lgc/-lmc requires root), "
                       "or set `clocks: {policy: none}` in the config to profile with unlocked clocks")


def _smi_path() -> str:
    path = shutil.which(NVIDIA_SMI)
    if path is None:
        raise ClockError(f"{NVIDIA_SMI} not found on PATH; GPU clock locking needs the NVIDIA driver utilities "
                         "(install them or add them to PATH), or set `clocks: {policy: none}` in the config")
    return path


def _run_smi(args: list[str]) -> subprocess.CompletedProcess:
    """Run ``nvidia-smi ARGS`` (no shell); the command is logged."""
    cmd = [_smi_path(), *args]
    log.info("clocks: %s", " ".join([NVIDIA_SMI, *args]))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise ClockError(f"`{NVIDIA_SMI} {' '.join(args)}` did not answer within 60 s; check the GPU driver") from None


def _output(proc: subprocess.CompletedProcess) -> str:
    return " ".join((proc.stdout + " " + proc.stderr).split())


def _query(args: list[str], what: str) -> list[list[str]]:
    proc = _run_smi(args)
    if proc.returncode != 0:
        raise ClockError(f"`{NVIDIA_SMI} {' '.join(args)}` ({what}) failed with exit status {proc.returncode}: "
                         f"{_output(proc) or 'no output'}; check that the GPU is visible and the driver works")
    return [[v.strip() for v in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]


def _mhz(value: str) -> int | None:
    """A clock from ``--format=csv,nounits``; ``[N/A]``/``[Not Supported]`` -> None."""
    try:
        return int(float(value))
    except ValueError:
        return None


def gpu_id(device: str = "cuda") -> str:
    """The ``nvidia-smi -i`` id of the GPU that torch calls ``device`` (``cuda`` = ``cuda:0``).

    torch numbers only the GPUs in ``CUDA_VISIBLE_DEVICES`` (as set by SLURM or the user), while
    ``nvidia-smi -i`` takes the physical index or a UUID: the N-th entry of ``CUDA_VISIBLE_DEVICES``
    is used when it is set, else N.
    """
    n = int(device.split(":", 1)[1]) if ":" in device else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        if n >= len(visible):
            raise ClockError(f"device {device} is not among CUDA_VISIBLE_DEVICES={','.join(visible)}; "
                             "use a visible device")
        return visible[n]
    return str(n)


def query_gpu(device_index: int | str, supported: bool = True) -> dict:
    """Name and clocks (MHz) of one GPU, from ``nvidia-smi`` (see the module docstring for the commands).

    Returns ``{"index", "name", "uuid", "sm_mhz", "mem_mhz"`` (current), ``"max_sm_mhz", "max_mem_mhz",
    "default_app_sm_mhz", "default_app_mem_mhz", "supported": {mem_mhz: [sm_mhz, ...]}}``; clocks the
    GPU does not report are None, ``supported`` is empty when the driver lists none or when
    ``supported=False`` (which skips the ``--query-supported-clocks`` call, for read-backs).

    Raises:
        ClockError: nvidia-smi missing, failing, or answering in an unexpected shape.
    """
    idx = str(device_index)
    rows = _query(["-i", idx, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"], "GPU clocks")
    if len(rows) != 1 or len(rows[0]) != len(GPU_FIELDS):
        raise ClockError(f"`{NVIDIA_SMI} --query-gpu` for GPU {idx} gave {rows!r}, expected one line of "
                         f"{len(GPU_FIELDS)} fields; check the GPU id and the driver")
    v = dict(zip(GPU_FIELDS, rows[0]))
    table: dict[int, list[int]] = {}
    pairs: list[list[str]] = []
    if supported:
        pairs = _supported_pairs(idx)
    for pair in pairs:
        mem, gr = (_mhz(pair[0]), _mhz(pair[1])) if len(pair) == 2 else (None, None)
        if mem is not None and gr is not None:
            table.setdefault(mem, []).append(gr)
    return {
        "index": idx, "name": v["name"], "uuid": v["uuid"],
        "sm_mhz": _mhz(v["clocks.current.sm"]), "mem_mhz": _mhz(v["clocks.current.memory"]),
        "max_sm_mhz": _mhz(v["clocks.max.sm"]), "max_mem_mhz": _mhz(v["clocks.max.memory"]),
        "default_app_sm_mhz": _mhz(v["clocks.default_applications.graphics"]),
        "default_app_mem_mhz": _mhz(v["clocks.default_applications.memory"]),
        "supported": {m: sorted(set(g), reverse=True) for m, g in sorted(table.items(), reverse=True)},
    }


def _supported_pairs(idx: str) -> list[list[str]]:
    try:
        pairs = _query(["-i", idx, "--query-supported-clocks=memory,graphics", "--format=csv,noheader,nounits"],
                       "supported clocks")
    except ClockError as exc:  # some GPUs list none ([N/A]); selection then says "not checked"
        log.warning("clocks: %s", exc)
        pairs = []
    return pairs


def _check_fixed(gpu: dict, sm: int, mem: int) -> str:
    supported = gpu["supported"]
    if not supported:
        return f"policy fixed: {sm} MHz SM, {mem} MHz memory (the GPU lists no supported clocks: not checked)"
    if mem not in supported:
        raise ConfigError(f"clocks.mem_mhz {mem} is not a supported memory clock of {gpu['name']} (GPU {gpu['index']}); "
                          f"supported memory clocks (MHz): {', '.join(map(str, supported))}")
    if sm not in supported[mem]:
        raise ConfigError(f"clocks.sm_mhz {sm} is not a supported SM clock of {gpu['name']} (GPU {gpu['index']}) at "
                          f"memory clock {mem} MHz; supported SM clocks (MHz): {', '.join(map(str, supported[mem]))}")
    return f"policy fixed: {sm} MHz SM, {mem} MHz memory (a supported pair)"


def choose_target(config: dict, device: str) -> dict:
    """What to lock, as written to ``clocks/target.json``:
    ``{policy, device, gpu, gpu_index, gpu_uuid, sm_mhz, mem_mhz, reason}`` (MHz; None = not locked).

    ``config`` is the config's ``clocks`` section: ``policy`` base (default application clocks, see the
    module docstring), max (``clocks.max.*``), fixed (``sm_mhz`` and ``mem_mhz``, which must be a pair
    the GPU supports) or none. On ``cpu`` nothing is locked.

    Raises:
        ConfigError: unknown policy; policy fixed without both clocks or with clocks the GPU does not
            support (the message lists the supported values).
        ClockError: nvidia-smi missing or failing (policy none tolerates a missing nvidia-smi), or
            policy base on a GPU that reports no default application clocks.
    """
    policy = config.get("policy", "base")
    if device == "cpu":
        return {"policy": "none", "device": "cpu", "reason": "CPU run: no GPU clocks to lock",
                "sm_mhz": None, "mem_mhz": None, "gpu": None}
    if policy not in POLICIES:
        raise ConfigError(f"clocks.policy {policy!r} is not one of {', '.join(POLICIES)}")
    sm, mem = config.get("sm_mhz"), config.get("mem_mhz")
    if policy == "fixed" and (sm is None or mem is None):
        raise ConfigError("clocks.policy fixed needs both clocks.sm_mhz and clocks.mem_mhz (MHz); set them, or use "
                          "policy base or max")
    idx = gpu_id(device)
    if policy == "none" and shutil.which(NVIDIA_SMI) is None:
        return {"policy": "none", "device": device, "gpu": None, "gpu_index": idx, "gpu_uuid": None,
                "sm_mhz": None, "mem_mhz": None, "reason": f"policy none: clocks not locked ({NVIDIA_SMI} not found)"}
    gpu = query_gpu(idx)
    target = {"policy": policy, "device": device, "gpu": gpu["name"], "gpu_index": idx, "gpu_uuid": gpu["uuid"]}
    if policy == "none":
        return {**target, "sm_mhz": None, "mem_mhz": None, "reason": "policy none: clocks not locked"}
    if policy == "fixed":
        return {**target, "sm_mhz": int(sm), "mem_mhz": int(mem), "reason": _check_fixed(gpu, int(sm), int(mem))}
    if policy == "max":
        sm, mem = gpu["max_sm_mhz"], gpu["max_mem_mhz"]
        if sm is None or mem is None:
            raise ClockError(f"{gpu['name']} (GPU {idx}) reports no maximum clocks (clocks.max.sm/memory); "
                             "set clocks: {policy: fixed, sm_mhz: ..., mem_mhz: ...} or policy none")
        return {**target, "sm_mhz": sm, "mem_mhz": mem,
                "reason": "policy max: clocks.max.sm and clocks.max.memory"}
    sm, mem = gpu["default_app_sm_mhz"], gpu["default_app_mem_mhz"]
    if sm is None:
        raise ClockError(f"{gpu['name']} (GPU {idx}) reports no default application clock "
                         "(clocks.default_applications.graphics), which policy base locks to; set clocks.policy "
                         "max, or fixed with sm_mhz and mem_mhz, or none")
    reason = "policy base: default application clocks (clocks.default_applications.graphics/.memory)"
    if mem is None:
        mem = gpu["max_mem_mhz"]
        if mem is None:
            raise ClockError(f"{gpu['name']} (GPU {idx}) reports neither a default application nor a maximum memory "
                             "clock; set clocks.policy fixed with sm_mhz and mem_mhz, or none")
        reason = ("policy base: default application SM clock (clocks.default_applications.graphics); no default "
                  "application memory clock reported, so memory at clocks.max.memory")
    return {**target, "sm_mhz": sm, "mem_mhz": mem, "reason": reason}


def select_clocks(config: dict, device: str, out: Path) -> None:
    """Write ``clocks/target.json`` (atomic): :func:`choose_target` of the config's ``clocks`` section.

    Raises:
        ConfigError, ClockError: see :func:`choose_target`.
    """
    write_json(Path(out), choose_target(config, device))


def _lock_failure(args: list[str], proc: subprocess.CompletedProcess) -> ClockError:
    text = _output(proc) or "no output"
    cmd = f"`{NVIDIA_SMI} {' '.join(args)}`"
    low = text.lower()
    if proc.returncode == 4 or "permission" in low:
        return ClockPermissionError(f"{cmd} was refused (no permission to lock GPU clocks: {text}); fix: "
                                    f"{NO_PERMISSION_FIXES}")
    if proc.returncode == 3 or "not supported" in low:
        return ClockPermissionError(f"{cmd} failed: locking this clock is not supported on this GPU ({text}); "
                                    "set `clocks: {policy: none}` in the config to profile with unlocked clocks")
    return ClockError(f"{cmd} failed with exit status {proc.returncode}: {text}; fix: {NO_PERMISSION_FIXES}")


def _not_supported(proc: subprocess.CompletedProcess) -> bool:
    """nvidia-smi's "not supported" answer (exit status 3, nvidia-smi man page), not a permission refusal."""
    return proc.returncode == 3 or ("not supported" in (_output(proc) or "").lower() and proc.returncode != 4)


@contextlib.contextmanager
def gpu_job_lock(gpu: str):
    """Hold an exclusive lock for one GPU for the duration of a GPU job, across processes.

    Snakemake runs jobs concurrently unless ``--resources gpu=1`` is given; two captures or replays on
    one GPU would skew each other's times and one job's clock restore would unlock the other's clocks.
    Every GPU job therefore takes ``fcntl.flock`` on ``<tmp>/operator_profiler-gpu-<gpu>.lock`` (one
    machine: a cluster node's jobs share its /tmp) and waits its turn, logging that it waits.
    """
    import fcntl
    import tempfile

    path = Path(tempfile.gettempdir()) / f"operator_profiler-gpu-{gpu.replace('/', '_')}.lock"
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("GPU %s is used by another profiling job; waiting for it (%s)", gpu, path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _readback(idx: str, requested: dict, when: str, warnings: list[str]) -> dict:
    gpu = query_gpu(idx, supported=False)
    got = {"sm_mhz": gpu["sm_mhz"], "mem_mhz": gpu["mem_mhz"]}
    for key, name in (("sm_mhz", "SM"), ("mem_mhz", "memory")):
        want, have = requested[key], got[key]
        if have is None or abs(have - want) > TOLERANCE_MHZ:
            warnings.append(f"{name} clock read back {when}: {have} MHz, requested {want} MHz "
                            f"(tolerance {TOLERANCE_MHZ} MHz): the lock may not hold")
    return got


@contextlib.contextmanager
def locked_clocks(target: dict, out_applied: Path, device: str | None = None):
    """Lock the GPU's clocks around a GPU job, holding the GPU exclusively (:func:`gpu_job_lock`) for
    the whole job; see :func:`_locked_clocks` for the locking itself, what is written and raised."""
    if target.get("device") == "cpu":
        with _locked_clocks(target, out_applied, device) as applied:
            yield applied
        return
    with gpu_job_lock(gpu_id(device or target.get("device") or "cuda")):
        with _locked_clocks(target, out_applied, device) as applied:
            yield applied


@contextlib.contextmanager
def _locked_clocks(target: dict, out_applied: Path, device: str | None = None):
    """Lock the clocks of ``target`` (a ``target.json`` dict) for the duration of the block.

    Yields the applied dict, which the caller may extend (e.g. with ``measured_s``); on exit it is
    written atomically to ``out_applied`` (``clocks_applied.json``), also after an error.

    - policy ``none`` (or a CPU target): nothing is run; ``{locked: False, reason: "clocks not locked
      (policy none)"}``.
    - otherwise, on the GPU ``gpu_id(device)`` (default: the target's device): ``nvidia-smi -i ID
      -lgc SM,SM``, then ``-lmc MEM,MEM``, then a read-back (:func:`query_gpu`); the applied dict is
      ``{locked: True, requested, applied, gpu, gpu_index, ..., warnings}``. A read-back more than
      :data:`TOLERANCE_MHZ` from the request adds a warning (an idle GPU may also report a lower
      current clock), and the clocks are read back again after the block completes
      (``applied_after``).
    - on exit, **always** (normal exit, exception, KeyboardInterrupt, SIGTERM): ``nvidia-smi -i ID -rgc``
      and ``-rmc`` for the clocks that were locked; ``restored`` says whether both succeeded. A failed
      restore is logged and recorded (``restored: false``, a warning with the manual command), not
      raised. For the block, SIGTERM (a cluster cancelling the job) raises :class:`ClocksInterrupted`
      (exit status 143) in the main thread; the previous handler is put back afterwards.

    Raises:
        ClockPermissionError: nvidia-smi refused the lock (no permission / not supported); the message
            gives the fixes. Clocks already locked are restored first.
        ClockError: nvidia-smi missing or failing, or the GPU is not the model the target was chosen on.
    """
    out_applied = Path(out_applied)
    policy = target.get("policy", "none")
    base = {"policy": policy, "device": target.get("device"), "gpu": target.get("gpu"),
            "gpu_index": target.get("gpu_index"), "gpu_uuid": target.get("gpu_uuid"),
            "requested": {"sm_mhz": target.get("sm_mhz"), "mem_mhz": target.get("mem_mhz")}}
    if policy == "none" or target.get("device") == "cpu":
        applied = {**base, "locked": False, "reason": "clocks not locked (policy none)", "warnings": []}
        try:
            yield applied
        finally:
            write_json(out_applied, applied)
        return

    idx = gpu_id(device or target.get("device") or "cuda")
    requested = {"sm_mhz": int(target["sm_mhz"]), "mem_mhz": int(target["mem_mhz"])}
    warnings: list[str] = []
    applied = {**base, "gpu_index": idx, "locked": False, "requested": requested, "applied": None,
               "warnings": warnings, "restored": None, "outcome": None,
               "reason": f"{target.get('reason', policy)}"}
    gpu = query_gpu(idx, supported=False)
    if target.get("gpu") and gpu["name"] != target["gpu"]:
        raise ClockError(f"clocks/target.json was chosen for {target['gpu']}, but this job runs on {gpu['name']} "
                         f"(GPU {idx}); rerun select_clocks on the GPU model the captures run on")
    applied["gpu"], applied["gpu_uuid"] = gpu["name"], gpu["uuid"]

    locked: list[str] = []  # reset flags, in lock order
    restoring = False
    main = threading.current_thread() is threading.main_thread()

    def on_sigterm(signum, frame):
        if restoring:  # a second SIGTERM while restoring: finish the restore first
            log.warning("clocks: SIGTERM while restoring clocks, ignored until the restore is done")
            return
        raise ClocksInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm) if main else None
    try:
        for flag, reset, key in (("-lgc", "-rgc", "sm_mhz"), ("-lmc", "-rmc", "mem_mhz")):
            args = ["-i", idx, flag, f"{requested[key]},{requested[key]}"]
            locked.append(reset)  # before the call: a SIGTERM during it still restores
            proc = _run_smi(args)
            if proc.returncode != 0:
                locked.pop()  # refused: nothing to reset
                failure = _lock_failure(args, proc)
                if flag == "-lmc" and _not_supported(proc):
                    # GPUs whose memory runs at one clock (HBM parts) may refuse -lmc: the SM clock
                    # lock still holds, and the read-back shows the memory clock.
                    warnings.append(f"memory clock not locked ({failure}); only the SM clock is locked")
                    log.warning("clocks: %s", warnings[-1])
                    continue
                raise failure
        applied["locked"] = True
        applied["applied"] = _readback(idx, requested, "after locking", warnings)
        yield applied
        applied["applied_after"] = _readback(idx, requested, "after the run", warnings)
        applied["outcome"] = "completed"
    except ClocksInterrupted:
        applied["outcome"] = "interrupted: SIGTERM"
        log.warning("clocks: SIGTERM received; restoring clocks, then exiting with status 143")
        raise
    except KeyboardInterrupt:
        applied["outcome"] = "interrupted: KeyboardInterrupt"
        raise
    except BaseException as exc:
        applied["outcome"] = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
        raise
    finally:
        restoring = True
        try:
            ok = True
            for reset in locked:
                args = ["-i", idx, reset]
                try:
                    proc = _run_smi(args)
                    failed = None if proc.returncode == 0 else (_output(proc) or f"exit status {proc.returncode}")
                except (ClockError, OSError) as exc:
                    failed = str(exc)
                if failed:
                    ok = False
                    warnings.append(f"`{NVIDIA_SMI} {' '.join(args)}` failed ({failed}): clocks "
                                    f"may still be locked; run `sudo {NVIDIA_SMI} {' '.join(args)}`")
                    log.error("clocks: %s", warnings[-1])
            applied["restored"] = ok if locked else None
            write_json(out_applied, applied)
        finally:
            if main:  # None: the previous handler was not installed from Python; the default is the safe guess
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def ncu_clock_args(applied: dict) -> list[str]:
    """ncu options for the clocks: ``["--clock-control", "none"]`` when :func:`locked_clocks` locked them,
    so ncu keeps our lock instead of locking its own; else ``[]``, and ncu locks clocks itself with its
    default ``--clock-control`` (``base`` in older ncu builds, ``boost`` in 2026.1; Nsight Compute CLI
    guide, https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html, and docs/formats.md#ncu-filters-and-replay).
    """
    return ["--clock-control", "none"] if applied.get("locked") else []
