"""The process every capture runs: build the workload, compile it as configured, warm up until steady, and run
the measured iterations, each inside an iteration range and every layer call inside a layer range
(``record_function`` for Kineto, NVTX for nsys/ncu), so every later stage can place a kernel in both.
Details: docs/modules.md#capture-harness."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..errors import DeviceUnavailable, from_user_exception
from ..naming import (ITERATION_PREFIX, LAYER_PREFIX, MEASURED_RANGE, MODEL_RANGE, NVTX_DOMAIN, SHAPES_CHECK_SUFFIX,
                      SHAPES_ITERATION)
from . import fx_module_paths, machine, op_inputs, training, workloads

PROFILERS = ("torch", "cuda_profiler_api", "none")


#: The shortest window over which a capture measures the other processes' load (s): a run of the measured
#: iterations shorter than this waits, idle, until it has passed (run.json ``machine_load.waited_s``).
LOAD_WINDOW_S = 0.5


def resolve_device(requested: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA GPU, else ``cpu``; ``cpu``/``cuda`` pass through.

    Raises:
        DeviceUnavailable: ``cuda`` requested on a machine where torch sees no CUDA GPU.
    """
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(
            "device 'cuda' needs a CUDA GPU, and torch sees none on this machine "
            f"(torch {torch.__version__}); set device: auto or cpu in the config"
        )
    return requested


class _RangeEmitter:
    """Push/pop named ranges to the torch profiler and, on CUDA, to NVTX in our domain."""

    def __init__(self, use_nvtx: bool):
        self.nvtx_backend = "none"
        self._nvtx_push: Callable[[str], None] | None = None
        self._nvtx_pop: Callable[[], None] | None = None
        if use_nvtx:
            try:  # NVIDIA's nvtx package supports domains; torch.cuda.nvtx only the default domain
                import nvtx  # type: ignore[import-not-found]

                self._nvtx_push = lambda name: nvtx.push_range(name, domain=NVTX_DOMAIN)
                self._nvtx_pop = lambda: nvtx.pop_range(domain=NVTX_DOMAIN)
                self.nvtx_backend = f"nvtx (domain {NVTX_DOMAIN})"
            except ImportError:
                self._nvtx_push = torch.cuda.nvtx.range_push
                self._nvtx_pop = torch.cuda.nvtx.range_pop
                self.nvtx_backend = "torch.cuda.nvtx (default domain)"
        self._open: list[torch.autograd.profiler.record_function] = []

    def push(self, name: str) -> None:
        if self._nvtx_push:
            self._nvtx_push(name)
        rf = torch.autograd.profiler.record_function(name)
        rf.__enter__()
        self._open.append(rf)

    def pop(self) -> None:
        self._open.pop().__exit__(None, None, None)
        if self._nvtx_pop:
            self._nvtx_pop()

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        self.push(name)
        try:
            yield
        finally:
            self.pop()


def _seed_everything(seed: int, device: str, deterministic: bool) -> None:
    """Seed Python's and torch's generators with ``seed``; set cuDNN's autotuning off; with ``deterministic``
    also force PyTorch's deterministic algorithms, cuDNN's deterministic mode and (CUDA) cuBLAS's fixed workspace.

    Without ``deterministic`` (harness.deterministic false, the default) the process's own settings stay as they
    are: on CUDA the deterministic variants are other, often slower, kernels (convolution algorithms, scatter and
    index_add, GEMM with a fixed workspace), so a profile under them would describe kernels production never
    runs. Every run of one workload gets the same setting from the same harness config, and the kernel-sequence
    checks (kernel counts compared across runs) catch runs whose kernels still differ."""
    random.seed(seed)
    torch.manual_seed(seed)
    # cuDNN's autotuner times candidate algorithms at each new shape and keeps the fastest, so two captures of one
    # workload (nsys and Kineto, the ncu re-run) could pick different kernels and no longer match: off in both
    # modes, whatever the model sets (run_capture sets it again after the model is built).
    torch.backends.cudnn.benchmark = False
    if not deterministic:
        return
    # warn_only: some kernels (e.g. index backward on CUDA) have no deterministic variant;
    # the invocation order, which matching needs, stays identical either way.
    torch.use_deterministic_algorithms(True, warn_only=True)
    # ... but not its side effect of filling every new allocation (an extra aten::fill_ per
    # torch.empty on CPU, an extra kernel on CUDA) that the model would not run outside profiling.
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = True
    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _settings(deterministic: bool, model_cudnn_benchmark: bool) -> dict:
    """The settings every run of one workload must share (recorded in ``run.json``): ``deterministic_requested``
    (harness.deterministic) and the state the measured iterations ran in; ``cudnn_benchmark_set_by_model``: the
    model's factory had turned cudnn.benchmark on (the harness turned it off again)."""
    return {
        "deterministic_requested": bool(deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_benchmark_set_by_model": bool(model_cudnn_benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "deterministic_warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "autotuning": "in warm-up only (Inductor's, per compile_mode; cudnn.benchmark off)",
    }


def _configure_inductor(debug_dir: Path | None, device: str) -> None:
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    if device == "cpu":
        # C++ kernels are invisible to the profiler without this (docs/formats.md#inductor-switches).
        inductor_config.cpp.enable_kernel_profile = True
    if debug_dir is not None:
        debug_dir.mkdir(parents=True, exist_ok=True)
        dynamo_config.debug_dir_root = str(debug_dir)
        inductor_config.trace.enabled = True
        inductor_config.trace.provenance_tracking_level = 1
        # A cache hit skips code generation and with it the debug artifacts.
        inductor_config.fx_graph_cache = False
        inductor_config.fx_graph_remote_cache = False
    # N identical layers compile once, but guards may still be checked per instance.
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 64)


def _install_layer_ranges(
    model: torch.nn.Module, layers: list[workloads.LayerInstance], emitter: _RangeEmitter
) -> None:
    modules = dict(model.named_modules())
    for layer in layers:
        module = modules[layer.path]
        name = LAYER_PREFIX + layer.path
        module.register_forward_pre_hook(lambda _m, _a, _n=name: emitter.push(_n))
        module.register_forward_hook(lambda _m, _a, _o: emitter.pop())


COMPILE_SCOPES = ("model", "layers")


def compile_kwargs(workload: dict) -> dict:
    """The ``torch.compile`` keyword arguments of a workload: ``options`` when ``compile_options`` is not empty,
    else ``mode`` (``compile_mode``, default ``"default"``): torch.compile takes one or the other.

    Raises:
        workloads.WorkloadError: both are set, or an option torch._inductor does not know (the list:
            ``torch._inductor.list_options()``).
    """
    mode = workload.get("compile_mode") or "default"
    options = dict(workload.get("compile_options") or {})
    if not options:
        return {"mode": mode}
    if mode != "default":
        raise workloads.WorkloadError(
            f"compile_mode {mode!r} and compile_options cannot both be set (torch.compile takes one or the other); "
            "keep one in the workload's config")
    import torch._inductor

    known = set(torch._inductor.list_options())
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise workloads.WorkloadError(
            f"compile_options {', '.join(map(repr, unknown))} not known to torch._inductor {torch.__version__} "
            "(see torch._inductor.list_options()); fix compile_options in the workload's config")
    return {"options": options}


def _precompiled_parts(model: torch.nn.Module) -> list[str]:
    """Where ``model`` is already compiled with torch.compile: an ``OptimizedModule`` (``torch.compile(module)``),
    a module whose ``compile()`` was called, or a module whose ``forward`` is a torch.compile'd function."""
    from torch._dynamo.eval_frame import OptimizedModule

    found = []
    for path, module in model.named_modules():
        name = f"module {path!r}" if path else "the model"
        if isinstance(module, OptimizedModule):
            found.append(f"{name} is torch.compile(...)'d (OptimizedModule)")
        elif getattr(module, "_compiled_call_impl", None) is not None:
            found.append(f"{name} was compiled with .compile()")
        elif hasattr(module.__dict__.get("forward"), "_torchdynamo_orig_callable"):
            found.append(f"the forward of {name} is torch.compile'd")
    return found


def _unwrap_precompiled(model: torch.nn.Module, workload: dict, name: str) -> tuple[torch.nn.Module, list[str]]:
    """The model to profile and notes for ``run.json`` (see the module docstring).

    Raises:
        workloads.WorkloadError: the factory compiled the model (or parts of it) itself, other than a top-level
            ``torch.compile(model)`` with ``compile: true``.
    """
    from torch._dynamo.eval_frame import OptimizedModule

    notes = []
    compiled = bool(workload.get("compile", False))
    if compiled and isinstance(model, OptimizedModule):
        notes.append("the factory returned torch.compile(model); the profiler compiled the original model itself "
                     f"(compile_scope {workload.get('compile_scope', 'model')!r}, {compile_kwargs(workload)}), not "
                     "with the factory's torch.compile settings")
        model = model._orig_mod
    parts = _precompiled_parts(model)
    if parts:
        what = "; ".join(parts[:3]) + (f"; and {len(parts) - 3} more" if len(parts) > 3 else "")
        fix = ("return it uncompiled: the profiler compiles it as compile_scope says (model: torch.compile of the "
               "whole model; layers: each layer)") if compiled else (
            "set compile: true in its config (compile_scope: model for torch.compile(model), layers for per-layer "
            "compilation; compile_mode/compile_options as you compile) and return the model uncompiled")
        raise workloads.WorkloadError(
            f"workload {name!r}: the factory returned an already compiled model ({what}); its Inductor kernels "
            f"would run without the fusion map that explains them{'' if compiled else ' (compile: false)'}: {fix}")
    return model, notes


def _compile(model: torch.nn.Module, layers: list[workloads.LayerInstance], workload: dict,
             emitter: _RangeEmitter | None = None, backend=None) -> dict:
    """Compile per the workload's ``compile_scope`` (module docstring), with ``emitter``'s model range around
    each call of a whole-model compiled model; returns the ``run.json`` entries
    ``compile_scope`` (the scope used: ``model`` also for ``layers`` when the model has no layers),
    ``compile_mode`` and ``compile_options``. Inside a :func:`fx_module_paths.recording` (a capture with debug output) the
    model is handed to the recorder, which writes each graph's FX node module paths.

    Raises:
        workloads.WorkloadError: see :func:`compile_kwargs`.
    """
    kwargs = compile_kwargs(workload)
    if backend is not None:  # the workload's changes (transforms.changes.rewrite_backend: options, FX rewrites)
        kwargs = {"backend": backend}
    scope = workload.get("compile_scope", "model")
    if scope not in COMPILE_SCOPES:
        raise workloads.WorkloadError(f"compile_scope {scope!r} is not one of {', '.join(COMPILE_SCOPES)}")
    fx_module_paths.bind(model)
    if scope == "layers" and layers:
        modules = dict(model.named_modules())
        for layer in layers:
            module = modules[layer.path]
            module.forward = torch.compile(module.forward, **_copy(kwargs))
    else:
        scope = "model"
        from torch._dynamo import trace_rules

        if trace_rules.check(model.forward):  # Dynamo skips this frame: model.compile() would compile nothing
            raise workloads.WorkloadError(
                f"the model is torch's own {type(model).__name__}, whose forward torch.compile does not trace when it "
                "is the compiled frame (model.compile() would compile nothing and the profile would be of the eager "
                "model); wrap it in a module of your own (class Net(nn.Module) whose forward calls it), use "
                "compile_scope: layers, or set compile: false")
        model.compile(**_copy(kwargs))  # torch.compile(model._call_impl, ...): the graph of torch.compile(model)
        if emitter is not None:
            compiled_call = model._compiled_call_impl  # what Module.__call__ runs once compiled

            def call_in_model_range(*args, **kwargs):
                with emitter.range(MODEL_RANGE):
                    return compiled_call(*args, **kwargs)

            model._compiled_call_impl = call_in_model_range
    if backend is not None:
        return {"compile_scope": scope, "compile_mode": None, "compile_options": dict(backend.options) or None,
                "compile_backend": f"transforms.changes.RewriteBackend(inner={backend.inner!r})"}
    return {"compile_scope": scope, "compile_mode": kwargs.get("mode"), "compile_options": kwargs.get("options")}


def _dynamo_graphs() -> int:
    """How many FX graphs Dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


#: Why graphs that torch.compile compiled while the model ran are refused, per situation (:func:`_refuse_new_graphs`).
_NEW_GRAPHS_REFUSED = {
    # compile: false, yet graphs were compiled: a compiled function or module that _precompiled_parts cannot see
    # (e.g. @torch.compile inside forward); their Inductor kernels would have no fusion map
    "uncompiled": "has compile: false, but torch.compile compiled {n} graph(s) while it ran (a torch.compile'd "
                  "function or module inside the model): their Inductor kernels would have no fusion map; set "
                  "compile: true (compile_scope: model) and remove the model's own torch.compile calls, or run it "
                  "without them",
    # graphs compiled inside the measured iterations: a guard that fails on every call, so the profile would time
    # tracing and compilation as if they were the model's operators
    "measured": "was recompiled {n} time(s) during the measured iterations (after warm-up): its compiled graph's "
                "guards fail on every call (e.g. forward changes a Python attribute or takes a new input shape each "
                "time), so the profile would time compilation as model work; make the forward stable under "
                "torch.compile (TORCH_LOGS=recompiles shows why), or profile it with compile: false",
}


def _refuse_new_graphs(new_graphs: int, name: str, situation: str) -> None:
    """Refuse graphs torch.compile compiled while the model ran, in a ``situation`` of :data:`_NEW_GRAPHS_REFUSED`.

    Raises:
        workloads.WorkloadError: ``new_graphs`` > 0.
    """
    if new_graphs > 0:
        raise workloads.WorkloadError(f"workload {name!r} " + _NEW_GRAPHS_REFUSED[situation].format(n=new_graphs))


def _copy(kwargs: dict) -> dict:
    """torch.compile pops keys from ``options``: each call gets its own copy."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in kwargs.items()}


def harness_settings(harness: dict) -> dict:
    """``harness`` with the schema's defaults filled in for missing keys (``seed``, ``warmup``, ``warmup_max``,
    ``steady_window``, ``steady_tolerance``, ``iterations``, ``deterministic``; ``threads`` stays absent when not given;
    workflow/schemas/config.schema.yaml),
    so a direct caller gets the workflow's warm-up rule and determinism setting.

    Raises:
        ConfigError: a key the schema does not allow (type, range, unknown name), or ``warmup_max`` below
            ``warmup`` (the cap would undercut the minimum).
    """
    import jsonschema

    from ..config import ConfigError, fill_defaults, load_schema, threads_problem

    schema = load_schema()["properties"]["harness"]
    settings = fill_defaults(dict(harness), schema)
    problem = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(settings))
    if problem is not None:
        where = ".".join(str(p) for p in problem.absolute_path)
        raise ConfigError(f"invalid harness settings{' at harness.' + where if where else ''}: {problem.message}")
    if settings["warmup_max"] < settings["warmup"]:
        raise ConfigError(f"harness.warmup_max ({settings['warmup_max']}) is below harness.warmup "
                          f"({settings['warmup']}); raise warmup_max or lower warmup")
    problem = threads_problem(settings.get("threads"))
    if problem:
        raise ConfigError(f"invalid harness settings at harness.threads: {problem}")
    return settings


def apply_threads(threads: int | None) -> dict:
    """Set torch's intra-op threads to ``threads`` (``harness.threads``) when given; None leaves the process's
    own count (OMP_NUM_THREADS, which Snakemake sets to the job's threads: 1 for a capture unless set-threads).
    Returns run.json's ``threads``: ``{"count", "requested", "source"}``."""
    if threads:
        torch.set_num_threads(int(threads))
    return {"count": torch.get_num_threads(), "requested": threads,
            "source": "harness.threads" if threads else
            ("OMP_NUM_THREADS" if os.environ.get("OMP_NUM_THREADS") else "torch default")}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def steady_drift(times_s: list[float], window: int) -> float | None:
    """How far the warm-up still drifts: |median(last ``window`` times) - median(the ``window`` before)|
    / the latter (a fraction); None with fewer than 2 x ``window`` times.

    Medians of two windows, not the spread of one: on a shared machine the scheduler adds a few ms to one
    iteration in three (measured on 2 busy cores: 1 ms iterations taking 5 ms), so a (max - min) rule never
    settles, while the transient that warm-up waits out (compilation, autotuning, allocator and cache
    warm-up) moves the median."""
    if window < 1 or len(times_s) < 2 * window:
        return None
    before, last = _median(times_s[-2 * window:-window]), _median(times_s[-window:])
    return abs(last - before) / before if before > 0 else float("inf")


def warm_up_until_steady(step: Callable[[], float], minimum: int, maximum: int, window: int,
                         tolerance: float) -> dict:
    """Run ``step`` (one warm-up iteration, returning its wall time in s) at least ``minimum`` and at most
    ``maximum`` times: after the minimum, stop as soon as the iteration time is steady, i.e. the median of the
    last ``window`` times is within ``tolerance`` (a fraction) of the median of the ``window`` before them
    (:func:`steady_drift`). The first iterations compile and autotune (seconds against milliseconds), so no
    steady pair of windows contains them.

    Returns:
        ``run.json``'s ``warmup`` record: ``iterations`` (run), ``steady`` (true: the rule was met; false: the cap
        stopped warm-up first, the machine was busy or the model never settles; null: not checked, the cap allowed
        fewer than 2 x ``window`` iterations, e.g. a fixed warm-up), ``drift`` (the last pair of windows', a
        fraction; null when not checked), ``times_s`` (each iteration, s), and the rule (``minimum``, ``maximum``,
        ``window``, ``tolerance``).
    """
    times: list[float] = []
    drift = None
    while len(times) < maximum:
        times.append(float(step()))
        drift = steady_drift(times, window)
        if len(times) >= minimum and drift is not None and drift <= tolerance:
            break
    return {"iterations": len(times), "steady": None if drift is None else drift <= tolerance,
            "drift": None if drift is None else round(drift, 4), "times_s": [round(t, 6) for t in times],
            "minimum": minimum, "maximum": maximum, "window": window, "tolerance": tolerance}


def _versions(device: str) -> dict:
    info = {
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "cuda_runtime": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "device": device,
        "device_name": None,
        "driver": None,
    }
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
        smi = shutil.which("nvidia-smi")
        if smi:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=False,
            )
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
    return info


class _Changes:
    """A workload's ``changes`` (transforms/changes.py) as the harness applies them: preconditions checked first, the
    process settings, the model's preparation, the compile backend (FX rewrites, Inductor options, freezing), the
    forward context, and after warm-up the checks that they really happened (freezing prepacked the weights)."""

    def __init__(self, workload: dict, device: str, train: bool, label: str):
        self.ids = list(workload.get("changes") or [])
        self.device, self.train, self.label = device, train, label
        self._backend = None
        self._prepared: list = []
        if not self.ids:
            return
        # the workload's own compile: true is the change "compile" (what freezing or max_autotune build on)
        self.ids += ["compile"] if workload.get("compile") and "compile" not in self.ids else []
        from ..transforms import changes as vocabulary

        self.vocabulary = vocabulary
        mode = "train" if train else "infer"
        self.features = vocabulary.machine_features(device)
        problems = vocabulary.precondition_problems(self.ids, device, mode, self.features)
        if problems:
            raise workloads.WorkloadError(f"workload {label}: its changes cannot apply here: " + "; ".join(problems))
        if workload.get("compile_mode", "default") not in (None, "default"):
            raise workloads.WorkloadError(
                f"workload {label}: changes compile through their own backend, which takes Inductor options, not "
                f"compile_mode {workload['compile_mode']!r}; use compile_options (or the max_autotune change)")
        self.settings = vocabulary.compile_settings(self.ids)
        vocabulary.apply_process_settings(self.ids, device)
        if self.settings["allow_rnn"] is not None:
            import torch._dynamo.config as dynamo_config

            dynamo_config.allow_rnn = self.settings["allow_rnn"]
        if self.settings["freezing"]:
            # Inductor reads the global setting when it compiles (the first call), not torch.compile's options.
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
        self.options = {**(workload.get("compile_options") or {}), **self.settings["options"]}

    def prepare(self, model, inputs):
        if not self.ids:
            return model, inputs
        model, inputs = self.vocabulary.prepare(model, tuple(inputs), self.ids, self.device)
        self._prepared = self.vocabulary.prepared_rewrites(model)
        return model, inputs

    def backend(self, compiled: bool):
        """The torch.compile backend (None: the workload's own torch.compile settings, or eager)."""
        if not self.ids or not (compiled or self.settings["rewrites"]):
            return None
        if self._backend is None:
            self._backend = self.vocabulary.rewrite_backend(
                self.ids, inner="inductor" if compiled else "eager", options=self.options)
        return self._backend

    def forward_context(self):
        return self.vocabulary.forward_context(self.ids, self.device) if self.ids else contextlib.nullcontext()

    def check(self, model) -> dict:
        """After warm-up: that freezing froze (raises FreezingNotApplied, a WorkloadError, naming the change);
        with int8_dynamic, what the int8 precondition was read from (``native_int8_source``: the CPU flags, or
        ``forced by OPPROF_FORCE_INT8=...`` where it was forced)."""
        checks: dict = {}
        if self.ids and "int8_dynamic" in self.ids:
            checks["int8_dynamic"] = {"native_int8": self.features.get("native_int8"),
                                      "native_int8_source": self.features.get("native_int8_source")}
        if not self.ids or not self.settings["freezing"]:
            return checks
        try:
            checks["freezing"] = self.vocabulary.freezing_applied(self._backend, model, self.device)
        except workloads.WorkloadError as exc:
            raise workloads.WorkloadError(f"workload {self.label}: {exc}") from None
        return checks

    def rewrites(self) -> list[dict]:
        return self._prepared + (list(self._backend.rewrites) if self._backend is not None else [])


def run_capture(
    workload: dict,
    harness: dict,
    device: str,
    trace_path: Path | None,
    layers_path: Path,
    run_path: Path,
    inductor_dir: Path | None = None,
    profiler: str = "torch",
    workload_name: str | None = None,
    record: dict | None = None,
    shapes_path: Path | None = None,
    window_shapes: bool = False,
) -> dict:
    """Build the workload and run warm-up + measured iterations, recording what was run.

    Args:
        workload: the workload's config slice (``kind``, sizes, ``compile``, ``mode``).
        harness: ``{"seed", "warmup", "warmup_max", "steady_window", "steady_tolerance", "iterations",
            "deterministic", "threads"}`` (missing keys take the schema's defaults, :func:`harness_settings`): warm-up runs at
            least ``warmup`` iterations, then until steady (:func:`warm_up_until_steady`), at most ``warmup_max``;
            ``deterministic`` (default false) forces deterministic algorithms (:func:`_seed_everything`), else the
            process's own settings stay.
        device: ``cpu`` or ``cuda`` (already resolved).
        trace_path: where to write the gzipped Kineto trace (``profiler == "torch"``).
        layers_path: ``layers.json``: ``[{"path", "class", "param_shapes", "found_by", "calls"}]`` in execution
            order (``found_by``: the container and group that made it a layer, :func:`workloads.find_layers`).
        run_path: ``run.json``: versions, device, config slice, timings, NVTX backend.
        inductor_dir: TORCH_COMPILE_DEBUG root for compiled workloads (debug artifacts + provenance).
        workload_name: the workload's name in the config (for error messages; default: its kind).
        profiler: one of :data:`PROFILERS`:
            ``torch``: torch.profiler around the measured iterations, written to ``trace_path``
            (gzipped Chrome trace); on CUDA ``run.json`` gets ``measured_kernels``, the number of kernel
            records (``cat: kernel``) in the trace, i.e. the kernels of the measured window.
            ``cuda_profiler_api``: the measured iterations are bracketed by ``torch.cuda.profiler.start()``
            / ``stop()`` (``cudaProfilerStart``/``cudaProfilerStop``, after a device synchronize), so
            ``nsys profile --capture-range=cudaProfilerApi`` and ``ncu --profile-from-start off`` record
            exactly the measured iterations; on CUDA the iterations also run under
            ``torch.autograd.profiler.emit_nvtx(record_shapes=False)``, which writes one NVTX range per
            ATen op in the default domain (path (b) names operators from them); without shapes, whose
            recording would lengthen every op's CPU time inside the timed window (the Kineto run beside nsys
            records them, ``window_shapes``, and the work per call takes them from there); all inside the NVTX
            start/end range ``opprof.measured`` (``run.json`` ``measured_range``: what the ncu replay's include
            filter selects). No kernel count is known in-process: the timeline reader counts them
            (``measured_kernels`` null).
            ``none``: no profiler (a compile-only run).
        record: extra keys for ``run.json`` (e.g. the resolved ``timeline`` tool).
        shapes_path: ``profiler == "torch"``: after the measured window, two more iterations under their own
            torch.profiler session with ``record_shapes=True`` (CPU activity only, in iteration ranges
            ``opprof.iteration:shapes`` and ``opprof.iteration:shapes.check``), written here (gzipped): every op's input shapes for the work per operator,
            which recording them inside the measured window would slow (about 1-2 µs per op call,
            benchmarks/bench_record_shapes.py). The same session runs PyTorch's execution trace, whose record
            of the arguments record_shapes leaves out (strings, tensor lists) is added to their op events
            (:mod:`.op_inputs`). ``run.json`` ``shapes`` says where they were recorded, ``shapes_inputs`` what the
            execution trace added (``calls``, ``annotated``) or why it could not (``recorded`` false, ``reason``).
        window_shapes: record shapes (and the execution trace's inputs) inside the measured window itself (the
            Kineto run beside an nsys timeline, whose times are not the measured ones).

    Returns:
        The ``run.json`` content. Besides versions and config (``harness`` as given) it holds ``threads`` (torch's
        thread count the iterations ran with, :func:`apply_threads`), ``warmup`` (the
        warm-up actually run and whether it became steady, :func:`warm_up_until_steady`), ``machine_load`` (how
        many CPUs other processes kept busy on average during the measured iterations and the profiler's stop,
        at least :data:`LOAD_WINDOW_S` (a shorter run waits, idle, ``waited_s``), and whether that made the
        machine busy: :func:`operator_profiler.capture.machine.other_cpu_load`), ``settings``
        (:func:`_settings`: ``deterministic_requested``, cudnn.benchmark (always off), cudnn.deterministic,
        deterministic algorithms, cuBLAS workspace: identical in every run of a workload, so that the kernel
        invocation order is identical), ``measured_kernels`` and ``measured_kernels_source``, and for the
        compilation ``compile_scope`` (``model``, ``layers`` or null when eager), ``compile_mode``,
        ``compile_options``, ``compile_notes`` (list[str]) and ``layer_ranges`` (whether layer ranges were
        emitted: false for a whole-model compile, whose layers come from the FX nodes).

    Train mode (``workload["mode"] == "train"``): each iteration is one :class:`operator_profiler.capture.training.TrainStep`
    (forward + loss, backward, optimizer step + zero_grad, each in an ``opprof.phase:<phase>`` range); ``run.json``
    ``train_step`` records the optimizer, lr and loss. With layers, one forward before warm-up probes each layer
    call's input (``layers.json`` ``calls``: ``input_requires_grad``, ``input_shapes``).

    Raises:
        workloads.WorkloadError: the workload cannot be built, or its code (forward, loss, backward, optimizer)
            raises: one line naming the user's file:line and the phase, the traceback in ``traceback_text``; the
            factory returned an already compiled model, or torch.compile compiled graphs under ``compile: false``;
            bad ``compile_mode``/``compile_options``.
        DeviceUnavailable: ``device`` is ``cuda`` and torch sees no CUDA GPU.
    """
    if profiler not in PROFILERS:
        raise ValueError(f"unknown profiler {profiler!r} (expected one of {', '.join(PROFILERS)})")
    device = resolve_device(device)
    layers_path = Path(layers_path) if layers_path is not None else None
    run_path = Path(run_path)
    trace_path = Path(trace_path) if trace_path is not None else None
    inductor_dir = Path(inductor_dir) if inductor_dir is not None else None
    given_harness, harness = harness, harness_settings(harness)
    threads = apply_threads(harness.get("threads"))
    _seed_everything(harness["seed"], device, harness["deterministic"])
    compiled = bool(workload.get("compile", False))
    if compiled:
        _configure_inductor(inductor_dir, device)
    dev = torch.device(device)
    model, inputs = workloads.build_workload(workload, dev)
    hf_model = None
    if workload.get("kind") == "transformers":  # what the config resolved to: class, model type, attention, inputs
        from . import hf

        hf_model = {**hf.describe(model), "transformers": __import__("transformers").__version__}
    model_cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
    torch.backends.cudnn.benchmark = False  # off whatever the factory set (_seed_everything says why)
    model, compile_notes = _unwrap_precompiled(model, workload, workload_name or workload.get("kind"))
    train = workload.get("mode", "inference") == "train"
    model.train(train)
    label = repr(workload_name or workload.get("kind"))
    changes = _Changes(workload, device, train, label)
    model, inputs = changes.prepare(model, inputs)
    layers = workloads.find_layers(model)
    trainer: training.TrainStep | None = None

    def user_code(what: str, call: Callable[[], None]) -> None:
        """Run the model's code; an exception of the user's code becomes a one-line WorkloadError naming the
        user's file:line (errors.from_user_exception), with its traceback kept for the job's log."""
        try:
            call()
        except workloads.WorkloadError:
            raise
        except Exception as exc:
            phase = f" ({trainer.phase})" if trainer is not None and trainer.phase else ""
            raise from_user_exception(exc, f"workload {label}", workloads.LIBRARY_DIRS, f"{what}{phase}") from exc

    layer_inputs: dict = {}
    if layers and not hasattr(model, "_orig_mod"):  # an already-compiled model: no eager probe
        def probe() -> None:
            layer_inputs.update(workloads.probe_layer_inputs(model, inputs, layers, grad=train))

        user_code("its first forward (probing the layers' inputs)", probe)

    emitter = _RangeEmitter(use_nvtx=device == "cuda")
    layer_ranges = not compiled or (workload.get("compile_scope", "model") == "layers" and bool(layers))
    if not compiled and changes.backend(False) is not None:
        layer_ranges = False  # FX rewrites trace the whole eager model (Dynamo, eager inner backend): no hooks in it
    if layer_ranges:  # never inside a whole-model compiled region (module docstring)
        _install_layer_ranges(model, layers, emitter)
    try:
        compile_record = _compile(model, layers, workload, emitter, changes.backend(compiled)) if compiled else {
            "compile_scope": None, "compile_mode": None, "compile_options": None}
        if not compiled and changes.backend(False) is not None:  # FX rewrites on the eager model
            compile_record = {**_compile(model, layers, {**workload, "compile_options": {}, "compile_mode": None},
                                         emitter, changes.backend(False)), "compile_scope": None}
    except workloads.WorkloadError as exc:  # name the workload: several fail in one run with -k
        raise workloads.WorkloadError(f"workload {label}: {exc}") from None
    if train:
        trainer = training.TrainStep(model, model, inputs, workload, emitter)

    def step() -> None:
        with changes.forward_context():
            if trainer is not None:
                trainer()
            else:
                with torch.no_grad():
                    model(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()

    def run_step(what: str) -> None:
        user_code(what, step)

    def timed_warmup_step() -> float:
        start = time.perf_counter()
        run_step("warm-up")
        return time.perf_counter() - start

    t0 = time.perf_counter()
    graphs_before = _dynamo_graphs()
    # compile + autotune happen here, outside the window; then until the iteration times settle
    warmup = warm_up_until_steady(timed_warmup_step, harness["warmup"], harness["warmup_max"],
                                  harness["steady_window"], harness["steady_tolerance"])
    warmup_s = time.perf_counter() - t0
    change_checks = changes.check(model)
    if not compiled and changes.backend(False) is None:
        _refuse_new_graphs(_dynamo_graphs() - graphs_before, workload_name or workload.get("kind"), "uncompiled")

    graphs_warm = _dynamo_graphs()

    load_start: dict = {}
    machine_load: dict = {}

    def measured_iterations() -> None:
        load_start.update(machine.load_window_start())
        for i in range(harness["iterations"]):
            with emitter.range(f"{ITERATION_PREFIX}{i}"):
                run_step(f"measured iteration {i}")

    def measure_load() -> None:
        """The other processes' load over the measured iterations and the profiler's stop, waiting (idle) until
        LOAD_WINDOW_S have passed after a shorter run: a figure over a few ms would say nothing."""
        waited = max(0.0, LOAD_WINDOW_S - (time.perf_counter() - load_start["wall"]))
        time.sleep(waited)
        machine_load.update(machine.other_cpu_load(load_start, torch.get_num_threads()), waited_s=round(waited, 3))

    measured_kernels: int | None = None
    window_inputs = shapes_inputs = None
    kernels_source: str | None = None
    measured_range: dict | None = None
    t0 = time.perf_counter()
    if profiler == "torch":
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        assert trace_path is not None
        # where shapes are recorded, so are the arguments record_shapes leaves out (strings, tensor lists:
        # op_inputs); in the measured window only where it records shapes anyway (the Kineto run beside nsys)
        with (op_inputs.execution_trace(Path(trace_path)) if window_shapes
              else contextlib.nullcontext(None)) as window_inputs:
            with profile(activities=activities, record_shapes=window_shapes,
                         execution_trace_observer=window_inputs.observer if window_inputs else None) as prof:
                measured_iterations()
        measure_load()
        kernel_records = _export_gzipped_trace(prof, trace_path, window_inputs)
        if shapes_path is not None:
            with op_inputs.execution_trace(Path(shapes_path)) as shapes_inputs:
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                             execution_trace_observer=shapes_inputs.observer) as shapes_prof:
                    # twice: shapes that differ between the two show a model whose shapes change between iterations
                    for suffix in ("", SHAPES_CHECK_SUFFIX):
                        with emitter.range(f"{ITERATION_PREFIX}{SHAPES_ITERATION}{suffix}"):
                            run_step("shapes iteration")
            _export_gzipped_trace(shapes_prof, Path(shapes_path), shapes_inputs)
        if device == "cuda":
            measured_kernels, kernels_source = kernel_records, "torch.profiler kernel records (cat kernel)"
    elif profiler == "cuda_profiler_api":
        with cuda_profiler_range(nvtx_ops=device == "cuda"):
            measured_iterations()
        measure_load()
        kernels_source = "counted by the timeline reader (nsys capture range)"
        measured_range = measured_range_record()
    else:  # none, e.g. compile_artifacts (debug output alone): only the compilation matters
        measured_iterations()
        measure_load()
    measured_s = time.perf_counter() - t0 - machine_load.get("waited_s", 0.0)  # not the wait for the load figure
    if compiled:
        _refuse_new_graphs(_dynamo_graphs() - graphs_warm, workload_name or workload.get("kind"), "measured")

    if layers_path is not None:
        layers_path.parent.mkdir(parents=True, exist_ok=True)
        layers_path.write_text(
            json.dumps(
                [{"path": l.path, "class": l.cls, "param_shapes": l.param_shapes, "found_by": l.found_by,
                  "calls": layer_inputs.get(l.path)} for l in layers],
                indent=1,
            )
            + "\n"
        )
    run = {
        "versions": _versions(device),
        "workload": workload,
        "transformers_model": hf_model,
        "harness": given_harness,
        "threads": threads,
        "compiled": compiled,
        **compile_record,
        "compile_notes": compile_notes,
        "changes": changes.ids,
        "change_checks": change_checks,
        "rewrites": changes.rewrites(),
        "layer_ranges": layer_ranges and bool(layers),
        "mode": "train" if train else "inference",
        "train_step": trainer.describe() if trainer is not None else None,
        "layers": len(layers),
        "nvtx": emitter.nvtx_backend,
        "profiler": profiler,
        "warmup": warmup,
        "warmup_s": round(warmup_s, 3),
        "measured_s": round(measured_s, 3),
        "machine_load": machine_load,
        "settings": _settings(harness["deterministic"], model_cudnn_benchmark),
        "measured_kernels": measured_kernels,
        "measured_kernels_source": kernels_source,
        "measured_range": measured_range,
        "shapes": ("measured window" if window_shapes else
                   f"one iteration after the measured window ({Path(shapes_path).name})" if shapes_path is not None
                   and profiler == "torch" else None),
        "shapes_inputs": (window_inputs or shapes_inputs).summary if (window_inputs or shapes_inputs) else None,
        **(record or {}),
    }
    run_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_path.with_name(run_path.name + ".partial")
    tmp.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, run_path)
    return run


@contextlib.contextmanager
def cuda_profiler_range(nvtx_ops: bool = True, measured_range: bool = True) -> Iterator[None]:
    """The measured window for tools that honour the CUDA profiler API.

    Synchronizes the device, calls ``torch.cuda.profiler.start()`` (``cudaProfilerStart``), opens the NVTX
    start/end range :data:`~operator_profiler.naming.MEASURED_RANGE` in domain ``opprof`` when ``measured_range``,
    runs the block (under ``torch.autograd.profiler.emit_nvtx(record_shapes=False)`` when ``nvtx_ops``: one NVTX
    range per ATen op, default domain, ``aten::mm, seq = N, op_id = M``; no ``sizes``: recording them would add CPU
    time to every op call inside the window, widening the CPU gaps the timeline measures, and the work per call
    takes its shapes from the Kineto run, :func:`operator_profiler.work.assign.kernel_work`), synchronizes again,
    closes the range and calls ``torch.cuda.profiler.stop()``
    (``cudaProfilerStop``), also when the block raises. ``nsys profile --capture-range=cudaProfilerApi
    --capture-range-end=stop`` then records exactly the block, and so does ``ncu --profile-from-start off``
    (CUDA runtime API, Profiler Control: "Enables profile collection by the active profiling tool for the
    current context"; Nsight Systems and Nsight Compute CLI guides). The start/end range is what the ncu replay
    filters on (``--nvtx --nvtx-include opprof@opprof.measured``): a start/end range is process-wide, so it
    covers the autograd thread's launches too, and ``--launch-skip`` then counts only launches inside it
    (docs/gpu.md, "The window").
    """
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    torch.cuda.profiler.start()
    measured = _start_measured_range() if measured_range else None
    try:
        if nvtx_ops:
            with torch.autograd.profiler.emit_nvtx(record_shapes=False):
                yield
        else:
            yield
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    finally:
        if measured is not None:
            measured()
        torch.cuda.profiler.stop()


def _start_measured_range() -> Callable[[], None]:
    """Open the NVTX start/end range :data:`MEASURED_RANGE` in our domain (NVIDIA's ``nvtx`` package; without it
    ``torch.cuda.nvtx.range_start``, default domain); returns the function that ends it."""
    try:
        import nvtx  # type: ignore[import-not-found]

        handle = nvtx.start_range(MEASURED_RANGE, domain=NVTX_DOMAIN)
        return lambda: nvtx.end_range(handle)
    except ImportError:
        handle = torch.cuda.nvtx.range_start(MEASURED_RANGE)
        return lambda: torch.cuda.nvtx.range_end(handle)


def measured_range_record() -> dict:
    """``run.json`` ``measured_range``: the NVTX start/end range around the measured window, as ncu's include
    filter spells it (:func:`~operator_profiler.naming.measured_range_include`)."""
    from ..naming import measured_range_include

    include = measured_range_include()
    return {"name": MEASURED_RANGE, "domain": NVTX_DOMAIN if "@" in include else "default", "kind": "start/end",
            "ncu_include": include}


def _export_gzipped_trace(prof, trace_path: Path, inputs: "op_inputs.Recording | None" = None) -> int:
    """Write the gzipped Chrome trace; return its number of kernel records (``"cat": "kernel"``). ``inputs``:
    the session's execution trace, whose recorded inputs are added to their op events (:func:`op_inputs.annotate`;
    ``inputs.summary["annotated"]`` counts them)."""
    import gzip

    trace_path.parent.mkdir(parents=True, exist_ok=True)
    raw = trace_path.with_name(trace_path.name + ".tmp.json")
    prof.export_chrome_trace(str(raw))
    kernels = 0
    with open(raw, "rb") as src, gzip.open(trace_path, "wb", compresslevel=6) as dst:
        if inputs is not None and inputs.inputs:
            counts: dict = {}
            dst.writelines(op_inputs.annotate(iter(src), inputs.inputs, counts))
            inputs.summary["annotated"] = counts.get("annotated", 0)
        else:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                dst.write(chunk)
    with open(raw, "rb") as src:
        kernels = sum(1 for e in json.load(src).get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X")
    raw.unlink()
    return kernels
