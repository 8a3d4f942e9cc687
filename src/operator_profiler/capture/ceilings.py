"""Measured machine ceilings: the GEMM peak per dtype and a STREAM-like memory bandwidth of the profiled device,
each the best of several timed runs, written to ``ceilings.json`` (the roofline's ceilings).

Runs where the captures run (the ``measure_ceilings`` rule, ``opprof ceilings``); torch is imported inside the
functions, so the workflow can import this module when the DAG is built. The file's contract (keys, units in the
key names: FLOP/s, bytes/s) is DESIGN.md's "Machine ceilings"; :func:`validate_ceilings` checks it.

- GEMM: square ``torch.mm(a, b, out=c)`` of size n, 2 n^3 FLOP per call; ``float32`` and ``bfloat16``, on CUDA
  also ``tf32`` (float32 inputs with TF32 on: :class:`MatmulPrecision`; ``float32`` runs with it off)
  and ``float16``.
- Memory: float32 arrays, ``copy`` ``a.copy_(b)`` (2 x 4 bytes per element) and ``triad``
  ``torch.add(b, c, alpha=s, out=a)`` (3 x 4 bytes per element): STREAM's byte counts (McCalpin, STREAM
  benchmark), which leave out the write-allocate read of ``a`` a CPU cache may add.
- Timing: ``warmup`` calls (the last one timed, to size the runs), then ``runs`` timed runs of ``calls_per_run``
  back-to-back calls, each run lasting at least ``min_run_s``; CPU ``time.perf_counter``, CUDA events around the
  run (``torch.cuda.Event.elapsed_time``). A measurement's figure is its best run's rate; the median is recorded
  beside it.
- Trials: the whole set (every GEMM, then both STREAM kernels) is measured ``trials`` times one after the other,
  so a burst of load from another process spoils one trial, not every figure; each ceiling is its best trial's
  figure. Every trial records its figures and the other processes' CPU load during it (from /proc/stat, when the
  trial lasts at least :data:`MIN_LOAD_WINDOW_S`); a CPU figure whose best trial ran under load is a warning.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from ..errors import DeviceUnavailable, InputError
from ..files import read_json_file, write_json
from . import machine

log = logging.getLogger(__name__)

SCHEMA = 1
DEVICES = ("cpu", "cuda")
#: The GEMM dtypes measured per device (``tf32``: float32 tensors computed with TF32 tensor cores).
GEMM_DTYPES = {"cpu": ("float32", "bfloat16"), "cuda": ("float32", "tf32", "float16", "bfloat16")}
STREAM_KERNELS = ("copy", "triad")
STREAM_ARRAYS = {"copy": 2, "triad": 3}  # arrays read or written per element (STREAM's byte counts)
STREAM_ELEMENT_BYTES = 4  # float32
TRIAD_SCALAR = 3.0
MIB = 1024**2
#: Automatic GEMM size per device: large enough to be compute-bound (CPU: ~0.2 s per float32 call on one core).
DEFAULT_GEMM_N = {"cpu": 2048, "cuda": 8192}
#: Below this n a GEMM may not reach the compute ceiling (the JSON says so in ``warnings``).
SMALL_GEMM_N = 1024
#: CPU, automatic size: a dtype whose GEMM of the default size would take longer than this per call (s; a slow
#: path such as bfloat16 on a CPU without native bfloat16: about 0.2 GFLOP/s on an AVX2-only EPYC, so 90 s per
#: call at n=2048) is measured at the size that takes about :data:`SLOW_GEMM_CALL_S` per call instead, probed at
#: :data:`PROBE_GEMM_N`; at such rates a GEMM of a few hundred is compute-bound already.
MAX_GEMM_CALL_S = 2.0
SLOW_GEMM_CALL_S = 0.25
PROBE_GEMM_N = 256
#: Each STREAM array at least this many times the last-level cache (CPU: L3, all instances; CUDA: L2).
CACHE_MULTIPLE = {"cpu": 4, "cuda": 8}
#: The automatic STREAM array size's floor, and the size used when the cache size is unknown.
MIN_STREAM_BYTES = {"cpu": 64 * MIB, "cuda": 256 * MIB}
UNKNOWN_CACHE_STREAM_BYTES = 256 * MIB
#: The settings (config ``ceilings`` section, ``opprof ceilings`` options): None = automatic.
DEFAULT_SETTINGS = {"gemm_n": None, "stream_mib": None, "runs": 5, "warmup": 2, "min_run_s": 0.05, "trials": 3}
#: Other processes' CPUs busy beyond the spare ones (usable CPUs less the measurement's threads) that make a CPU
#: trial "under load" (a warning when a kept figure came from such a trial).
LOAD_MARGIN = 0.5
#: The shortest measurement whose other-process CPU load is estimated (/proc/stat counts in 10 ms ticks).
MIN_LOAD_WINDOW_S = 0.5
#: FP32 add/multiply/multiply-add results per clock cycle per SM, by compute capability: the CUDA C++ Programming
#: Guide's throughput table of native arithmetic instructions. Capabilities not listed: no nominal FP32 peak.
FP32_RESULTS_PER_CLOCK_PER_SM = {(6, 0): 64, (6, 1): 128, (6, 2): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64,
                                 (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128}
#: Peaks a device's properties cannot give (tensor-core rates per SM are not a device property).
NOT_DERIVABLE = {
    "tf32": "tensor-core TF32 rate per SM is not a device property (only in NVIDIA's architecture whitepapers)",
    "float16": "tensor-core FP16 rate per SM is not a device property (only in NVIDIA's architecture whitepapers)",
    "bfloat16": "tensor-core BF16 rate per SM is not a device property (only in NVIDIA's architecture whitepapers)",
}
CPU_NOMINAL_NOTE = ("not derived on CPU: the FMA units per core and the clock under vector load are not in "
                    "/proc/cpuinfo (and a VM's vCPUs may be hyperthreads of fewer cores); DRAM bandwidth is not "
                    "readable from inside the machine")


# ---------------------------------------------------------------------------------------------- settings


def resolve_settings(device: str, requested: dict | None, cache_bytes: int | None) -> tuple[dict, list[str]]:
    """The settings a measurement uses: ``requested`` (None values: automatic) over :data:`DEFAULT_SETTINGS`, with
    ``gemm_n`` and ``stream_bytes`` resolved (automatic: :data:`DEFAULT_GEMM_N`; each STREAM array
    :data:`CACHE_MULTIPLE` x ``cache_bytes``, at least :data:`MIN_STREAM_BYTES`). Returns ``(settings,
    warnings)``: a warning for a GEMM below :data:`SMALL_GEMM_N`, arrays not exceeding the cache that many times,
    or an unknown cache size.

    Raises:
        ValueError: an unknown setting, or a value out of range (the config schema prevents both).
    """
    requested = dict(requested or {})
    unknown = sorted(set(requested) - set(DEFAULT_SETTINGS))
    if unknown:
        raise ValueError(f"unknown ceilings setting(s) {', '.join(unknown)}; known: {', '.join(DEFAULT_SETTINGS)}")
    settings = {**DEFAULT_SETTINGS, **{k: v for k, v in requested.items() if v is not None}}
    for key, low in (("runs", 1), ("warmup", 1), ("trials", 1)):
        if int(settings[key]) < low:
            raise ValueError(f"ceilings {key} must be at least {low}, got {settings[key]}")
    if float(settings["min_run_s"]) < 0:
        raise ValueError(f"ceilings min_run_s must not be negative, got {settings['min_run_s']}")
    warnings = []
    n = int(settings["gemm_n"] or DEFAULT_GEMM_N[device])
    if n < 1:
        raise ValueError(f"ceilings gemm_n must be positive, got {n}")
    if n < SMALL_GEMM_N:
        warnings.append(f"GEMM size n={n} is below {SMALL_GEMM_N}: the GEMM figures may not be compute-bound "
                        "(lower than the machine's ceiling)")
    multiple = CACHE_MULTIPLE[device]
    if settings["stream_mib"] is not None:
        if float(settings["stream_mib"]) <= 0:
            raise ValueError(f"ceilings stream_mib must be positive, got {settings['stream_mib']}")
        stream_bytes = int(float(settings["stream_mib"]) * MIB)
    elif cache_bytes:
        stream_bytes = max(multiple * cache_bytes, MIN_STREAM_BYTES[device])
    else:
        stream_bytes = UNKNOWN_CACHE_STREAM_BYTES
    stream_bytes = max(stream_bytes // STREAM_ELEMENT_BYTES, 1) * STREAM_ELEMENT_BYTES
    cache_name = "L2 cache" if device == "cuda" else "last-level cache"
    if not cache_bytes:
        warnings.append(f"the {cache_name} size is unknown: the STREAM arrays ({stream_bytes / MIB:.0f} MiB each) "
                        "may not exceed it")
    elif stream_bytes < multiple * cache_bytes:
        warnings.append(f"STREAM arrays of {stream_bytes / MIB:.3g} MiB are below {multiple} x the {cache_name} "
                        f"({cache_bytes / MIB:.3g} MiB): the bandwidth figures may be the cache's, not memory's")
    resolved = {"gemm_n": n, "gemm_n_auto": settings["gemm_n"] is None, "stream_bytes": stream_bytes,
                "runs": int(settings["runs"]),
                "warmup": int(settings["warmup"]), "min_run_s": float(settings["min_run_s"]),
                "trials": int(settings["trials"]), "cache_multiple": multiple, "requested": requested}
    return resolved, warnings


# ---------------------------------------------------------------------------------------------- timing


def _synchronize(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time_calls(torch, device: str, fn, calls: int) -> float:
    """Seconds for ``calls`` back-to-back calls of ``fn`` (CUDA: events on the current stream, then a sync)."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - begin


def timed_runs(torch, device: str, fn, runs: int, warmup: int, min_run_s: float) -> dict:
    """Warm up with ``warmup`` calls (the last one timed: ``calibration_s``), then ``runs`` timed runs of
    ``calls_per_run`` = ceil(``min_run_s`` / ``calibration_s``) calls (at least 1).

    Returns ``{"warmup_calls", "calibration_s", "calls_per_run", "runs", "times_s", "best_s", "median_s"}``
    (seconds per run, i.e. for ``calls_per_run`` calls)."""
    for _ in range(warmup - 1):
        fn()
    _synchronize(torch, device)
    calibration = _time_calls(torch, device, fn, 1)
    calls = max(1, math.ceil(min_run_s / calibration)) if calibration > 0 else 1
    times = [_time_calls(torch, device, fn, calls) for _ in range(runs)]
    return {"warmup_calls": warmup, "calibration_s": calibration, "calls_per_run": calls, "runs": runs,
            "times_s": times, "best_s": min(times), "median_s": statistics.median(times)}


def _rates(work_per_call: int, timing: dict, unit: str) -> dict:
    work = work_per_call * timing["calls_per_run"]
    best, median = timing["best_s"], timing["median_s"]
    return {f"{unit}_per_s_best": work / best if best > 0 else None,
            f"{unit}_per_s_median": work / median if median > 0 else None}


# ---------------------------------------------------------------------------------------------- benchmarks


class MatmulPrecision:
    """On CUDA, TF32 for float32 matmuls on (``tf32``) or off for the block with
    ``torch.backends.cuda.matmul.allow_tf32``, put back after. The older flag on purpose: torch 2.9+ also has
    ``fp32_precision``, but once it is set, ``torch.get_float32_matmul_precision()`` and ``allow_tf32`` raise for
    the rest of the process ("mix of the legacy and new APIs"), which Inductor and user code still call. On CPU
    nothing is changed (float32 matmuls follow ``torch.get_float32_matmul_precision()``, recorded).

    ``__enter__`` returns what the measurement records: ``tf32`` (bool on CUDA, None on CPU), ``cuda_matmul_flag``
    (``allow_tf32=True`` ...; None on CPU) and ``float32_matmul_precision``."""

    def __init__(self, torch, device: str, tf32: bool):
        self.torch, self.device, self.tf32 = torch, device, tf32
        self.saved: bool | None = None

    def __enter__(self) -> dict:
        matmul = self.torch.backends.cuda.matmul
        flag = None
        if self.device == "cuda":
            self.saved = matmul.allow_tf32
            matmul.allow_tf32 = self.tf32
            flag = f"allow_tf32={matmul.allow_tf32}"
        return {"tf32": self.tf32 if self.device == "cuda" else None, "cuda_matmul_flag": flag,
                "float32_matmul_precision": self.torch.get_float32_matmul_precision()}

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            self.torch.backends.cuda.matmul.allow_tf32 = self.saved
            self.saved = None


def measure_gemm(torch, device: str, dtype_name: str, n: int, runs: int, warmup: int, min_run_s: float) -> dict:
    """One GEMM ceiling: square ``torch.mm(a, b, out=c)``, n x n x n, of random normal inputs.

    Returns the measurement record: ``name`` (``gemm_<dtype>``), ``kind`` ``gemm``, ``dtype``, ``tensor_dtype``,
    ``op``, ``m``/``n``/``k``, ``flop_per_call`` (2 n^3), the :func:`timed_runs` fields, the
    :class:`MatmulPrecision` fields, and ``flops_per_s_best``/``flops_per_s_median`` (FLOP/s)."""
    dtype = torch.float32 if dtype_name in ("float32", "tf32") else getattr(torch, dtype_name)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=generator)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=generator)
    c = torch.empty(n, n, dtype=dtype, device=device)
    with MatmulPrecision(torch, device, dtype_name == "tf32") as precision:
        timing = timed_runs(torch, device, lambda: torch.mm(a, b, out=c), runs, warmup, min_run_s)
    flop = 2 * n**3
    return {"name": f"gemm_{dtype_name}", "kind": "gemm", "dtype": dtype_name, "tensor_dtype": str(dtype),
            "op": "torch.mm(a, b, out=c)", "m": n, "n": n, "k": n, "flop_per_call": flop, **precision,
            **timing, **_rates(flop, timing, "flops")}


def auto_gemm_n(flops_per_s: float, n_max: int) -> int:
    """The automatic GEMM size for a GEMM that runs at ``flops_per_s`` (FLOP/s): ``n_max`` unless a call of that
    size would take over :data:`MAX_GEMM_CALL_S`, else the size a call of :data:`SLOW_GEMM_CALL_S` has (2 n^3 FLOP),
    rounded down to a multiple of 32, at least :data:`PROBE_GEMM_N`."""
    if flops_per_s <= 0 or 2 * n_max**3 / flops_per_s <= MAX_GEMM_CALL_S:
        return n_max
    n = int((SLOW_GEMM_CALL_S * flops_per_s / 2) ** (1 / 3)) // 32 * 32
    return max(PROBE_GEMM_N, min(n, n_max))


def probe_gemm_rate(torch, device: str, dtype_name: str) -> float:
    """FLOP/s of one n = :data:`PROBE_GEMM_N` GEMM of ``dtype_name`` after one untimed call (a lower bound of the
    dtype's rate: a small GEMM is less efficient)."""
    record = measure_gemm(torch, device, dtype_name, PROBE_GEMM_N, runs=1, warmup=2, min_run_s=0)
    return float(record["flops_per_s_best"])


def gemm_sizes(torch, device: str, resolved: dict) -> tuple[dict[str, int], list[str]]:
    """The GEMM size of each dtype (``{dtype: n}``) and warnings naming the dtypes measured smaller than
    ``gemm_n`` because their GEMM is slow (:func:`auto_gemm_n`; CPU, automatic size only)."""
    n_max = resolved["gemm_n"]
    sizes = {dtype: n_max for dtype in GEMM_DTYPES[device]}
    warnings = []
    if device != "cpu" or not resolved.get("gemm_n_auto"):
        return sizes, warnings
    for dtype in sizes:
        rate = probe_gemm_rate(torch, device, dtype)
        sizes[dtype] = auto_gemm_n(rate, n_max)
        if sizes[dtype] < n_max:
            warnings.append(f"the {dtype} GEMM is slow on this CPU ({rate / 1e9:.3g} GFLOP/s at n={PROBE_GEMM_N}: one "
                            f"n={n_max} call would take about {2 * n_max**3 / rate:.0f} s): measured at n={sizes[dtype]}")
    return sizes, warnings


def measure_stream(torch, device: str, stream_bytes: int, cache_bytes: int | None, cache_multiple: int, runs: int,
                   warmup: int, min_run_s: float) -> list[dict]:
    """The ``copy`` and ``triad`` bandwidths on float32 arrays of ``stream_bytes`` each (filled first, so every
    page is mapped before the clock runs).

    Returns one measurement record per kernel: ``name`` (``stream_<kernel>``), ``kind`` ``stream``, ``kernel``,
    ``op``, ``dtype``, ``elements``, ``array_bytes``, ``arrays``, ``bytes_per_call`` (arrays x array_bytes),
    ``cache_bytes``, ``exceeds_cache`` (array_bytes >= cache_multiple x cache_bytes; None when the cache size is
    unknown), the :func:`timed_runs` fields and ``bytes_per_s_best``/``bytes_per_s_median`` (bytes/s)."""
    elements = stream_bytes // STREAM_ELEMENT_BYTES
    a = torch.zeros(elements, dtype=torch.float32, device=device)
    b = torch.ones(elements, dtype=torch.float32, device=device)
    c = torch.full((elements,), 2.0, dtype=torch.float32, device=device)
    kernels = {"copy": ("a.copy_(b)", lambda: a.copy_(b)),
               "triad": (f"torch.add(b, c, alpha={TRIAD_SCALAR}, out=a)",
                         lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a))}
    records = []
    array_bytes = elements * STREAM_ELEMENT_BYTES
    for kernel in STREAM_KERNELS:
        op, fn = kernels[kernel]
        timing = timed_runs(torch, device, fn, runs, warmup, min_run_s)
        moved = STREAM_ARRAYS[kernel] * array_bytes
        records.append({"name": f"stream_{kernel}", "kind": "stream", "kernel": kernel, "op": op,
                        "dtype": "float32", "elements": elements, "array_bytes": array_bytes,
                        "arrays": STREAM_ARRAYS[kernel], "bytes_per_call": moved, "cache_bytes": cache_bytes,
                        "cache_multiple_required": cache_multiple,
                        "exceeds_cache": None if not cache_bytes else array_bytes >= cache_multiple * cache_bytes,
                        **timing, **_rates(moved, timing, "bytes")})
    return records


# ---------------------------------------------------------------------------------------------- the machine


def _gpu_properties(torch) -> dict:
    """The current CUDA device's properties (torch.cuda.get_device_properties; cudaDeviceProp: clocks in kHz,
    bus width in bits); a property this torch does not expose, or reports as 0, is None."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())

    def positive(name):
        value = getattr(props, name, None)
        return value if isinstance(value, int) and value > 0 else None

    return {"name": props.name, "compute_capability": [props.major, props.minor],
            "multi_processor_count": props.multi_processor_count, "total_memory_bytes": props.total_memory,
            "l2_cache_bytes": positive("L2_cache_size"), "clock_rate_khz": positive("clock_rate"),
            "memory_clock_rate_khz": positive("memory_clock_rate"),
            "memory_bus_width_bits": positive("memory_bus_width"), "uuid": str(getattr(props, "uuid", "")) or None}


def _nvidia_smi(device: str) -> dict | None:
    """Name, UUID and clocks (MHz) of the GPU from nvidia-smi (:func:`operator_profiler.capture.clocks.query_gpu`);
    None when nvidia-smi is missing or fails."""
    from ..errors import ClockError
    from .clocks import gpu_id, query_gpu

    try:
        gpu = query_gpu(gpu_id(device), supported=False)
    except (ClockError, OSError) as exc:
        log.warning("ceilings: nvidia-smi gave no GPU clocks (%s)", exc)
        return None
    gpu.pop("supported", None)
    return gpu


def nominal_cuda(gpu: dict, smi: dict | None) -> dict:
    """The GPU's nominal peaks derived from its properties (``gpu``: :func:`_gpu_properties`; ``smi``: nvidia-smi
    clocks or None), each with how it was derived; a peak whose inputs are missing is None with the reason.

    - ``fp32_flops_per_s`` = SMs x FP32 results per clock per SM (:data:`FP32_RESULTS_PER_CLOCK_PER_SM`, by compute
      capability) x 2 (an FMA is 2 FLOP) x SM clock (``clock_rate``, cudaDeviceProp.clockRate, the peak clock;
      else nvidia-smi ``clocks.max.sm``). CUDA cores, no tensor cores.
    - ``memory_bytes_per_s`` = 2 (double data rate) x memory clock (``memory_clock_rate``, else nvidia-smi
      ``clocks.max.memory``) x bus width / 8 (``memory_bus_width``, bits; no other source).
    - ``tf32``, ``float16``, ``bfloat16``: not derivable (:data:`NOT_DERIVABLE`).
    """
    not_derived = dict(NOT_DERIVABLE)
    how = {}
    sm_mhz, sm_source = None, None
    if gpu.get("clock_rate_khz"):
        sm_mhz, sm_source = gpu["clock_rate_khz"] / 1e3, "torch clock_rate (cudaDeviceProp.clockRate, kHz)"
    elif smi and smi.get("max_sm_mhz"):
        sm_mhz, sm_source = float(smi["max_sm_mhz"]), "nvidia-smi clocks.max.sm"
    mem_mhz, mem_source = None, None
    if gpu.get("memory_clock_rate_khz"):
        mem_mhz = gpu["memory_clock_rate_khz"] / 1e3
        mem_source = "torch memory_clock_rate (cudaDeviceProp.memoryClockRate, kHz)"
    elif smi and smi.get("max_mem_mhz"):
        mem_mhz, mem_source = float(smi["max_mem_mhz"]), "nvidia-smi clocks.max.memory"
    cc = tuple(gpu.get("compute_capability") or ())
    lanes = FP32_RESULTS_PER_CLOCK_PER_SM.get(cc)
    sms = gpu.get("multi_processor_count")
    fp32 = None
    if lanes and sms and sm_mhz:
        fp32 = sms * lanes * 2 * sm_mhz * 1e6
        how["fp32_flops_per_s"] = (f"{sms} SMs x {lanes} FP32 results/clock/SM (CUDA C++ Programming Guide, compute "
                                   f"capability {cc[0]}.{cc[1]}) x 2 FLOP per FMA x {sm_mhz:g} MHz ({sm_source})")
    else:
        rate = f"an FP32 rate for compute capability {'.'.join(map(str, cc)) or '?'} in this version's table"
        missing = [what for what, have in ((rate, lanes), ("the SM count", sms), ("an SM clock", sm_mhz)) if not have]
        not_derived["fp32_flops_per_s"] = "no " + ", no ".join(missing)
    bus = gpu.get("memory_bus_width_bits")
    bandwidth = None
    if mem_mhz and bus:
        bandwidth = 2 * mem_mhz * 1e6 * bus / 8
        how["memory_bytes_per_s"] = (f"2 (double data rate) x {mem_mhz:g} MHz ({mem_source}) x {bus} bits / 8 "
                                     "(torch memory_bus_width, cudaDeviceProp.memoryBusWidth)")
    else:
        missing = [what for what, have in (("memory clock", mem_mhz),
                                           ("memory bus width (this torch exposes no memory_bus_width)", bus))
                   if not have]
        not_derived["memory_bytes_per_s"] = "no " + ", no ".join(missing)
    return {"fp32_flops_per_s": fp32, "memory_bytes_per_s": bandwidth, "sm_clock_mhz": sm_mhz,
            "memory_clock_mhz": mem_mhz, "memory_bus_width_bits": bus, "fp32_results_per_clock_per_sm": lanes,
            "how": how, "not_derived": not_derived}


def at_locked_clock(nominal: dict | None, applied: dict | None) -> dict | None:
    """``nominal`` with ``fp32_flops_per_s_at_locked_clock``: the FP32 peak at the SM clock the measurement ran at
    (``applied``: clocks_applied.json of :func:`~operator_profiler.capture.clocks.locked_clocks`), when locked."""
    if not nominal or not applied or not applied.get("locked"):
        return nominal
    sm = (applied.get("applied") or {}).get("sm_mhz") or (applied.get("requested") or {}).get("sm_mhz")
    if sm and nominal.get("fp32_flops_per_s") and nominal.get("sm_clock_mhz"):
        nominal = {**nominal, "locked_sm_clock_mhz": sm,
                   "fp32_flops_per_s_at_locked_clock": nominal["fp32_flops_per_s"] * sm / nominal["sm_clock_mhz"]}
    return nominal


def describe_machine(torch, device: str) -> dict:
    """The machine record of ``ceilings.json``: CPU (model, CPUs, SIMD flags, native bfloat16, last-level cache),
    torch and Python, and on CUDA the GPU (properties and nvidia-smi clocks)."""
    cpu = machine.cpu_info()
    bf16 = machine.native_bf16(cpu["flags"])
    record = {"cpu_model": cpu["model"], "cpu_vendor": cpu["vendor"], "cpu_family": cpu["family"],
              "cpu_model_id": cpu["model_id"], "logical_cpus": cpu["logical_cpus"],
              "usable_cpus": machine.usable_cpus(),
              "cpu_simd_flags": [f for f in machine.SIMD_FLAGS if f in set(cpu["flags"])],
              "cpu_bf16_native": bool(bf16), "cpu_bf16_flags": bf16,
              "last_level_cache": machine.last_level_cache(), "torch": torch.__version__,
              "torch_git": getattr(torch.version, "git_version", None), "cuda_runtime": torch.version.cuda,
              "python": platform.python_version(), "platform": platform.platform(), "hostname": platform.node(),
              "gpu": None, "nvidia_smi": None}
    if device == "cuda":
        record["gpu"] = _gpu_properties(torch)
        record["nvidia_smi"] = _nvidia_smi(device)
    return record


# ---------------------------------------------------------------------------------------------- the record


def measure(device: str = "cpu", settings: dict | None = None, threads: int | None = None,
            rerun_identity: dict | None = None) -> dict:
    """Measure the ceilings of ``device`` and return the ``ceilings.json`` record (contract: DESIGN.md "Machine
    ceilings"; checked by :func:`validate_ceilings` before it is returned).

    ``settings``: :data:`DEFAULT_SETTINGS` keys (None = automatic, :func:`resolve_settings`); ``threads``: torch's
    intra-op threads for the measurement (None: as the process has them, e.g. from OMP_NUM_THREADS; put back
    after); ``rerun_identity``: the identity the workflow compares to re-measure (recorded; a difference from
    this process's identity is a warning).

    The set of measurements runs ``trials`` times (:func:`_trial`); ``compute_flops_per_s`` (FLOP/s) and
    ``memory_bytes_per_s`` (bytes/s) are each figure's best trial, ``measurements`` that trial's record of it
    (``trial``: its index), ``trials`` every trial's figures, wall time (s) and ``other_cpu_load`` (CPUs other
    processes kept busy on average; None when not estimated), and the top-level ``other_cpu_load`` the highest
    of the trials a figure was kept from. A CPU figure whose best trial ran under load is a warning.

    Raises:
        DeviceUnavailable: ``cuda`` without a CUDA GPU torch can use.
        ValueError: unknown device or settings.
    """
    import torch

    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(f"ceilings on 'cuda' need a CUDA GPU, and torch {torch.__version__} sees none on this "
                                "machine; measure on cpu, or run where the GPU is")
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        return _measure(torch, device, settings, rerun_identity)
    finally:
        torch.set_num_threads(saved_threads)


def _measure(torch, device: str, settings: dict | None, rerun_identity: dict | None) -> dict:
    started = datetime.now(UTC)
    described = describe_machine(torch, device)
    cache = (described["gpu"] or {}).get("l2_cache_bytes") if device == "cuda" else (
        (described["last_level_cache"] or {}).get("bytes"))
    resolved, warnings = resolve_settings(device, settings, cache)
    threads = torch.get_num_threads()
    identity = machine.machine_identity(device, threads, torch.__version__)
    if rerun_identity is not None:
        differs = sorted(k for k, v in rerun_identity.items() if v is not None and identity.get(k) != v)
        if differs:
            warnings.append("the workflow's rerun check identifies the machine differently in "
                            f"{', '.join(differs)} ({', '.join(f'{k}: {rerun_identity[k]!r}' for k in differs)}; here "
                            f"{', '.join(f'{k}: {identity.get(k)!r}' for k in differs)}), e.g. a cluster job on another "
                            "node or another torch in the job's environment: a change of this machine may not re-run "
                            "measure_ceilings (use --forcerun measure_ceilings)")
    spare = max(0, (described["usable_cpus"] or threads) - threads)
    wall_before = time.perf_counter()
    sizes, slow = gemm_sizes(torch, device, resolved)
    warnings += slow
    resolved["gemm_sizes"] = sizes
    trials = [_trial(torch, device, resolved, cache, t) for t in range(resolved["trials"])]
    elapsed = time.perf_counter() - wall_before
    measurements, kept = _best_of_trials(trials)
    loads = [trials[t]["other_cpu_load"] for t in kept if trials[t]["other_cpu_load"] is not None]
    others = max(loads) if loads else None
    if device == "cpu":  # a GPU's figures do not depend on the CPUs
        warnings += _load_warnings(trials, measurements, spare, threads)
    for trial in trials:
        del trial["measurements"]
    if device == "cpu" and not described["cpu_bf16_native"]:
        warnings.append("the CPU has no native bfloat16 (no avx512_bf16 / amx_bf16 flag): the bfloat16 GEMM is "
                        "emulated (converted to float32)")
    gemm = {m["dtype"]: m["flops_per_s_best"] for m in measurements if m["kind"] == "gemm"}
    memory = {m["kernel"]: m["bytes_per_s_best"] for m in measurements if m["kind"] == "stream"}
    nominal = nominal_cuda(described["gpu"], described["nvidia_smi"]) if device == "cuda" else None
    for warning in warnings:
        log.warning("ceilings: %s", warning)
    return {
        "schema": SCHEMA, "device": device, "machine": described, "identity": identity,
        "fingerprint": machine.fingerprint(identity), "rerun_identity": rerun_identity, "threads": threads,
        "compute_flops_per_s": gemm, "memory_bytes_per_s": {**memory, "best": max(memory.values())},
        "nominal": nominal, "nominal_note": CPU_NOMINAL_NOTE if device == "cpu" else (
            "derived from the GPU's properties (nominal.how); peaks not derivable are null (nominal.not_derived)"),
        "measurements": measurements, "trials": trials, "settings": resolved, "clocks": None,
        "other_cpu_load": others, "warnings": warnings,
        "measured_at": started.isoformat(timespec="seconds"), "elapsed_s": round(elapsed, 3),
    }


def _trial(torch, device: str, resolved: dict, cache: int | None, index: int) -> dict:
    """One trial: every GEMM of the device, then the STREAM kernels, with the other processes' CPU load meanwhile.

    Returns ``{"trial", "elapsed_s", "other_cpu_load", "compute_flops_per_s", "memory_bytes_per_s",
    "measurements"}``: the load in CPUs kept busy on average by other processes (/proc/stat busy time less this
    process's own CPU time, over the trial's wall time; None when unreadable or the trial is shorter than
    :data:`MIN_LOAD_WINDOW_S`), the figures (FLOP/s, bytes/s) and the measurement records, each marked with
    ``trial``."""
    busy_before, own_before, wall_before = machine.cpu_busy_seconds(), os.times(), time.perf_counter()
    run = {k: resolved[k] for k in ("runs", "warmup", "min_run_s")}
    sizes = resolved.get("gemm_sizes") or {}
    measurements = [measure_gemm(torch, device, dtype, sizes.get(dtype, resolved["gemm_n"]), **run)
                    for dtype in GEMM_DTYPES[device]]
    if device == "cuda":
        torch.cuda.empty_cache()
    measurements += measure_stream(torch, device, resolved["stream_bytes"], cache, resolved["cache_multiple"], **run)
    if device == "cuda":
        torch.cuda.empty_cache()
    elapsed = time.perf_counter() - wall_before
    busy_after, own_after = machine.cpu_busy_seconds(), os.times()
    others = None
    if busy_before is not None and busy_after is not None and elapsed >= MIN_LOAD_WINDOW_S:
        own = (own_after.user - own_before.user) + (own_after.system - own_before.system)
        others = round(max(0.0, (busy_after - busy_before - own) / elapsed), 3)
    for m in measurements:
        m["trial"] = index
    return {"trial": index, "elapsed_s": round(elapsed, 3), "other_cpu_load": others,
            "compute_flops_per_s": {m["dtype"]: m["flops_per_s_best"] for m in measurements if m["kind"] == "gemm"},
            "memory_bytes_per_s": {m["kernel"]: m["bytes_per_s_best"] for m in measurements if m["kind"] == "stream"},
            "measurements": measurements}


def _rate(m: dict) -> float:
    return m["flops_per_s_best"] if m["kind"] == "gemm" else m["bytes_per_s_best"]


def _best_of_trials(trials: list[dict]) -> tuple[list[dict], list[int]]:
    """Per measurement (by name, in the first trial's order) the record of the trial with the highest rate (the
    earliest on a tie), and the trials those came from."""
    best: dict[str, dict] = {}
    for trial in trials:
        for m in trial["measurements"]:
            if m["name"] not in best or _rate(m) > _rate(best[m["name"]]):
                best[m["name"]] = m
    kept = list(best.values())
    return kept, sorted({m["trial"] for m in kept})


def _load_warnings(trials: list[dict], kept: list[dict], spare: int, threads: int) -> list[str]:
    """One warning per trial that a kept figure came from and that ran under load (other processes busier than
    the spare CPUs + :data:`LOAD_MARGIN`)."""
    warnings = []
    for trial in trials:
        load = trial["other_cpu_load"]
        names = [m["name"] for m in kept if m["trial"] == trial["trial"]]
        if names and load is not None and load > spare + LOAD_MARGIN:
            warnings.append(f"the best of {len(trials)} trial(s) for {', '.join(names)} (trial {trial['trial'] + 1}) "
                            f"ran while other processes kept {load:.1f} CPUs busy on average ({spare} spare beside "
                            f"its {threads} thread(s)): these figures may be low; measure again on a quiet machine "
                            "(snakemake --forcerun measure_ceilings)")
    return warnings


def measure_ceilings_job(device: str, settings: dict | None, clocks_config: dict | None, rerun_identity: dict | None,
                         out: Path, out_clocks: Path, threads: int | None = None) -> dict:
    """The ``measure_ceilings`` rule: :func:`measure` with ``threads`` torch threads (the captures' count; the job
    itself claims every core, so that no other job runs beside the measurement, and Snakemake's OMP_NUM_THREADS
    is that larger count; None: torch's threads as the job has them) and write ``out`` (ceilings.json) and
    ``out_clocks`` (clocks_applied.json), each atomically.
    On CUDA the GPU's clocks are locked as the captures lock them (the config's ``clocks``:
    :func:`~operator_profiler.capture.clocks.choose_target` and ``locked_clocks``, which also holds the GPU
    exclusively); the record's ``clocks`` is what was applied.

    Raises:
        DeviceUnavailable, ClockError, ClockPermissionError, ConfigError: see :func:`measure` and the clocks module.
    """
    from .clocks import choose_target, locked_clocks, read_back

    if device == "cuda":
        target = choose_target(clocks_config or {}, device)
        with locked_clocks(target, Path(out_clocks), device) as applied:
            applied["tool"] = "measure_ceilings"
            record = measure(device, settings, threads=threads, rerun_identity=rerun_identity)
            read_back(applied, "after the measurements, their CUDA context still open")
        record["clocks"] = applied
        record["nominal"] = at_locked_clock(record["nominal"], applied)
    else:
        record = measure(device, settings, threads=threads, rerun_identity=rerun_identity)
        write_json(Path(out_clocks), {"locked": False, "device": device, "reason": "CPU run: no GPU clocks"})
    validate_ceilings(record, str(out))
    write_json(Path(out), record)
    return record


# ---------------------------------------------------------------------------------------------- the contract


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def _problems(record) -> list[str]:
    if not isinstance(record, dict):
        return ["the top level is not a JSON object"]
    problems = []
    if record.get("schema") != SCHEMA:
        problems.append(f"schema is {record.get('schema')!r}, this version reads {SCHEMA}")
    device = record.get("device")
    if device not in DEVICES:
        return problems + [f"device is {device!r}, not one of {', '.join(DEVICES)}"]
    for key, kind in (("machine", dict), ("fingerprint", str), ("threads", int), ("compute_flops_per_s", dict),
                      ("memory_bytes_per_s", dict), ("measurements", list), ("measured_at", str)):
        if not isinstance(record.get(key), kind):
            problems.append(f"{key} is missing or not a {kind.__name__}")
    if record.get("nominal") is not None and not isinstance(record["nominal"], dict):
        problems.append("nominal is neither an object nor null")
    if problems:
        return problems
    if record["threads"] < 1:
        problems.append(f"threads is {record['threads']}, not a positive count")
    by_name = {}
    for i, m in enumerate(record["measurements"]):
        if not isinstance(m, dict) or m.get("kind") not in ("gemm", "stream"):
            problems.append(f"measurements[{i}] is not a gemm or stream measurement")
            continue
        times, calls = m.get("times_s"), m.get("calls_per_run")
        if not (isinstance(times, list) and times and all(isinstance(t, (int, float)) and t > 0 for t in times)
                and isinstance(calls, int) and calls >= 1):
            problems.append(f"measurements[{i}] ({m.get('name')}) has no positive times_s or calls_per_run")
            continue
        work, unit = (m.get("flop_per_call"), "flops") if m["kind"] == "gemm" else (m.get("bytes_per_call"), "bytes")
        if not isinstance(work, int) or work <= 0:
            problems.append(f"measurements[{i}] ({m.get('name')}) has no positive {unit[:-1]}_per_call")
            continue
        if not _close(m.get("best_s", -1), min(times)) or not _close(m.get("median_s", -1), statistics.median(times)):
            problems.append(f"measurements[{i}] ({m.get('name')}): best_s/median_s are not the min/median of times_s")
        if not _close(m.get(f"{unit}_per_s_best") or -1, work * calls / min(times)):
            problems.append(f"measurements[{i}] ({m.get('name')}): {unit}_per_s_best is not {unit[:-1]}_per_call x "
                            "calls_per_run / best_s")
        by_name[(m["kind"], m.get("dtype") if m["kind"] == "gemm" else m.get("kernel"))] = m.get(f"{unit}_per_s_best")
    for dtype in GEMM_DTYPES[device]:
        figure = record["compute_flops_per_s"].get(dtype)
        if not isinstance(figure, (int, float)) or not figure > 0 or not math.isfinite(figure):
            problems.append(f"compute_flops_per_s.{dtype} is missing or not a positive number")
        elif ("gemm", dtype) not in by_name or not _close(figure, by_name[("gemm", dtype)]):
            problems.append(f"compute_flops_per_s.{dtype} is not its measurement's flops_per_s_best")
    memory = record["memory_bytes_per_s"]
    for kernel in STREAM_KERNELS:
        figure = memory.get(kernel)
        if not isinstance(figure, (int, float)) or not figure > 0 or not math.isfinite(figure):
            problems.append(f"memory_bytes_per_s.{kernel} is missing or not a positive number")
        elif ("stream", kernel) not in by_name or not _close(figure, by_name[("stream", kernel)]):
            problems.append(f"memory_bytes_per_s.{kernel} is not its measurement's bytes_per_s_best")
    kernels = [memory.get(k) for k in STREAM_KERNELS]
    if all(isinstance(v, (int, float)) for v in kernels) and not _close(memory.get("best") or -1, max(kernels)):
        problems.append("memory_bytes_per_s.best is not the largest of copy and triad")
    if "trials" in record:  # (a record from before trials were measured has none: one trial)
        problems += _trial_problems(record)
    return problems


def _trial_problems(record: dict) -> list[str]:
    """``trials``: a non-empty list of trials numbered 0..n-1, each with its figures; every ceiling the best of its
    trials' figures, and every measurement's ``trial`` one whose figure it is."""
    trials = record["trials"]
    if not (isinstance(trials, list) and trials and all(
            isinstance(t, dict) and t.get("trial") == i and isinstance(t.get("compute_flops_per_s"), dict)
            and isinstance(t.get("memory_bytes_per_s"), dict) for i, t in enumerate(trials))):
        return ["trials is not a non-empty list of trials numbered from 0, each with compute_flops_per_s and "
                "memory_bytes_per_s"]
    problems = []
    for field, keys in (("compute_flops_per_s", GEMM_DTYPES[record["device"]]), ("memory_bytes_per_s", STREAM_KERNELS)):
        for key in keys:
            values = [t[field].get(key) for t in trials]
            if not all(isinstance(v, (int, float)) and v > 0 for v in values):
                problems.append(f"trials: a trial has no positive {field}.{key}")
            elif not _close(record[field].get(key) or -1, max(values)):
                problems.append(f"{field}.{key} is not the best of its trials ({', '.join(f'{v:.4g}' for v in values)})")
    for i, m in enumerate(record["measurements"]):
        t = m.get("trial") if isinstance(m, dict) else None
        if not isinstance(t, int) or not 0 <= t < len(trials):
            problems.append(f"measurements[{i}] ({m.get('name') if isinstance(m, dict) else m}) names no trial of "
                            f"the {len(trials)}")
            continue
        field, key = (("compute_flops_per_s", m.get("dtype")) if m.get("kind") == "gemm"
                      else ("memory_bytes_per_s", m.get("kernel")))
        rate = m.get("flops_per_s_best") if m.get("kind") == "gemm" else m.get("bytes_per_s_best")
        if not _close(trials[t][field].get(key) or -1, rate or -2):
            problems.append(f"measurements[{i}] ({m.get('name')}) is not trial {t}'s {field}.{key}")
    return problems


def validate_ceilings(record, source: str = "ceilings.json") -> None:
    """Check a ceilings record against the contract: the keys and types, every dtype of its device and both STREAM
    kernels with positive figures, each figure its measurement's best rate (work per call x calls per run / best
    run time), ``memory_bytes_per_s.best`` the larger bandwidth; with ``trials``, each figure the best of its
    trials' and each measurement the figure of the trial it names.

    Raises:
        InputError: naming ``source`` and every problem found (up to five).
    """
    problems = _problems(record)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise InputError(f"{source} is not a ceilings record of schema {SCHEMA}: {'; '.join(problems[:5])}{more}; "
                         "measure again (snakemake --forcerun measure_ceilings, or opprof ceilings)")


def read_ceilings(path: Path) -> dict:
    """Read and check ``ceilings.json`` (:func:`validate_ceilings`).

    Raises:
        InputError: missing or unreadable file, not JSON, or not the contract.
    """
    record = read_json_file(Path(path), "the machine ceilings", "run the measure_ceilings rule (or opprof ceilings)",
                            expect=dict)
    validate_ceilings(record, str(path))
    return record


def _of(record: dict, measurement: dict) -> str:
    """``, trial 2 of 3`` for a record with trials (the trial the figure was kept from)."""
    trials = record.get("trials") or []
    return f", trial {measurement['trial'] + 1} of {len(trials)}" if trials and "trial" in measurement else ""


def summary_lines(record: dict, warnings: bool = True) -> list[str]:
    """The figures of a ceilings record, one line each (GFLOP/s, GB/s = 1e9 bytes/s), for the terminal; with
    ``warnings``, its warnings after them."""
    m = record["machine"]
    where = (m.get("gpu") or {}).get("name") if record["device"] == "cuda" else m.get("cpu_model")
    lines = [f"ceilings on {record['device']} ({where}; {record['threads']} thread(s), torch {m.get('torch')}):"]
    by_name = {x["name"]: x for x in record["measurements"]}
    for dtype, value in record["compute_flops_per_s"].items():
        x = by_name[f"gemm_{dtype}"]
        note = ""
        if record["device"] == "cpu" and dtype == "bfloat16" and not m.get("cpu_bf16_native"):
            note = " (emulated: no native bfloat16 on this CPU)"
        lines.append(f"  GEMM {dtype:<9} {value / 1e9:10.1f} GFLOP/s  (n={x['n']}, best of {x['runs']}{_of(record, x)}; "
                     f"median {x['flops_per_s_median'] / 1e9:.1f}){note}")
    for kernel in STREAM_KERNELS:
        x = by_name[f"stream_{kernel}"]
        lines.append(f"  {kernel:<14} {record['memory_bytes_per_s'][kernel] / 1e9:10.2f} GB/s     "
                     f"({x['array_bytes'] / MIB:.0f} MiB arrays, best of {x['runs']}{_of(record, x)}; median "
                     f"{x['bytes_per_s_median'] / 1e9:.2f})")
    trials = record.get("trials") or []
    if trials:
        loads = ", ".join("not estimated" if t.get("other_cpu_load") is None else f"{t['other_cpu_load']:.2f}"
                          for t in trials)
        lines.append(f"  {len(trials)} trial(s); other processes' CPU load in each (CPUs busy): {loads}")
    nominal = record.get("nominal")
    if nominal:
        for key, unit, scale in (("fp32_flops_per_s", "GFLOP/s", 1e9), ("memory_bytes_per_s", "GB/s", 1e9)):
            value = nominal.get(key)
            lines.append(f"  nominal {key}: " + (f"{value / scale:.1f} {unit}" if value else
                                                 f"not derived ({nominal['not_derived'].get(key)})"))
    for warning in record.get("warnings", []) if warnings else []:
        lines.append(f"  warning: {warning}")
    return lines
