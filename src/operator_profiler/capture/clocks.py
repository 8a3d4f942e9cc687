"""GPU clocks: choose what to lock (``clocks/target.json``), lock them around a GPU job, verify the lock with
read-backs taken while the job runs, and always restore (also on SIGTERM). All values in MHz; everything
through the ``nvidia-smi`` command line (visible in the logs, replaceable by a fake in tests), never NVML.
Details: docs/modules.md#capture-clocks; the nvidia-smi facts this relies on: docs/formats.md#nvidia-smi."""

from __future__ import annotations

import contextlib
import logging
import os
import pty
import re
import shutil
import signal
import subprocess
import threading
from datetime import datetime
from pathlib import Path

# ConfigError from errors, not config: config imports yaml and the schema machinery, which a clocks job never needs
from ..errors import ClockError, ClockPermissionError, ClocksInterrupted, ConfigError
from ..files import write_json

log = logging.getLogger(__name__)

NVIDIA_SMI = "nvidia-smi"
# Fields every driver since R450 answers; one unknown field fails the whole --query-gpu call.
GPU_FIELDS = ("name", "uuid", "persistence_mode", "mig.mode.current", "clocks.current.sm", "clocks.current.memory",
              "clocks.max.sm", "clocks.max.memory")
# Deprecated since CUDA 13.0, removed in CUDA 14.0 (NVML deprecations): a call of their own, whose failure
# only means "not available".
DEFAULT_APP_FIELDS = ("clocks.default_applications.graphics", "clocks.default_applications.memory")
REASONS_FIELD = "clocks_event_reasons.active"
LEGACY_REASONS_FIELD = "clocks_throttle_reasons.active"  # the name before driver R535
SAMPLE_FIELDS = ("timestamp", "clocks.current.sm", "clocks.current.memory", REASONS_FIELD)
SAMPLE_MS = 500  # the read-back loop's interval (nvidia-smi -lms)
FIRST_SAMPLE_S = 30.0  # an nvidia-smi start that initializes the driver (persistence mode off) can take seconds
DEPRECATED_CELL = "[Requested functionality has been deprecated]"
POLICIES = ("base", "max", "fixed", "none")
BASE_APP = "default application clocks"
BASE_TDP = "TDP lock (nvidia-smi -lgc tdp,tdp)"
# A read-back clock this far (MHz) from the request does not count as locked: the driver rounds to its
# supported clock steps (15 MHz on recent data-center GPUs).
TOLERANCE_MHZ = 15
# Locking clocks (nvidia-smi -lgc/-lmc, NVML nvmlDeviceSetGpuLockedClocks / SetMemoryLockedClocks) "Requires root/admin
# permissions"; `nvidia-smi -acp` only relaxes the deprecated application clocks (-ac/-rac), not -lgc/-lmc.
NO_PERMISSION_FIXES = ("run the GPU jobs as root (locking clocks with nvidia-smi -lgc/-lmc requires root), or set "
                       "`clocks: {sudo: true}` with a sudoers rule that lets this user run "
                       "`nvidia-smi -lgc/-rgc/-lmc/-rmc` without a password (docs/gpu.md#clocks), or set "
                       "`clocks: {policy: none}` in the config to profile with unlocked clocks")
PERSISTENCE_FIX = "sudo nvidia-smi -pm 1"
# clocks_event_reasons.active bits (nvml.h nvmlClocksEventReason*); gpu_idle: "Nothing is running on the GPU and
# the clocks are dropping to Idle state".
GPU_IDLE = 0x1
EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def _smi_path() -> str:
    path = shutil.which(NVIDIA_SMI)
    if path is None:
        raise ClockError(f"{NVIDIA_SMI} not found on PATH; GPU clock locking needs the NVIDIA driver utilities "
                         "(install them or add them to PATH), or set `clocks: {policy: none}` in the config")
    return path


def _shown(args: list[str], sudo: bool = False) -> str:
    return " ".join([*(["sudo", "-n"] if sudo else []), NVIDIA_SMI, *args])


def _run_smi(args: list[str], sudo: bool = False) -> subprocess.CompletedProcess:
    """Run ``nvidia-smi ARGS`` (no shell), as ``sudo -n nvidia-smi ARGS`` with ``sudo``; the command is logged."""
    cmd = [_smi_path(), *args]
    if sudo:
        sudo_path = shutil.which("sudo")
        if sudo_path is None:
            raise ClockError("clocks.sudo is set but there is no sudo on PATH; install sudo, run the GPU jobs as root, "
                             "or set `clocks: {sudo: false}`")
        cmd = [sudo_path, "-n", *cmd]
    log.info("clocks: %s", _shown(args, sudo))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ClockError(f"`{_shown(args, sudo)}` did not answer within 60 s; check the GPU driver") from None


def _output(proc: subprocess.CompletedProcess) -> str:
    return " ".join((proc.stdout + " " + proc.stderr).split())


def _rows(text: str) -> list[list[str]]:
    return [[v.strip() for v in line.split(",")] for line in text.splitlines() if line.strip()]


def _query(args: list[str], what: str) -> list[list[str]]:
    proc = _run_smi(args)
    if proc.returncode != 0:
        raise ClockError(f"`{NVIDIA_SMI} {' '.join(args)}` ({what}) failed with exit status {proc.returncode}: "
                         f"{_output(proc) or 'no output'}; check that the GPU is visible and the driver works")
    return _rows(proc.stdout)


def _mhz(value: str) -> int | None:
    """A clock from ``--format=csv,nounits``; ``[N/A]``, ``[Not Supported]``, the deprecated cell -> None."""
    try:
        return int(float(value))
    except ValueError:
        return None


def _flag(value: str) -> bool | None:
    """``Enabled`` -> True, ``Disabled`` -> False, anything else (``[N/A]``) -> None."""
    return {"Enabled": True, "Disabled": False}.get(value.strip())


# ---------------------------------------------------------------------------------------------- which GPU


def _listed_uuids() -> list[tuple[str, str, str]]:
    """``nvidia-smi -L`` as ``(index, GPU uuid, uuid)``: each GPU, and each MIG device under its GPU."""
    proc = _run_smi(["-L"])
    if proc.returncode != 0:
        raise ClockError(f"`{NVIDIA_SMI} -L` failed with exit status {proc.returncode}: "
                         f"{_output(proc) or 'no output'}; check that the GPU is visible and the driver works")
    found, gpu = [], None
    for line in proc.stdout.splitlines():
        m = re.match(r"\s*GPU (\d+):.*\(UUID: (GPU-[0-9A-Fa-f-]+)\)", line)
        if m:
            gpu = (m.group(1), m.group(2))
            found.append((gpu[0], gpu[1], gpu[1]))
            continue
        m = re.match(r"\s*MIG .*\(UUID: (MIG-[^)\s]+)\)", line)
        if m and gpu is not None:
            found.append((gpu[0], gpu[1], m.group(1)))
    return found


def _index_of_uuid(uuid: str, where: str) -> str:
    """The ``nvidia-smi`` index of the GPU with this UUID, or of the GPU a MIG device (``MIG-...``) belongs to
    (``nvidia-smi -L``). ``uuid`` may lack its ``GPU-``/``MIG-`` prefix (torch's form)."""
    bare = re.sub(r"^(GPU|MIG)-", "", uuid).lower()
    listed = _listed_uuids()
    for index, _gpu, listed_uuid in listed:
        if re.sub(r"^(GPU|MIG)-", "", listed_uuid).lower() == bare:
            return index
    raise ClockError(f"{where} is the device {uuid}, which `{NVIDIA_SMI} -L` does not list ({len(listed)} GPUs and "
                     "MIG devices); check that torch and nvidia-smi see the same driver and GPUs")


def _torch_uuid(n: int, device: str) -> str | None:
    """torch's UUID of ``cuda:n`` (``GPU-`` + lowercase 8-4-4-4-12 hex), or None when torch is not importable or
    sees no CUDA device. Imported here, not at module import: the workflow imports this module to build the DAG."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        count = torch.cuda.device_count()
        if n >= count:
            raise ClockError(f"device {device} is not one of the {count} CUDA devices torch sees; use a visible device")
        raw = str(getattr(torch.cuda.get_device_properties(n), "uuid", "") or "").strip()
    except ClockError:
        raise
    except Exception as exc:  # an old torch without .uuid, a driver error: the CUDA_VISIBLE_DEVICES mapping
        log.warning("clocks: torch gave no UUID for %s (%s); mapping it through CUDA_VISIBLE_DEVICES", device, exc)
        return None
    if not raw:
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else "GPU-" + raw


def gpu_id(device: str = "cuda") -> str:
    """The ``nvidia-smi -i`` id of the GPU that torch calls ``device`` (``cuda`` = ``cuda:0``).

    - When torch is importable and sees CUDA: torch's UUID of the device
      (``torch.cuda.get_device_properties(n).uuid``), looked up in ``nvidia-smi -L``; the id is that GPU's
      index, for a MIG instance the index of the GPU it belongs to (clocks are the whole GPU's). CUDA's
      default device order (fastest first) can differ from nvidia-smi's (PCI bus), so torch's number alone
      does not name the GPU. Without nvidia-smi on PATH (policy none), the UUID itself.
    - Otherwise: torch numbers only the GPUs in ``CUDA_VISIBLE_DEVICES`` (as set by SLURM or the user), while
      ``nvidia-smi -i`` takes the physical index or a UUID: the N-th entry of ``CUDA_VISIBLE_DEVICES`` is
      used when it is set (a ``MIG-...`` entry: the index of its GPU), else N.

    Raises:
        ClockError: the device is not visible, or its UUID is not listed by ``nvidia-smi -L``.
    """
    n = int(device.split(":", 1)[1]) if ":" in device else 0
    uuid = _torch_uuid(n, device)
    if uuid is not None:
        if shutil.which(NVIDIA_SMI) is None:  # nothing to lock (policy none); the UUID still names the GPU's job lock
            return uuid
        return _index_of_uuid(uuid, f"torch's {device}")
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        if n >= len(visible):
            raise ClockError(f"device {device} is not among CUDA_VISIBLE_DEVICES={','.join(visible)}; "
                             "use a visible device")
        if visible[n].startswith("MIG-"):
            return _index_of_uuid(visible[n], f"CUDA_VISIBLE_DEVICES entry {n}")
        return visible[n]
    return str(n)


# ---------------------------------------------------------------------------------------------- queries


def default_app_clocks(device_index: int | str) -> dict:
    """The default application clocks (MHz) of one GPU, from a call of their own that may fail:
    ``nvidia-smi -i ID --query-gpu=clocks.default_applications.graphics,clocks.default_applications.memory``.

    Returns ``{"sm_mhz", "mem_mhz", "answer"}``: the clocks, None where not available, and ``answer`` the
    text nvidia-smi gave (the two cells, or ``exit status N: <output>``). Deprecated since CUDA 13.0: a
    driver may answer ``[Requested functionality has been deprecated]`` or ``[N/A]`` in a cell, and once the
    fields are removed the call fails (``Field "..." is not a valid field to query.``); all of these mean
    "not available", never an error. Raises ClockError only when nvidia-smi is missing.
    """
    args = ["-i", str(device_index), f"--query-gpu={','.join(DEFAULT_APP_FIELDS)}", "--format=csv,noheader,nounits"]
    proc = _run_smi(args)
    rows = _rows(proc.stdout) if proc.returncode == 0 else []
    if proc.returncode != 0 or len(rows) != 1 or len(rows[0]) != len(DEFAULT_APP_FIELDS):
        answer = f"exit status {proc.returncode}: {_output(proc) or 'no output'}"
        log.info("clocks: no default application clocks (%s)", answer)
        return {"sm_mhz": None, "mem_mhz": None, "answer": answer}
    return {"sm_mhz": _mhz(rows[0][0]), "mem_mhz": _mhz(rows[0][1]), "answer": ", ".join(rows[0])}


def query_gpu(device_index: int | str, supported: bool = True, default_app: bool = True) -> dict:
    """Name, state and clocks (MHz) of one GPU, from ``nvidia-smi`` (docs/formats.md#nvidia-smi).

    Returns ``{"index", "name", "uuid", "persistence_mode"`` (``Enabled``/``Disabled``/``[N/A]``), ``"mig"``
    (True/False, None when the GPU has no MIG mode), ``"sm_mhz", "mem_mhz"`` (current), ``"max_sm_mhz",
    "max_mem_mhz", "default_app_sm_mhz", "default_app_mem_mhz", "default_app_answer", "supported":
    {mem_mhz: [sm_mhz, ...]}}``; clocks the GPU does not report are None. ``supported`` is empty when the
    driver lists none or when ``supported=False`` (which skips the ``--query-supported-clocks`` call);
    ``default_app=False`` skips the default application clocks' own call (:func:`default_app_clocks`; then
    None, answer ``not queried``).

    Raises:
        ClockError: nvidia-smi missing, failing, or answering in an unexpected shape.
    """
    idx = str(device_index)
    rows = _query(["-i", idx, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"], "GPU state")
    if len(rows) != 1 or len(rows[0]) != len(GPU_FIELDS):
        raise ClockError(f"`{NVIDIA_SMI} --query-gpu` for GPU {idx} gave {rows!r}, expected one line of "
                         f"{len(GPU_FIELDS)} fields; check the GPU id and the driver")
    v = dict(zip(GPU_FIELDS, rows[0]))
    table: dict[int, list[int]] = {}
    for pair in _supported_pairs(idx) if supported else []:
        mem, gr = (_mhz(pair[0]), _mhz(pair[1])) if len(pair) == 2 else (None, None)
        if mem is not None and gr is not None:
            table.setdefault(mem, []).append(gr)
    app = default_app_clocks(idx) if default_app else {"sm_mhz": None, "mem_mhz": None, "answer": "not queried"}
    return {
        "index": idx, "name": v["name"], "uuid": v["uuid"], "persistence_mode": v["persistence_mode"],
        "mig": _flag(v["mig.mode.current"]),
        "sm_mhz": _mhz(v["clocks.current.sm"]), "mem_mhz": _mhz(v["clocks.current.memory"]),
        "max_sm_mhz": _mhz(v["clocks.max.sm"]), "max_mem_mhz": _mhz(v["clocks.max.memory"]),
        "default_app_sm_mhz": app["sm_mhz"], "default_app_mem_mhz": app["mem_mhz"],
        "default_app_answer": app["answer"],
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


# ---------------------------------------------------------------------------------------------- read-backs


def _prctl_pdeathsig():
    """A preexec_fn (Linux) that has the child sent SIGTERM when the thread that started it dies, so a read-back
    loop never outlives a job killed with SIGKILL; None where prctl is not available."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _reason_names(mask: int | None) -> list[str]:
    if mask is None:
        return []
    return [name for bit, name in EVENT_REASONS.items() if mask & bit] + (
        [f"0x{mask & ~sum(EVENT_REASONS):x}"] if mask & ~sum(EVENT_REASONS) else [])


class _Sample:
    __slots__ = ("at", "sm_mhz", "mem_mhz", "reasons")

    def __init__(self, at: datetime, sm_mhz: int | None, mem_mhz: int | None, reasons: int | None):
        self.at, self.sm_mhz, self.mem_mhz, self.reasons = at, sm_mhz, mem_mhz, reasons

    @classmethod
    def parse(cls, line: str) -> _Sample | None:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 4:
            return None
        try:
            at = datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f")
        except ValueError:
            return None
        try:
            reasons = int(cells[3], 16)
        except ValueError:
            reasons = None
        return cls(at, _mhz(cells[1]), _mhz(cells[2]), reasons)

    @property
    def idle(self) -> bool:
        return self.reasons is not None and bool(self.reasons & GPU_IDLE)

    def record(self) -> dict:
        return {"at": self.at.isoformat(timespec="milliseconds"), "sm_mhz": self.sm_mhz, "mem_mhz": self.mem_mhz,
                "event_reasons": None if self.reasons is None else f"0x{self.reasons:016X}",
                "event_reason_names": _reason_names(self.reasons)}


class _Sampler:
    """The read-back loop: ``nvidia-smi -i ID --query-gpu=timestamp,clocks.current.sm,clocks.current.memory,
    clocks_event_reasons.active --format=csv,noheader,nounits -lms SAMPLE_MS``, a long-lived process that
    prints one sample every SAMPLE_MS ms until stopped. It keeps an NVML client open, so with persistence mode
    off the driver stays initialized and locked clocks stay locked between the ``nvidia-smi -lgc`` call and
    the job; its samples, stamped by nvidia-smi, are the read-backs taken while the job runs."""

    def __init__(self, idx: str):
        self.idx = idx
        self.interval_ms = int(SAMPLE_MS)
        self.samples: list[_Sample] = []
        self.other: list[str] = []  # lines that are no sample (error messages)
        self.cond = threading.Condition()
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.ended_at: datetime | None = None
        self.args: list[str] = []
        self.master = -1

    @property
    def command(self) -> str:
        return _shown(self.args)

    def start(self) -> str | None:
        """Start the loop and wait for its first sample; None when it runs, else what went wrong (the loop
        is stopped). Falls back to ``clocks_throttle_reasons.active`` on drivers before R535."""
        failure = None
        for reasons in (REASONS_FIELD, LEGACY_REASONS_FIELD):
            fields = (*SAMPLE_FIELDS[:-1], reasons)
            self.args = ["-i", self.idx, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                         "-lms", str(self.interval_ms)]
            self.samples, self.other, self.ended_at = [], [], None
            log.info("clocks: %s (read-back loop, kept running until the clocks are restored)", self.command)
            # On a pseudo-terminal, not a pipe: C stdio buffers a pipe fully, which could hold the samples back
            # for minutes; a terminal gets each line as it is written.
            try:
                self.master, slave = pty.openpty()
            except OSError as exc:
                log.warning("clocks: no pseudo-terminal for the read-back loop (%s); it writes to a pipe, whose "
                            "lines may come late", exc)
                self.master, slave = os.pipe()
            try:
                self.proc = subprocess.Popen([_smi_path(), *self.args], stdout=slave, stderr=slave,
                                             stdin=subprocess.DEVNULL, preexec_fn=_prctl_pdeathsig())
            except BaseException:
                os.close(self.master)
                raise
            finally:
                os.close(slave)
            self.thread = threading.Thread(target=self._read, name="nvidia-smi read-back loop", daemon=True)
            self.thread.start()
            if self.wait(None, FIRST_SAMPLE_S) is not None:
                return None
            ended = self.ended_at is not None or self.proc.poll() is not None
            code = self.stop()
            text = " ".join(" ".join(self.other).split()) or "no output"
            failure = (f"`{self.command}` exited with status {code} before its first sample: {text}" if ended
                       else f"`{self.command}` gave no sample within {FIRST_SAMPLE_S:g} s ({text})")
            if "not a valid field" not in text:
                break
        return failure

    def _line(self, line: str) -> None:
        sample = _Sample.parse(line)
        with self.cond:
            if sample is None:
                if line.strip():
                    self.other.append(line.strip())
            else:
                self.samples.append(sample)
            self.cond.notify_all()

    def _read(self) -> None:
        pending = b""
        try:
            while True:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: the loop exited and the terminal closed
                    break
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._line(line.decode("utf-8", "replace").rstrip("\r"))
            if pending.strip():
                self._line(pending.decode("utf-8", "replace").rstrip("\r"))
        finally:
            os.close(self.master)
            with self.cond:
                self.ended_at = datetime.now()
                self.cond.notify_all()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.ended_at is None

    def wait(self, after: datetime | None, timeout: float) -> _Sample | None:
        """The first sample stamped after ``after`` (any sample for None), waiting up to ``timeout`` s; None
        when the loop ended or the time ran out."""
        def found():
            return next((s for s in self.samples if after is None or s.at > after), None)

        with self.cond:
            self.cond.wait_for(lambda: found() is not None or self.ended_at is not None, timeout)
            return found()

    def between(self, start: datetime, end: datetime) -> list[_Sample]:
        with self.cond:
            return [s for s in self.samples if start <= s.at <= end]

    def stop(self) -> int | None:
        """Stop the loop (SIGTERM, then SIGKILL after 5 s); its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.thread is not None:
            self.thread.join(5)
        return self.proc.returncode


def _one_shot_sample(idx: str) -> _Sample | None:
    """One read-back without the loop (``--query-gpu`` of the sample fields without ``-lms``)."""
    proc = _run_smi(["-i", idx, f"--query-gpu={','.join(SAMPLE_FIELDS)}", "--format=csv,noheader,nounits"])
    return _Sample.parse(proc.stdout.strip()) if proc.returncode == 0 else None


def _sample_wait_s() -> float:
    return max(2.0, 4 * SAMPLE_MS / 1000)


# ---------------------------------------------------------------------------------------------- the target


def _check_fixed(gpu: dict, sm: int, mem: int) -> str:
    supported = gpu["supported"]
    if not supported:
        return f"policy fixed: {sm} MHz SM, {mem} MHz memory (the GPU lists no supported clocks: not checked)"
    if mem not in supported:
        raise ConfigError(f"clocks.mem_mhz {mem} is not a supported memory clock of {gpu['name']} "
                          f"(GPU {gpu['index']}); supported memory clocks (MHz): {', '.join(map(str, supported))}")
    if sm not in supported[mem]:
        raise ConfigError(f"clocks.sm_mhz {sm} is not a supported SM clock of {gpu['name']} (GPU {gpu['index']}) at "
                          f"memory clock {mem} MHz; supported SM clocks (MHz): {', '.join(map(str, supported[mem]))}")
    return f"policy fixed: {sm} MHz SM, {mem} MHz memory (a supported pair)"


def _probe_tdp(idx: str, gpu: dict, sudo: bool) -> dict:
    """Lock the SM clock with ``nvidia-smi -lgc tdp,tdp``, read it back, and restore it (``-rgc``), holding
    the GPU (:func:`gpu_job_lock`) and a client (the read-back loop) meanwhile: the MHz the TDP lock gives on
    this GPU, which every later job's read-backs are checked against."""
    args, reset = ["-i", idx, "-lgc", "tdp,tdp"], ["-i", idx, "-rgc"]
    with gpu_job_lock(idx):
        sampler = _Sampler(idx)
        locked, error, sample = False, None, None
        try:
            failure = sampler.start()
            if failure:
                raise ClockError(f"could not read the GPU's clocks back while probing the TDP lock: {failure}; fix: "
                                 f"check the driver, or set clocks.policy max, fixed or none")
            locked = True  # before the call: an interrupt during it still resets
            proc = _run_smi(args, sudo)
            if proc.returncode != 0:
                locked = False
                raise _lock_failure(args, proc, sudo, gpu.get("mig"))
            sample = sampler.wait(datetime.now(), _sample_wait_s())
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                if locked:
                    proc = _run_smi(reset, sudo)
                    if proc.returncode != 0:
                        msg = (f"`{_shown(reset, sudo)}` failed after probing the TDP lock "
                               f"({_output(proc) or f'exit status {proc.returncode}'}): clocks may still be locked; "
                               f"run `sudo {NVIDIA_SMI} {' '.join(reset)}`")
                        if error is None:
                            raise ClockError(msg)
                        log.error("clocks: %s", msg)
            finally:
                sampler.stop()
    if sample is None or sample.sm_mhz is None:
        raise ClockError(f"{gpu['name']} (GPU {idx}) gave no SM clock read-back after `{_shown(args, sudo)}`; set "
                         "clocks.policy max, or fixed with sm_mhz and mem_mhz, or none")
    return {**sample.record(), "command": _shown(args, sudo)}


def choose_target(config: dict, device: str) -> dict:
    """What to lock, as written to ``clocks/target.json``: ``{policy, device, gpu, gpu_index, gpu_uuid, sm_mhz,
    mem_mhz, sm_lock, base_definition, mig, persistence_mode, sudo, reason}`` (MHz; None = not locked).

    ``config`` is the config's ``clocks`` section: ``policy`` base, max (``clocks.max.*``), fixed (``sm_mhz``
    and ``mem_mhz``, which must be a pair the GPU supports) or none; ``sudo`` (default false): the lock and
    reset commands run as ``sudo -n nvidia-smi ...``. On ``cpu`` nothing is locked.

    Policy base (``base_definition`` says which was used; every job of the run locks the same way):

    - ``"default application clocks"`` when the GPU reports them (a call of their own,
      :func:`default_app_clocks`): ``sm_mhz``/``mem_mhz`` are those clocks (memory: ``clocks.max.memory``
      when no default memory clock is reported), ``sm_lock`` ``"mhz"`` (``-lgc SM,SM``).
    - ``"TDP lock (nvidia-smi -lgc tdp,tdp)"`` where they are not available (deprecated since CUDA 13.0):
      ``sm_lock`` ``"tdp"``: the SM clock is locked with ``nvidia-smi -lgc tdp,tdp`` ("the base TDP
      frequency", NVIDIA CUPTI documentation), memory at ``clocks.max.memory``. The MHz are only known from a
      read-back, so this function locks, reads back and restores once (:func:`_probe_tdp`, under the GPU's
      job lock): ``sm_mhz`` is the SM clock read then, and later jobs check their read-backs against it
      (``tdp_probe`` holds that read-back). ``default_app_clocks`` keeps nvidia-smi's answer.

    ``mig``: whether the GPU is in MIG mode (True/False, None unknown; ``mig.mode.current``). On a MIG GPU the
    clocks are shared by all its instances and ncu cannot lock them; the whole GPU is locked with ``-lgc``
    when that works, else the GPU jobs stop naming policy none. ``persistence_mode`` as nvidia-smi reads it.

    Raises:
        ConfigError: unknown policy; policy fixed without both clocks or with clocks the GPU does not
            support (the message lists the supported values).
        ClockError: nvidia-smi missing or failing (policy none tolerates a missing nvidia-smi), no maximum
            clocks for policy max, no memory clock for policy base, or the TDP probe read nothing back.
        ClockPermissionError: the TDP probe's lock was refused (no permission, not supported, MIG).
    """
    policy = config.get("policy", "base")
    sudo = bool(config.get("sudo", False))
    if device == "cpu":
        return {"policy": "none", "device": "cpu", "reason": "CPU run: no GPU clocks to lock",
                "sm_mhz": None, "mem_mhz": None, "gpu": None, "mig": None}
    if policy not in POLICIES:
        raise ConfigError(f"clocks.policy {policy!r} is not one of {', '.join(POLICIES)}")
    sm, mem = config.get("sm_mhz"), config.get("mem_mhz")
    if policy == "fixed" and (sm is None or mem is None):
        raise ConfigError("clocks.policy fixed needs both clocks.sm_mhz and clocks.mem_mhz (MHz); set them, or use "
                          "policy base or max")
    idx = gpu_id(device)
    unlocked = {"sm_mhz": None, "mem_mhz": None, "sm_lock": None, "base_definition": None}
    if policy == "none" and shutil.which(NVIDIA_SMI) is None:
        return {"policy": "none", "device": device, "gpu": None, "gpu_index": idx, "gpu_uuid": None, "mig": None,
                "persistence_mode": None, "sudo": sudo, **unlocked,
                "reason": f"policy none: clocks not locked ({NVIDIA_SMI} not found)"}
    gpu = query_gpu(idx, default_app=policy == "base")
    target = {"policy": policy, "device": device, "gpu": gpu["name"], "gpu_index": idx, "gpu_uuid": gpu["uuid"],
              "mig": gpu["mig"], "persistence_mode": gpu["persistence_mode"], "sudo": sudo, "sm_lock": "mhz",
              "base_definition": None}
    mig_note = ("; the GPU is in MIG mode: its clocks are shared by all its instances, the whole GPU is locked"
                if gpu["mig"] else "")
    if policy == "none":
        return {**target, **unlocked, "reason": "policy none: clocks not locked"}
    if policy == "fixed":
        return {**target, "sm_mhz": int(sm), "mem_mhz": int(mem),
                "reason": _check_fixed(gpu, int(sm), int(mem)) + mig_note}
    if policy == "max":
        sm, mem = gpu["max_sm_mhz"], gpu["max_mem_mhz"]
        if sm is None or mem is None:
            raise ClockError(f"{gpu['name']} (GPU {idx}) reports no maximum clocks (clocks.max.sm/memory); "
                             "set clocks: {policy: fixed, sm_mhz: ..., mem_mhz: ...} or policy none")
        return {**target, "sm_mhz": sm, "mem_mhz": mem,
                "reason": "policy max: clocks.max.sm and clocks.max.memory" + mig_note}
    app = {"sm_mhz": gpu["default_app_sm_mhz"], "mem_mhz": gpu["default_app_mem_mhz"],
           "answer": gpu["default_app_answer"]}
    target["default_app_clocks"] = app
    mem = app["mem_mhz"] if app["sm_mhz"] is not None and app["mem_mhz"] is not None else gpu["max_mem_mhz"]
    if mem is None:
        raise ClockError(f"{gpu['name']} (GPU {idx}) reports neither a default application nor a maximum memory "
                         "clock; set clocks.policy fixed with sm_mhz and mem_mhz, or none")
    if app["sm_mhz"] is not None:
        reason = "policy base: default application clocks (clocks.default_applications.graphics/.memory)"
        if app["mem_mhz"] is None:
            reason = ("policy base: default application SM clock (clocks.default_applications.graphics); no default "
                      "application memory clock reported, so memory at clocks.max.memory")
        return {**target, "sm_mhz": app["sm_mhz"], "mem_mhz": mem, "base_definition": BASE_APP,
                "reason": reason + mig_note}
    probe = _probe_tdp(idx, gpu, sudo)
    return {**target, "sm_mhz": probe["sm_mhz"], "mem_mhz": mem, "sm_lock": "tdp", "base_definition": BASE_TDP,
            "tdp_probe": probe,
            "reason": (f"policy base: the GPU gives no default application clocks (nvidia-smi answered "
                       f"{app['answer']!r}), so the SM clock is locked to the base TDP frequency with "
                       f"`nvidia-smi -lgc tdp,tdp` (read back at {probe['sm_mhz']} MHz when the clocks were chosen) "
                       f"and memory at clocks.max.memory ({mem} MHz)" + mig_note)}


def select_clocks(config: dict, device: str, out: Path) -> None:
    """Write ``clocks/target.json`` (atomic): :func:`choose_target` of the config's ``clocks`` section.

    Raises:
        ConfigError, ClockError, ClockPermissionError: see :func:`choose_target`.
    """
    write_json(Path(out), choose_target(config, device))


# ---------------------------------------------------------------------------------------------- locking


def _lock_failure(args: list[str], proc: subprocess.CompletedProcess, sudo: bool = False,
                  mig: bool | None = None) -> ClockError:
    text = _output(proc) or "no output"
    cmd = f"`{_shown(args, sudo)}`"
    low = text.lower()
    if mig:
        return ClockPermissionError(f"{cmd} failed on a GPU in MIG mode ({text}): its clocks are shared by all MIG "
                                    "instances and could not be locked; fix: set `clocks: {policy: none}` in the "
                                    "config to profile with unlocked clocks")
    if sudo and proc.returncode != 0 and text.startswith("sudo:"):
        return ClockPermissionError(f"{cmd} was refused by sudo ({text}); fix: an administrator adds a sudoers rule "
                                    f"letting this user run exactly `{NVIDIA_SMI} -lgc/-rgc/-lmc/-rmc` without a "
                                    "password (docs/gpu.md#clocks), or run the GPU jobs as root, or set "
                                    "`clocks: {policy: none}`")
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


class _Job:
    """What :func:`read_back` needs of a running :func:`locked_clocks` block."""

    def __init__(self, idx: str, sampler: _Sampler | None):
        self.idx, self.sampler = idx, sampler
        self.read_backs: list[tuple[str, _Sample]] = []  # (when, sample) asked for by the job


_JOBS: dict[int, _Job] = {}  # id(applied) -> the running block


def read_back(applied: dict, when: str = "after the job's CUDA work") -> dict | None:
    """A read-back of the clocks taken now, while the calling process holds the GPU: for an in-process job
    (torch captures, ceilings) to call inside its :func:`locked_clocks` block once its CUDA work ran, so
    that at least one read-back of the job falls while its CUDA context exists (the loop's samples cover
    longer jobs by themselves). Waits for the read-back loop's next sample (at most a few intervals), or
    queries once when there is no loop; the sample counts in ``readback_during_job`` and is listed in its
    ``job_read_backs`` with ``when``.

    Returns the sample (``{at, sm_mhz, mem_mhz, event_reasons, event_reason_names}``, MHz), or None when
    nothing is locked (policy none, CPU) or no sample came."""
    job = _JOBS.get(id(applied))
    if job is None:
        return None
    now = datetime.now()
    sample = None
    if job.sampler is not None and job.sampler.alive():
        sample = job.sampler.wait(now, _sample_wait_s())
    if sample is None:  # no loop, or it ended meanwhile
        sample = _one_shot_sample(job.idx)
    if sample is None:
        return None
    job.read_backs.append((when, sample))
    return sample.record()


def _off(sample: _Sample, requested: dict, mem_locked: bool) -> list[str]:
    """What in ``sample`` is off the request: ``["SM 1980 MHz", ...]``, empty when it matches."""
    off = []
    if requested["sm_mhz"] is None or sample.sm_mhz is None or abs(sample.sm_mhz - requested["sm_mhz"]) > TOLERANCE_MHZ:
        off.append(f"SM {sample.sm_mhz} MHz")
    if mem_locked and (sample.mem_mhz is None or abs(sample.mem_mhz - requested["mem_mhz"]) > TOLERANCE_MHZ):
        off.append(f"memory {sample.mem_mhz} MHz")
    return off


def _span(values: list[int | None]) -> tuple[int | None, int | None]:
    known = [v for v in values if v is not None]
    return (min(known), max(known)) if known else (None, None)


def _judge(applied: dict, job: _Job, requested: dict, mem_locked: bool, start: datetime, end: datetime) -> None:
    """Set ``readback_during_job``, ``locked`` and ``lock_lost`` from the read-backs taken during the block."""
    sampler = job.sampler
    during = sampler.between(start, end) if sampler is not None else []
    during = sorted({id(s): s for s in [*during, *(s for _, s in job.read_backs)]}.values(), key=lambda s: s.at)
    ms = sampler.interval_ms if sampler is not None else None
    sm_lo, sm_hi = _span([s.sm_mhz for s in during])
    mem_lo, mem_hi = _span([s.mem_mhz for s in during])
    reasons: dict[str, int] = {}
    for s in during:
        key = "unknown" if s.reasons is None else f"0x{s.reasons:016X}"
        reasons[key] = reasons.get(key, 0) + 1
    busy_off = [s for s in during if _off(s, requested, mem_locked) and not s.idle]
    matching = [s for s in during if not _off(s, requested, mem_locked)]
    job_s = (end - start).total_seconds()
    # Judged before the loop is stopped: a loop that is not running now ended on its own. Its end is when its
    # terminal closed (a little after the exit); one that ended after the job held the GPU through it.
    gone = sampler is not None and sampler.proc is not None and (sampler.ended_at is not None
                                                                  or sampler.proc.poll() is not None)
    if gone and sampler.thread is not None:
        sampler.thread.join(2)  # its last lines and end time
    holder_lost = gone and (sampler.ended_at is None or sampler.ended_at <= end)
    ended = (f"{max(0.0, (sampler.ended_at - start).total_seconds()):.1f} s into the job ({job_s:.1f} s)"
             if holder_lost and sampler.ended_at is not None else f"before the job ended ({job_s:.1f} s)")
    record = {
        "how": (f"`{sampler.command}`: a sample every {ms} ms while the job ran" if sampler is not None
                else "no read-back loop; only the job's own read-backs"),
        "samples": len(during), "matching": len(matching), "off_while_busy": len(busy_off),
        "idle_samples": sum(s.idle for s in during),
        "sm_mhz_min": sm_lo, "sm_mhz_max": sm_hi, "mem_mhz_min": mem_lo, "mem_mhz_max": mem_hi,
        "event_reasons": reasons,
        "event_reason_names": sorted({n for s in during for n in _reason_names(s.reasons)}),
        "job_started": start.isoformat(timespec="milliseconds"), "job_ended": end.isoformat(timespec="milliseconds"),
        "job_s": round(job_s, 3),
        "first_s": round((during[0].at - start).total_seconds(), 3) if during else None,
        "last_s": round((during[-1].at - start).total_seconds(), 3) if during else None,
        "job_read_backs": [{"when": when, **s.record()} for when, s in job.read_backs],
        "checked_against": {"sm_mhz": requested["sm_mhz"], "mem_mhz": requested["mem_mhz"] if mem_locked else None,
                            "tolerance_mhz": TOLERANCE_MHZ},
        "holder_ended_during_job": holder_lost,
    }
    applied["readback_during_job"] = record
    wanted = f"SM {requested['sm_mhz']} MHz" + (f", memory {requested['mem_mhz']} MHz" if mem_locked else "")
    lost = None
    if busy_off:
        names = sorted({n for s in busy_off for n in _reason_names(s.reasons)})
        b_sm, b_sm_hi = _span([s.sm_mhz for s in busy_off])
        b_mem, b_mem_hi = _span([s.mem_mhz for s in busy_off])
        lost = (f"{len(busy_off)} of {len(during)} read-backs during the job were off the lock while the GPU was "
                f"busy (SM {b_sm}-{b_sm_hi} MHz, memory {b_mem}-{b_mem_hi} MHz; locked {wanted}, tolerance "
                f"{TOLERANCE_MHZ} MHz; clock event reasons: {', '.join(names) or 'none'})")
    elif holder_lost and applied.get("persistence_mode") != "Enabled":
        lost = (f"the nvidia-smi client holding the GPU exited {ended} with persistence mode "
                f"{applied.get('persistence_mode')}: the driver resets locked clocks when its last client exits; "
                f"fix: `{PERSISTENCE_FIX}`")
    elif not matching:
        lost = (f"no read-back during the job matched the lock ({len(during)} samples in {job_s:.1f} s"
                + (f", one every {ms} ms" if ms else "")
                + (", all with the GPU idle" if during and all(s.idle for s in during) else "")
                + f"; locked {wanted}): the lock is not verified")
    elif holder_lost:
        applied["warnings"].append(f"the read-back loop ended {ended}: later read-backs are missing")
    applied["locked"] = lost is None
    applied["lock_lost"] = lost
    if lost:
        log.warning("clocks: not locked: %s", lost)


@contextlib.contextmanager
def locked_clocks(target: dict, out_applied: Path, device: str | None = None):
    """Lock the GPU's clocks around a GPU job, holding the GPU exclusively (:func:`gpu_job_lock`) for
    the whole job; see :func:`_locked_clocks` for the locking itself, what is written and raised."""
    if target.get("device") == "cpu":
        with _locked_clocks(target, out_applied, device) as applied:
            yield applied
        return
    idx = gpu_id(device or target.get("device") or "cuda")
    with gpu_job_lock(idx):
        with _locked_clocks(target, out_applied, device, idx) as applied:
            yield applied


@contextlib.contextmanager
def _locked_clocks(target: dict, out_applied: Path, device: str | None = None, idx: str | None = None):
    """Lock the clocks of ``target`` (a ``target.json`` dict) for the duration of the block and verify them
    with read-backs taken while the block (the job) runs.

    Yields the applied dict, which the caller may extend (e.g. with ``measured_s``); on exit it is
    written atomically to ``out_applied`` (``clocks_applied.json``), also after an error. Fields a reader
    wants first (MHz throughout):

    - ``locked``: the verdict. True only when read-backs taken during the job matched the lock (within
      :data:`TOLERANCE_MHZ`); False otherwise, with ``lock_lost`` saying why; None while the block runs
      (decided when it ends). ``lock_set``: the lock commands succeeded (what ncu's ``--clock-control none``
      depends on, :func:`ncu_clock_args`).
    - ``persistence_mode``: ``Enabled``/``Disabled``/``[N/A]`` (nvidia-smi). Locked clocks reset when the
      driver de-initializes the GPU, which it does when its last client exits unless persistence mode is
      on; so the read-back loop (:class:`_Sampler`, a long-lived ``nvidia-smi ... -lms SAMPLE_MS``) is
      started before locking and stopped after the restore: it holds a client across lock and job. When
      it cannot run and persistence mode is not Enabled, the job is refused (fix ``sudo nvidia-smi -pm 1``).
    - ``readback_during_job``: the loop's samples stamped while the block ran, plus those the job asked for
      (:func:`read_back`): ``samples``, ``matching``, ``off_while_busy``, ``idle_samples``, min/max SM and
      memory clock, ``event_reasons`` (active clock event reason masks and their counts), ``first_s``/
      ``last_s`` (seconds into the job), ``job_s``, ``job_read_backs``. A sample off the lock counts
      against it unless nvidia-smi flags the GPU idle (``gpu_idle``: the clocks drop while nothing runs).
      ``locked`` is False when a sample was off while busy, when the loop ended during the job with
      persistence mode off, or when no sample matched (e.g. a job shorter than the interval that called
      no :func:`read_back`).
    - ``applied``: the read-back after locking, before the job started (``{at, sm_mhz, mem_mhz,
      event_reasons, event_reason_names}``); ``applied_after``: one after the block completed, before the
      restore. ``requested``: ``{sm_mhz, mem_mhz, sm_lock}`` (``sm_lock`` ``"tdp"``: locked with
      ``-lgc tdp,tdp``, ``sm_mhz`` is the target's probed read-back). ``mig``, ``base_definition`` from the
      target; ``restored``, ``outcome``, ``warnings``, ``reason``.

    Steps: policy ``none`` (or a CPU target): nothing is run; ``{locked: False, reason: "clocks not locked
    (policy none)"}``. Otherwise, on the GPU ``gpu_id(device)`` (default: the target's device): one
    ``--query-gpu`` (model, persistence mode, MIG mode), the read-back loop, ``nvidia-smi -i ID -lgc SM,SM``
    (``tdp,tdp`` for ``sm_lock`` tdp) and ``-lmc MEM,MEM`` (as ``sudo -n nvidia-smi ...`` with the target's
    ``sudo``), the read-back after locking, the block, then **always** (normal exit, exception,
    KeyboardInterrupt, SIGTERM) ``-rgc`` and ``-rmc`` for the clocks that were locked, then the loop is
    stopped. ``restored`` says whether both resets succeeded; a failed restore is logged and recorded
    (``restored: false``, a warning with the manual command), not raised. A memory lock the GPU refuses as
    "not supported" (HBM parts run one memory clock) keeps the SM lock with a warning. For the block, SIGTERM
    raises :class:`ClocksInterrupted` (exit status 143) in the main thread; the previous handler is put back.

    Raises:
        ClockPermissionError: nvidia-smi (or sudo) refused the lock (no permission / not supported / MIG);
            the message gives the fixes. Clocks already locked are restored first.
        ClockError: nvidia-smi missing or failing, the GPU is not the model the target was chosen on, or no
            client can be held on a GPU whose persistence mode is off.
    """
    out_applied = Path(out_applied)
    policy = target.get("policy", "none")
    base = {"policy": policy, "device": target.get("device"), "gpu": target.get("gpu"),
            "gpu_index": target.get("gpu_index"), "gpu_uuid": target.get("gpu_uuid"), "mig": target.get("mig"),
            "persistence_mode": target.get("persistence_mode"), "base_definition": target.get("base_definition"),
            "requested": {"sm_mhz": target.get("sm_mhz"), "mem_mhz": target.get("mem_mhz"),
                          "sm_lock": target.get("sm_lock")},
            "lock_set": False, "lock_lost": None, "readback_during_job": None}
    if policy == "none" or target.get("device") == "cpu":
        applied = {**base, "locked": False, "reason": "clocks not locked (policy none)", "warnings": []}
        try:
            yield applied
        finally:
            write_json(out_applied, applied)
        return

    idx = idx or gpu_id(device or target.get("device") or "cuda")
    sudo = bool(target.get("sudo"))
    tdp = target.get("sm_lock") == "tdp"
    requested = {"sm_mhz": None if target.get("sm_mhz") is None else int(target["sm_mhz"]),
                 "mem_mhz": int(target["mem_mhz"]), "sm_lock": "tdp" if tdp else "mhz"}
    if requested["sm_mhz"] is None and not tdp:
        raise ClockError(f"clocks/target.json for policy {policy} has no sm_mhz; rerun select_clocks")
    warnings: list[str] = []
    applied = {**base, "gpu_index": idx, "locked": False, "requested": requested, "applied": None,
               "applied_after": None, "warnings": warnings, "restored": None, "outcome": None,
               "reason": f"{target.get('reason', policy)}"}
    gpu = query_gpu(idx, supported=False, default_app=False)
    if target.get("gpu") and gpu["name"] != target["gpu"]:
        raise ClockError(f"clocks/target.json was chosen for {target['gpu']}, but this job runs on {gpu['name']} "
                         f"(GPU {idx}); rerun select_clocks on the GPU model the captures run on")
    applied.update(gpu=gpu["name"], gpu_uuid=gpu["uuid"], persistence_mode=gpu["persistence_mode"], mig=gpu["mig"])

    locked: list[str] = []  # reset flags, in lock order
    restoring = False
    main = threading.current_thread() is threading.main_thread()
    sampler: _Sampler | None = _Sampler(idx)
    job = _Job(idx, None)
    start = end = None

    def on_sigterm(signum, frame):
        if restoring:  # a second SIGTERM while restoring: finish the restore first
            log.warning("clocks: SIGTERM while restoring clocks, ignored until the restore is done")
            return
        raise ClocksInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, on_sigterm) if main else None
    try:
        failure = sampler.start()
        if failure:
            sampler = None
            if gpu["persistence_mode"] != "Enabled":
                raise ClockError(f"could not hold a client on GPU {idx} while its clocks are locked ({failure}), and "
                                 f"its persistence mode is {gpu['persistence_mode']}: the driver would reset the lock "
                                 f"as soon as nvidia-smi exits; fix: `{PERSISTENCE_FIX}` (persistence mode), or set "
                                 "`clocks: {policy: none}`")
            warnings.append(f"no read-back loop ({failure}): only the job's own read-backs can verify the lock")
            log.warning("clocks: %s", warnings[-1])
        job.sampler = sampler
        sm_arg = "tdp,tdp" if tdp else f"{requested['sm_mhz']},{requested['sm_mhz']}"
        mem_arg = f"{requested['mem_mhz']},{requested['mem_mhz']}"
        for flag, reset, value in (("-lgc", "-rgc", sm_arg), ("-lmc", "-rmc", mem_arg)):
            args = ["-i", idx, flag, value]
            locked.append(reset)  # before the call: a SIGTERM during it still restores
            proc = _run_smi(args, sudo)
            if proc.returncode != 0:
                locked.pop()  # refused: nothing to reset
                failure = _lock_failure(args, proc, sudo, gpu["mig"])
                if flag == "-lmc" and _not_supported(proc) and not gpu["mig"]:
                    # GPUs whose memory runs at one clock (HBM parts) may refuse -lmc: the SM clock
                    # lock still holds, and the read-backs show the memory clock.
                    warnings.append(f"memory clock not locked ({failure}); only the SM clock is locked")
                    log.warning("clocks: %s", warnings[-1])
                    continue
                raise failure
        applied["lock_set"] = True
        after_lock = datetime.now()
        first = sampler.wait(after_lock, _sample_wait_s()) if sampler is not None else _one_shot_sample(idx)
        applied["applied"] = first.record() if first is not None else None
        if requested["sm_mhz"] is None and first is not None:  # a TDP lock without a probed MHz: the first read-back
            requested["sm_mhz"] = first.sm_mhz
            warnings.append(f"the target has no SM clock for the TDP lock: read-backs are checked against the one "
                            f"after locking ({first.sm_mhz} MHz)")
        if first is None:
            warnings.append("no read-back after locking")
        else:
            off = _off(first, requested, "-rmc" in locked)
            if off:
                warnings.append(f"read back after locking, before the job: {', '.join(off)} (locked SM "
                                f"{requested['sm_mhz']} MHz, memory {requested['mem_mhz']} MHz, tolerance "
                                f"{TOLERANCE_MHZ} MHz{', GPU idle' if first.idle else ''})")
        applied["locked"] = None  # decided from the read-backs during the job
        _JOBS[id(applied)] = job
        start = datetime.now()
        yield applied
        end = datetime.now()
        if sampler is not None and sampler.alive():
            after = sampler.wait(end, _sample_wait_s())
            applied["applied_after"] = after.record() if after is not None else None
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
        _JOBS.pop(id(applied), None)
        try:
            if start is not None:
                _judge(applied, job, requested, "-rmc" in locked, start, end or datetime.now())
            elif applied["locked"] is None:
                applied["locked"] = False
            ok = True
            for reset in locked:
                args = ["-i", idx, reset]
                try:
                    proc = _run_smi(args, sudo)
                    failed = None if proc.returncode == 0 else (_output(proc) or f"exit status {proc.returncode}")
                except (ClockError, OSError) as exc:
                    failed = str(exc)
                if failed:
                    ok = False
                    warnings.append(f"`{_shown(args, sudo)}` failed ({failed}): clocks "
                                    f"may still be locked; run `sudo {NVIDIA_SMI} {' '.join(args)}`")
                    log.error("clocks: %s", warnings[-1])
            applied["restored"] = ok if locked else None
            if sampler is not None:
                sampler.stop()  # after the restore: the client is held until the clocks are back
            write_json(out_applied, applied)
        finally:
            if main:  # None: the previous handler was not installed from Python; the default is the safe guess
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def ncu_clock_args(applied: dict) -> list[str]:
    """ncu options for the clocks: ``["--clock-control", "none"]`` when :func:`locked_clocks` locked them
    (``lock_set``, or ``locked`` in a finished record), so ncu keeps our lock instead of locking its own, and on
    a GPU in MIG mode (``mig``), where ncu cannot lock clocks (``==ERROR== Cannot lock GPU clock frequencies on
    MIG!``); else ``[]``, and ncu locks clocks itself with its default ``--clock-control`` (``base`` in older ncu
    builds, ``boost`` in 2026.1; Nsight Compute CLI guide,
    https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html, and docs/formats.md#ncu-filters-and-replay).
    """
    return ["--clock-control", "none"] if applied.get("lock_set") or applied.get("locked") or applied.get("mig") else []
