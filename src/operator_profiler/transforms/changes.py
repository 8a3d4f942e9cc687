"""The optimizer's change vocabulary: what each change is, its preconditions, and how it is applied to a model.

A change is a setting (autocast, TF32, memory format), a compiler option (torch.compile, Inductor options,
freezing, Dynamo's RNN handling) or an FX rewrite (:mod:`.passes`). Changes apply in the canonical order of
:data:`CHANGES` whatever order they are given in. The pieces are separate for the profiling harness
(:func:`compile_settings`, :func:`prepare`, :func:`forward_context`, :func:`apply_process_settings`,
:func:`rewrite_backend`, :func:`freezing_applied`); :func:`build_variant` composes them for the speed measurement.
Details and the freezing pitfall: docs/optimize.md.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import WorkloadError
from . import passes
from .vocabulary import CHANGES, Change, canonical, machine_features, precondition_problems  # noqa: F401

__all__ = [
    "CHANGES", "Change", "FreezingNotApplied", "RewriteBackend", "Variant", "apply_process_settings",
    "build_variant", "canonical", "compile_settings", "forward_context", "freezing_applied", "machine_features",
    "precondition_problems", "prepare", "rewrite_backend",
]


#: FX rewrites run inside the torch.compile backend on Dynamo's graph (conv_bn_fold runs in :func:`prepare`:
#: Dynamo's graph holds parameters as inputs, so a fold needs the module graph of a symbolic trace).
_BACKEND_PASSES: dict[str, Callable[[torch.fx.GraphModule], list[dict]]] = {
    "sdpa_rewrite": passes.attention_to_sdpa,
    "cast_pair_cancel": passes.cancel_cast_pairs,
}


class FreezingNotApplied(WorkloadError):
    """A variant asked for Inductor freezing and the compiled graphs were not frozen (the message says why)."""


# --------------------------------------------------------------------------------------------- preconditions


def _check_preconditions(changes: Iterable[str], device: str, mode: str, features: dict | None) -> None:
    problems = precondition_problems(changes, device, mode, features or machine_features(device))
    if problems:
        raise WorkloadError("cannot apply the changes: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------ pieces to apply


def compile_settings(changes: Iterable[str]) -> dict:
    """How to compile: ``compile`` (torch.compile with Inductor), ``options`` (Inductor options for
    ``torch.compile(options=...)`` / ``compile_fx(config_patches=...)``), ``freezing`` (Inductor freezing: set
    ``torch._inductor.config.freezing`` around the first call, under torch.no_grad, where Dynamo traces and
    Inductor compiles; check with :func:`freezing_applied`), ``allow_rnn``
    (``torch._dynamo.config.allow_rnn`` to set while Dynamo traces; None: leave as is), ``rewrites`` (the FX
    rewrites the backend runs), ``needs_backend`` (torch.compile is needed: compile or a backend rewrite; without
    compile the backend's inner compiler is eager)."""
    chosen = set(canonical(changes))
    options: dict[str, Any] = {}
    if "max_autotune" in chosen:
        options["max_autotune"] = True
    if "cuda_graphs" in chosen:
        options["triton.cudagraphs"] = True
    rewrites = [c for c in CHANGES if c in chosen and c in _BACKEND_PASSES]
    return {
        "compile": "compile" in chosen,
        "options": options,
        "freezing": "freezing" in chosen,
        "allow_rnn": False if "keep_rnn_library" in chosen else None,
        "rewrites": rewrites,
        "needs_backend": "compile" in chosen or bool(rewrites),
    }


def apply_process_settings(changes: Iterable[str], device: str) -> dict:
    """Process-wide settings: ``tf32`` sets ``torch.backends.cuda.matmul.allow_tf32`` and
    ``torch.backends.cudnn.allow_tf32``. Returns the settings as they were before (for :func:`restore_process_settings`)."""
    before = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
              "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32}
    if "tf32" in set(changes) and device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return before


def restore_process_settings(before: dict) -> None:
    """Undo :func:`apply_process_settings` (its return value)."""
    torch.backends.cuda.matmul.allow_tf32 = before["cuda.matmul.allow_tf32"]
    torch.backends.cudnn.allow_tf32 = before["cudnn.allow_tf32"]


def forward_context(changes: Iterable[str], device: str) -> contextlib.AbstractContextManager:
    """The context of each forward: ``torch.autocast(device, torch.bfloat16)`` with bf16_autocast, else none."""
    if "bf16_autocast" in set(changes):
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _to_channels_last(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_channels_last(v) for v in value)
    return value


def prepare(model: nn.Module, inputs: tuple, changes: Iterable[str], device: str) -> tuple[nn.Module, tuple]:
    """Rewrites that act on the module, before compilation: conv_bn_fold (a ``torch.fx.symbolic_trace`` of the
    model, :func:`passes.fold_conv_bn`; the model must be in eval mode; its records are in
    :func:`prepared_rewrites`), int8_dynamic (:func:`quantize_linear_dynamic`, eval mode; one record per quantized
    layer), then channels_last (model and 4-D floating inputs). The model is changed in place
    or replaced (the traced GraphModule keeps the submodules' qualified names); deep-copy it first to keep it.
    Raises WorkloadError when the model cannot be traced or is in training mode."""
    chosen = set(canonical(changes))
    records: list[dict] = []
    if "conv_bn_fold" in chosen:
        if model.training:
            raise WorkloadError("conv_bn_fold needs the model in eval mode (BatchNorm's running statistics)")
        try:
            traced = torch.fx.symbolic_trace(model)
        except Exception as exc:  # any tracing failure (control flow on values...): fold inside traceable parts
            records, untraced = _fold_in_subtrees(model)
            if not records:
                raise WorkloadError(f"conv_bn_fold: the model cannot be FX-traced ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''}), and no part of it holding a "
                                    "BatchNorm2d can"
                                    + (f" ({', '.join(untraced[:3])})" if untraced else "")
                                    + "; drop the change (freezing folds conv-BN inside Inductor)") from exc
        else:
            traced.eval()
            records = passes.fold_conv_bn(traced)
            model = traced
    if "int8_dynamic" in chosen:
        if model.training:
            raise WorkloadError("int8_dynamic needs the model in eval mode (inference: quantized layers do not train)")
        model, quantized = quantize_linear_dynamic(model)
        records += quantized
    if "channels_last" in chosen:
        model = model.to(memory_format=torch.channels_last)
        inputs = _to_channels_last(tuple(inputs))
    try:
        model._opprof_rewrites = records  # type: ignore[attr-defined]
    except AttributeError:  # pragma: no cover - a module refusing attributes
        pass
    return model, tuple(inputs)


#: The operator a quantized layer runs instead of the Linear's (aten::linear / addmm): fbgemm's dynamic linear.
INT8_LINEAR_OP = "quantized::linear_dynamic"


def quantize_linear_dynamic(model: nn.Module) -> tuple[nn.Module, list[dict]]:
    """int8_dynamic: every ``nn.Linear`` of ``model`` (in eval mode) becomes a dynamically quantized Linear
    (``torch.ao.quantization.quantize_dynamic``, qint8 weights per tensor, each call quantizes its activations
    to uint8 with the range it sees; the x86/fbgemm engine), in place. Chosen by measurement over PT2E with
    Inductor's X86InductorQuantizer (docs/optimize.md, "int8_dynamic"). torch.ao's deprecation warning is
    silenced here: the API is the one torch 2.13 still ships (PT2E moved to torchao). Returns the model and one
    record per quantized layer (``pass`` "quantize_dynamic", ``module_path``, ``new_op``, ``replaced_ops``); a
    model without nn.Linear is refused (WorkloadError: nothing to quantize)."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    converted = transposed_linears_to_linear(model)
    linears = [path for path, module in model.named_modules() if type(module) is nn.Linear]
    if not linears:
        raise WorkloadError("int8_dynamic: the model has no nn.Linear layer (nor a Hugging Face Conv1D) to quantize")
    engine = torch.backends.quantized.engine
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        model = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model, [{"pass": "quantize_dynamic", "module_path": path, "new_node": path, "new_op": INT8_LINEAR_OP,
                    "replaced_ops": ["aten::addmm" if path in converted else "aten::linear"], "engine": engine}
                   for path in linears]


def _is_transposed_linear(module: nn.Module) -> bool:
    """A Hugging Face ``Conv1D`` (GPT-2, GPT, ...): ``addmm(bias, x, weight)`` with ``weight`` of shape
    (in, out) = (``nx``, ``nf``), a Linear with its weight transposed. Recognised by class name and shape, so
    transformers need not be importable."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and tuple(weight.shape) == (getattr(module, "nx", None), getattr(module, "nf", None))
            and isinstance(getattr(module, "bias", None), torch.Tensor))


def transposed_linears_to_linear(model: nn.Module) -> set[str]:
    """Replaces each Hugging Face ``Conv1D`` of ``model`` by the ``nn.Linear`` it computes (weight transposed,
    same bias; exact in float32: the same products and sums), in place, so int8_dynamic quantizes GPT-2's
    projections and not only its LM head. Returns the module paths replaced."""
    replaced = set()
    for path, module in list(model.named_modules()):
        if not path or not _is_transposed_linear(module):
            continue
        linear = nn.Linear(module.nx, module.nf, device=module.weight.device, dtype=module.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(module.weight.t())
            linear.bias.copy_(module.bias)
        parent_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent_path) if parent_path else model, name, linear)
        replaced.add(path)
    return replaced


def quantized_linear_count(model: nn.Module) -> int:
    """How many layers of ``model`` are dynamically quantized Linears (``torch.ao.nn.quantized.dynamic.Linear``)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    return sum(1 for m in model.modules() if isinstance(m, DynamicQuantizedLinear))


def _fold_in_subtrees(model: nn.Module) -> tuple[list[dict], list[str]]:
    """conv_bn_fold on a model that cannot be FX-traced whole (a Hugging Face model's forward builds its output
    container from Python control flow): each module with a BatchNorm2d child (HF ResNet's ``ResNetConvLayer`` and
    ``ResNetShortCut``: conv, norm, activation) is traced on its own with ``torch.fx.symbolic_trace``, folded
    (:func:`passes.fold_conv_bn`, its conditions inside that module: a conv whose output leaves it is never folded)
    and put back in place (a GraphModule of the same class name and qualified names), so the containers above it,
    and the layers found in them, stay. Returns the records (``module_path``, ``folded_module`` and ``subtree``
    qualified from the root) and the modules holding a BatchNorm2d that could not be traced."""
    records: list[dict] = []
    untraced: list[str] = []
    parents = []
    for path, module in model.named_modules():
        if any(isinstance(c, nn.BatchNorm2d) for c in module.children()) and path:
            parents.append(path)
    for path in parents:
        child = model.get_submodule(path)
        try:
            traced = torch.fx.symbolic_trace(child)
        except Exception:  # noqa: BLE001 - control flow on values, proxies iterated...
            untraced.append(path)
            continue
        traced.train(child.training)
        found = passes.fold_conv_bn(traced)
        for record in found:
            record["module_path"] = f"{path}.{record['module_path']}"
            if "folded_module" in record:
                record["folded_module"] = f"{path}.{record['folded_module']}"
            record["subtree"] = path
        if any("new_node" in r for r in found):
            passes._set_submodule(model, path, traced)
        records += found
    return records, untraced


def prepared_rewrites(model: nn.Module) -> list[dict]:
    """The rewrite records :func:`prepare` made on ``model``."""
    return list(getattr(model, "_opprof_rewrites", []))


# ------------------------------------------------------------------------------------------ the backend


def _prepack_counters() -> int:
    """Inductor's count of weight-prepacking pattern matches (``mkldnn_*_weight_pack_matcher_count`` in
    ``torch._dynamo.utils.counters["inductor"]``): they run only on a frozen graph (weights as constants)."""
    from torch._dynamo.utils import counters

    return sum(v for k, v in counters["inductor"].items() if "weight_pack" in k and k.endswith("_count"))


class RewriteBackend:
    """A torch.compile backend: runs the requested FX passes on Dynamo's graph, then hands it to ``inner``
    ("inductor": ``compile_fx`` with ``options``; "eager": the graph's own forward), recording per graph the
    evidence :func:`freezing_applied` reads: ``freezing_on`` (Inductor's freezing condition, the setting on and
    grad mode off, when the backend is called: the same call in which Dynamo traced, and Dynamo reads it to make
    parameters graph constants), ``param_inputs`` / ``param_constants`` (parameters left as graph inputs /
    made ``get_attr`` constants by Dynamo), ``prepacked`` (weight-prepack matches Inductor ran). The backend sets
    no freezing setting itself: set around compile_fx only, it freezes nothing (parameters are already graph
    inputs), and the evidence would lie; ``freezing`` only says it was asked for. ``rewrites``: the pass records
    of every graph; ``graphs``: one dict per compiled graph (``targets``: the names of the functions/methods its
    nodes call, after the passes)."""

    def __init__(self, changes: Iterable[str], inner: str = "inductor", options: dict | None = None,
                 freezing: bool = False):
        if inner not in ("inductor", "eager"):
            raise ValueError(f"inner backend {inner!r}: 'inductor' or 'eager'")
        chosen = set(canonical(changes))
        self.passes = [(c, _BACKEND_PASSES[c]) for c in CHANGES if c in chosen and c in _BACKEND_PASSES]
        self.inner = inner
        self.options = dict(options or {})
        self.freezing = freezing
        self.rewrites: list[dict] = []
        self.graphs: list[dict] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graph_index = len(self.graphs)
        for change_id, fx_pass in self.passes:
            for record in fx_pass(gm):
                self.rewrites.append({**record, "change": change_id, "graph": graph_index})
        info: dict[str, Any] = {"graph": graph_index, "inner": self.inner, "targets": sorted({
            n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
            for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")})}
        self.graphs.append(info)
        if self.inner == "eager":
            return gm.forward
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        info["freezing_on"] = bool(inductor_config.freezing) and not torch.is_grad_enabled()
        # Dynamo names a parameter input after its source, L['self']..._parameters['weight'] -> "..._parameters_..."
        info["param_inputs"] = sum(1 for n in gm.graph.nodes if n.op == "placeholder" and "_parameters_" in n.name)
        info["param_constants"] = sum(1 for n in gm.graph.nodes if n.op == "get_attr")
        before = _prepack_counters()
        compiled = compile_fx(gm, example_inputs, config_patches=self.options or None)
        info["prepacked"] = _prepack_counters() - before
        return compiled


def rewrite_backend(changes: Iterable[str], inner: str = "inductor", options: dict | None = None,
                    freezing: bool | None = None) -> RewriteBackend:
    """The torch.compile backend for ``changes`` (:class:`RewriteBackend`); ``options`` and ``freezing`` default
    to :func:`compile_settings`'s."""
    settings = compile_settings(changes)
    return RewriteBackend(changes, inner, settings["options"] if options is None else options,
                          settings["freezing"] if freezing is None else freezing)


def _has_prepackable(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) for m in model.modules())


def freezing_applied(backend: RewriteBackend, model: nn.Module | None = None, device: str = "cpu") -> dict:
    """Check that Inductor froze every graph ``backend`` compiled; returns ``{"graphs": N, "frozen": N,
    "param_constants": P, "prepacked": M}``. Raises :class:`FreezingNotApplied` naming the change when no graph
    was compiled yet; when a graph was traced and compiled without freezing (``torch._inductor.config.freezing``
    off or grad mode on at the first call; ``options={"freezing": True}`` alone leaves it off); when a graph still
    takes parameters as inputs; or, on CPU, when ``model`` has Linear/Conv layers and no weight was prepacked
    (the oneDNN/MKL prepack passes run only on frozen weights)."""
    compiled = [g for g in backend.graphs if g.get("inner") == "inductor"]
    if not compiled:
        raise FreezingNotApplied("freezing: no graph was compiled by Inductor (run the variant once first)")
    unfrozen = [g["graph"] for g in compiled if not g.get("freezing_on")]
    if unfrozen:
        raise FreezingNotApplied(
            f"freezing: graph(s) {unfrozen} compiled without Inductor freezing (torch._inductor.config.freezing "
            "must be on and grad mode off when Dynamo traces, i.e. around the first call under torch.no_grad; "
            "torch.compile(options={'freezing': True}) does not do it)")
    inputs = [g["graph"] for g in compiled if g.get("param_inputs")]
    if inputs:
        raise FreezingNotApplied(f"freezing: graph(s) {inputs} still take parameters as inputs: not frozen")
    prepacked = sum(g.get("prepacked", 0) for g in compiled)
    if device == "cpu" and model is not None and _has_prepackable(model) and prepacked == 0:
        raise FreezingNotApplied("freezing: the model has Linear/Conv layers but Inductor prepacked no weight "
                                 "(mkldnn weight-pack passes did not run: the weights were not frozen)")
    return {"graphs": len(compiled), "frozen": len(compiled),
            "param_constants": sum(g.get("param_constants", 0) for g in compiled), "prepacked": prepacked}


# ------------------------------------------------------------------------------------------------ variants

# How many freezing variants' calls are running (nested calls count once each); while it is above 0, every
# compile Dynamo starts runs with torch._inductor.config.freezing on (restored when the compile ends).
_FREEZING_CALLS = [0]
_FREEZING_SAVED: list = []


def _freezing_call_done() -> None:
    _FREEZING_CALLS[0] -= 1


def _freezing_compile_start(_args: Any = None) -> None:
    if _FREEZING_CALLS[0] > 0:
        from torch._inductor import config as inductor_config

        _FREEZING_SAVED.append(inductor_config.freezing)
        inductor_config.freezing = True


def _freezing_compile_end(_args: Any = None) -> None:
    if _FREEZING_SAVED:
        from torch._inductor import config as inductor_config

        inductor_config.freezing = _FREEZING_SAVED.pop()


def _hook_freezing() -> None:
    """Register the compile-start/end callbacks that switch Inductor freezing on for the compiles a freezing
    variant's call starts: at each such call, since torch._dynamo.reset() clears Dynamo's callbacks (a list
    scan of a few entries, far cheaper than a config patch)."""
    from torch._dynamo.callback import callback_handler

    if _freezing_compile_start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_freezing_compile_start)
    if _freezing_compile_end not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_freezing_compile_end)



@dataclass
class Variant:
    """A model with changes applied, ready to time. ``name``: "+".join(changes) or "fp32_eager"; ``run()``: one
    forward (under torch.no_grad in mode infer, in the forward context), returns the output; ``checks``: what was
    verified (``{"freezing": {...}}``), filled at the first run and after any recompile; ``rewrites``: the FX
    pass records."""

    name: str
    changes: tuple[str, ...]
    device: str
    mode: str
    model: nn.Module
    inputs: tuple
    settings: dict
    backend: RewriteBackend | None = None
    checks: dict = field(default_factory=dict)
    prepare_rewrites: list = field(default_factory=list)
    _runner: Callable | None = None
    _calls: int = 0
    _checked_graphs: int = 0

    @property
    def rewrites(self) -> list[dict]:
        return self.prepare_rewrites + (self.backend.rewrites if self.backend else [])

    def _contexts(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.mode != "train":
            stack.enter_context(torch.no_grad())
        # Dynamo reads allow_rnn and Inductor's freezing setting when it traces (the first call, a recompile). A
        # config patch costs ~60-100 us a call, so allow_rnn is patched only when the process setting differs,
        # and freezing is not patched per call: the call only marks that it wants freezing (a plain counter) and
        # Dynamo's compile-start callback switches the setting on for whatever Dynamo compiles during the call:
        # the first call and any later recompile alike. Later compiles do happen: variants in one process share
        # Dynamo's cache per code object (Block.forward is one code object for every variant's copy), so once a
        # variant breaks its graph (int8_dynamic breaks at each quantized Linear), another variant's call can
        # reach a frame compiled for a different model, fail its guards and compile that frame anew.
        wanted = self.settings["allow_rnn"]
        if wanted is not None:
            from torch._dynamo import config as dynamo_config

            if dynamo_config.allow_rnn != wanted:
                stack.enter_context(dynamo_config.patch(allow_rnn=wanted))
        if self.settings["freezing"]:
            _hook_freezing()
            _FREEZING_CALLS[0] += 1
            stack.callback(_freezing_call_done)
        if "tf32" in self.changes:  # a process setting, scoped to this variant's calls (variants interleave)
            stack.callback(restore_process_settings, apply_process_settings(self.changes, self.device))
        stack.enter_context(forward_context(self.changes, self.device))
        return stack

    def run(self) -> Any:
        with self._contexts():
            out = self._runner(*self.inputs)
        self._calls += 1
        if self.settings["freezing"] and len(self.backend.graphs) != self._checked_graphs:
            self.checks["freezing"] = freezing_applied(self.backend, self.model, self.device)
            self._checked_graphs = len(self.backend.graphs)
        return out

    def warm_up(self, n: int = 3) -> None:
        for _ in range(n):
            self.run()


def build_variant(model: nn.Module, inputs: tuple, changes: Iterable[str], device: str, mode: str = "infer",
                  features: dict | None = None) -> Variant:
    """Apply ``changes`` (any order; applied canonically) to a deep copy of ``model``: :func:`prepare`,
    torch.compile with :func:`rewrite_backend` (Inductor inner backend with compile, eager otherwise); each
    ``run()`` then enters the forward context and the process settings (restored after the call, so variants
    measured in one process do not leak TF32 into each other). Raises WorkloadError for unknown changes or unmet preconditions
    (:func:`precondition_problems` on ``features``, default this machine's), FreezingNotApplied at the first
    run when freezing did not happen."""
    order = canonical(changes)
    _check_preconditions(order, device, mode, features)
    settings = compile_settings(order)
    model = copy.deepcopy(model)
    model.train(mode == "train")
    model, inputs = prepare(model, tuple(inputs), order, device)
    backend = None
    runner: Callable = model
    if settings["needs_backend"]:
        backend = rewrite_backend(order, inner="inductor" if settings["compile"] else "eager")
        runner = torch.compile(model, backend=backend)
    return Variant(name="+".join(order) or "fp32_eager", changes=order, device=device, mode=mode, model=model,
                   inputs=tuple(inputs), settings=settings, backend=backend,
                   prepare_rewrites=prepared_rewrites(model), _runner=runner)
