"""The optimizer's change vocabulary without torch (the advisor and the workflow read it): each change, its
preconditions, and what this machine offers them (:func:`machine_features`). How a change is applied:
:mod:`.changes`; the list with each change explained: docs/optimize.md."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import WorkloadError

@dataclass(frozen=True)
class Change:
    """One change: ``id``; ``summary`` (one line); ``kind``: "setting" | "compiler" | "rewrite"; ``devices``: where
    it applies ({"cpu", "cuda"}); ``needs``: preconditions among "inference" (not mode train), "compile" (the
    variant also has the ``compile`` change), "cuda", "native_bf16" (CPU avx512_bf16 or amx_bf16; CUDA
    capability >= 8.0), "native_int8" (CPU avx512_vnni, avx_vnni or amx_int8), "static_shapes"."""

    id: str
    summary: str
    kind: str
    devices: frozenset[str]
    needs: frozenset[str] = frozenset()


def _change(id: str, summary: str, kind: str, devices: Iterable[str] = ("cpu", "cuda"),
            needs: Iterable[str] = ()) -> Change:
    return Change(id, summary, kind, frozenset(devices), frozenset(needs))


#: Every change, in the canonical order of application.
CHANGES: dict[str, Change] = {c.id: c for c in [
    _change("compile", "torch.compile with Inductor, default mode", "compiler"),
    _change("max_autotune", "Inductor max_autotune: benchmark GEMM/conv choices (no CUDA graphs)", "compiler",
            needs=["compile"]),
    _change("cuda_graphs", "Inductor triton.cudagraphs: replay the compiled graph as one CUDA graph", "compiler",
            devices=["cuda"], needs=["cuda", "compile", "static_shapes"]),
    _change("freezing", "Inductor freezing: weights become constants, constant folding, conv-BN folding, "
            "weight prepacking for oneDNN/MKL", "compiler", needs=["inference", "compile"]),
    _change("bf16_autocast", "torch.autocast(device, torch.bfloat16) around the forward", "setting",
            needs=["native_bf16"]),
    _change("tf32", "TF32 for float32 matmul and cuDNN convolutions (allow_tf32)", "setting", devices=["cuda"],
            needs=["cuda"]),
    _change("channels_last", "model and 4-D inputs in torch.channels_last memory format", "setting"),
    _change("sdpa_rewrite", "FX rewrite of explicit attention into F.scaled_dot_product_attention", "rewrite"),
    _change("conv_bn_fold", "FX fold of Conv2d + BatchNorm2d (eval mode) into one Conv2d", "rewrite",
            needs=["inference"]),
    _change("cast_pair_cancel", "FX removal of exact cast round trips (widen then back, e.g. fp32->fp64->fp32)",
            "rewrite"),
    _change("keep_rnn_library", "keep nn.LSTM/GRU/RNN as the library kernel (cuDNN / oneDNN) when compiling: "
            "torch._dynamo.config.allow_rnn False, Dynamo breaks the graph there instead of unrolling",
            "compiler", needs=["compile"]),
    _change("int8_dynamic", "dynamic int8 quantization of nn.Linear (torch.ao quantize_dynamic: int8 weights, "
            "activations quantized per call, fbgemm/x86 kernels)", "rewrite", devices=["cpu"],
            needs=["inference", "native_int8"]),
]}

#: run.json's ``mode`` (the workload's) -> the mode the preconditions name ("infer": inference).
MODES = {"inference": "infer", "train": "train"}
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: CPU flags of int8 dot-product instructions (VNNI: vpdpbusd; AMX tiles). Without them an int8 GEMM multiplies
#: through 16-bit intermediates (vpmaddubsw + vpmaddwd) and pays a per-call activation quantization.
_CPU_INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: Set to 1 (or true/yes/on) to treat this CPU as having int8 dot products (measure int8_dynamic where it is not
#: offered; the features' source says it was forced); 0/false/no/off or empty is off; any other value is refused.
FORCE_INT8_ENV = "OPPROF_FORCE_INT8"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def force_int8() -> bool:
    """Whether :data:`FORCE_INT8_ENV` forces int8 on: 1/true/yes/on (any case) yes; unset, empty, 0/false/no/off
    no. Raises WorkloadError (one line) for any other value, so a typo never silently measures without it."""
    value = os.environ.get(FORCE_INT8_ENV)
    if value is None:
        return False
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise WorkloadError(f"{FORCE_INT8_ENV}={value!r}: set it to 1 (or true, yes, on) to force int8_dynamic, to 0 "
                        "(or false, no, off) or unset it not to")
#: Why int8_dynamic is refused without VNNI/AMX: what it measured on a CPU without them (docs/optimize.md).
NO_INT8_MEASURED = ("measured on a 2-core AMD EPYC with AVX2 only, GPT-2 small (batch 1, sequence 128, random "
                    "weights) ran 1.7x to 2.1x faster than FP32 eager with it on a busy machine, short of the "
                    "3.5x goal, and its top-1 token agreed with FP32 eager at 94.5 to 94.8 % of 1024 "
                    "positions, below the 99 % required")


def canonical(changes: Iterable[str]) -> tuple[str, ...]:
    """The changes, deduplicated, in the canonical order of :data:`CHANGES`. Raises WorkloadError for an
    unknown id, naming the known ones."""
    given = list(changes)
    unknown = [c for c in given if c not in CHANGES]
    if unknown:
        raise WorkloadError(f"unknown change(s) {', '.join(map(repr, unknown))}; known: {', '.join(CHANGES)}")
    return tuple(c for c in CHANGES if c in set(given))


def _cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str] | None:
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def machine_features(device: str, cpuinfo: str = "/proc/cpuinfo") -> dict:
    """What the preconditions need to know of this machine for ``device`` ("cpu" or "cuda"):
    ``native_bf16`` (bool), ``native_bf16_source`` (the flags or capability it was read from), ``cuda`` (a CUDA
    device is usable), ``native_int8`` and ``native_int8_source`` (CPU: int8 dot products, VNNI or AMX; forced on
    by the environment variable :data:`FORCE_INT8_ENV` (:func:`force_int8`); CUDA: False, int8_dynamic is a CPU change), and
    on CPU ``cpu_flags`` (from ``cpuinfo``, None when unreadable), on CUDA ``capability`` ((major, minor) of device
    0)."""
    features: dict[str, Any] = {"device": device}
    if device == "cpu":
        flags = _cpu_flags(cpuinfo)
        found = sorted(set(flags or ()) & set(_CPU_BF16_FLAGS))
        features.update(cpu_flags=flags, native_bf16=bool(found),
                        native_bf16_source=(f"{cpuinfo} flags: {', '.join(found)}" if found else
                                            f"{cpuinfo} has neither {' nor '.join(_CPU_BF16_FLAGS)}"
                                            if flags is not None else f"{cpuinfo} unreadable"))
        int8 = sorted(set(flags or ()) & set(_CPU_INT8_FLAGS))
        source = (f"{cpuinfo} flags: {', '.join(int8)}" if int8 else
                  f"{cpuinfo} has none of {', '.join(_CPU_INT8_FLAGS)}" if flags is not None else
                  f"{cpuinfo} unreadable")
        forced = force_int8() and not int8
        features.update(native_int8=bool(int8) or forced,
                        native_int8_source=(f"forced by {FORCE_INT8_ENV}={os.environ[FORCE_INT8_ENV]} ({source})"
                                            if forced else source))
        features["cuda"] = False
        return features
    import torch

    available = torch.cuda.is_available()
    features["cuda"] = available
    capability = torch.cuda.get_device_capability() if available else None
    features["capability"] = capability
    features["native_bf16"] = bool(capability and capability >= (8, 0))
    features["native_int8"] = False
    features["native_int8_source"] = "int8_dynamic runs on CPU only"
    features["native_bf16_source"] = (f"CUDA capability {capability[0]}.{capability[1]} (bf16 needs >= 8.0)"
                                      if capability else "no CUDA device")
    return features


def precondition_problems(changes: Iterable[str], device: str, mode: str, features: dict,
                          static_shapes: bool = True) -> list[str]:
    """One sentence per unmet precondition, naming the change and why; [] when every change can apply.
    ``mode``: "infer" or "train"; ``features``: :func:`machine_features`; ``static_shapes``: the workload's
    input shapes are fixed (the harness runs fixed example inputs)."""
    given = list(changes)
    unknown = [c for c in given if c not in CHANGES]
    problems = [f"unknown change {c!r}; known: {', '.join(CHANGES)}" for c in unknown]
    chosen = set(given) - set(unknown)
    for change_id in [c for c in CHANGES if c in chosen]:
        change = CHANGES[change_id]
        if device not in change.devices:
            problems.append(f"{change_id} applies only on {' or '.join(sorted(change.devices))}, not on {device}")
        for need in sorted(change.needs):
            if need == "inference" and mode == "train":
                problems.append(f"{change_id} needs inference (mode infer): in mode train it would change what "
                                "is trained")
            elif need == "compile" and "compile" not in chosen:
                problems.append(f"{change_id} needs torch.compile: add the change 'compile'")
            elif need == "cuda" and (device != "cuda" or not features.get("cuda")):
                if device in change.devices:
                    problems.append(f"{change_id} needs a usable CUDA device")
            elif need == "native_bf16" and not features.get("native_bf16"):
                problems.append(f"{change_id} needs native bf16 on {device} "
                                f"({features.get('native_bf16_source', 'machine features unknown')}): "
                                "bf16 would be emulated and slower than fp32")
            elif need == "native_int8" and device in change.devices and not features.get("native_int8"):
                problems.append(f"{change_id} needs int8 dot products on {device}, VNNI or AMX "
                                f"({features.get('native_int8_source', 'machine features unknown')}): without "
                                f"them the int8 GEMMs do not pay ({NO_INT8_MEASURED})")
            elif need == "static_shapes" and not static_shapes:
                problems.append(f"{change_id} needs static input shapes (a CUDA graph replays fixed shapes)")
    return problems
