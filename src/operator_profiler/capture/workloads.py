"""Built-in workloads and the loader for a user's own model.

A workload is ``(model, example_inputs)``: an ``nn.Module`` with random weights and a tuple of
input tensors, built from the workload's config slice (sizes only; nothing is downloaded).
Which submodules are *layers* (repeated blocks whose instances form layer classes) is found by
:func:`find_layers`, not declared per workload, so a custom model gets layer classes too.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import WorkloadError, from_user_exception

#: Folders whose frames are never "the user's code" in an error's traceback (errors.user_frame).
LIBRARY_DIRS = (os.path.dirname(torch.__file__),) + tuple(
    os.path.dirname(spec.origin) for spec in [importlib.util.find_spec("transformers")] if spec and spec.origin)

# --------------------------------------------------------------------------------------- GPT-2


class CausalSelfAttention(nn.Module):
    """GPT-2 attention: fused qkv projection, causal softmax attention, output projection."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        head = width // self.n_head
        q = q.view(batch, seq, self.n_head, head).transpose(1, 2)
        k = k.view(batch, seq, self.n_head, head).transpose(1, 2)
        v = v.view(batch, seq, self.n_head, head).transpose(1, 2)
        # Explicit attention (as in the original GPT-2): the matmul/softmax operators stay visible.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head))
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(batch, seq, width)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln_1(x)); x + mlp(ln_2(x))."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 architecture (token + position embedding, N pre-LN blocks, final LN, LM head)."""

    def __init__(self, vocab_size: int, n_positions: int, n_embd: int, n_layer: int, n_head: int):
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, n_embd),
                "wpe": nn.Embedding(n_positions, n_embd),
                "h": nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
                "ln_f": nn.LayerNorm(n_embd),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer["wte"](idx) + self.transformer["wpe"](pos)
        for block in self.transformer["h"]:
            x = block(x)
        return self.lm_head(self.transformer["ln_f"](x))


def build_gpt2(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    if cfg["n_embd"] % cfg["n_head"]:
        raise WorkloadError(
            f"gpt2: n_embd ({cfg['n_embd']}) must be a multiple of n_head ({cfg['n_head']}); "
            "fix workloads.gpt2 in the config"
        )
    if cfg["seq_len"] > cfg["n_positions"]:
        raise WorkloadError(
            f"gpt2: seq_len ({cfg['seq_len']}) exceeds n_positions ({cfg['n_positions']})"
        )
    model = GPT2(cfg["vocab_size"], cfg["n_positions"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"])
    idx = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["seq_len"]), device=device)
    return model.to(device), (idx,)


# ------------------------------------------------------------------------------ SDPA attention


class SDPABlock(nn.Module):
    """Multi-head attention block using ``F.scaled_dot_product_attention`` (pre-LN, residual)."""

    def __init__(self, d_model: int, n_head: int, causal: bool):
        super().__init__()
        self.n_head = n_head
        self.causal = causal
        self.norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm(x)).split(width, dim=-1)
        shape = (batch, seq, self.n_head, width // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return x + self.out(y.transpose(1, 2).reshape(batch, seq, width))


class SDPAStack(nn.Module):
    def __init__(self, d_model: int, n_head: int, n_block: int, causal: bool):
        super().__init__()
        self.blocks = nn.ModuleList([SDPABlock(d_model, n_head, causal) for _ in range(n_block)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build_sdpa_attention(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    if cfg["d_model"] % cfg["n_head"]:
        raise WorkloadError(
            f"sdpa_attention: d_model ({cfg['d_model']}) must be a multiple of n_head ({cfg['n_head']})"
        )
    model = SDPAStack(cfg["d_model"], cfg["n_head"], cfg["n_block"], cfg["causal"])
    x = torch.randn(cfg["batch_size"], cfg["seq_len"], cfg["d_model"], device=device)
    return model.to(device), (x,)


# ------------------------------------------------------------------------------------- LSTM


class LSTMEncoder(nn.Module):
    """Multi-layer ``nn.LSTM`` encoder with a linear head (cuDNN RNN kernels on a GPU)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, input_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out)


def build_lstm(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    model = LSTMEncoder(cfg["input_size"], cfg["hidden_size"], cfg["num_layers"])
    x = torch.randn(cfg["batch_size"], cfg["seq_len"], cfg["input_size"], device=device)
    return model.to(device), (x,)


# ------------------------------------------------------------------------------- conv blocks


class ConvBNReLU(nn.Module):
    """Conv2d (k x k, stride 1, same padding, no bias: BatchNorm's shift replaces it) -> BatchNorm2d -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class ConvStack(nn.Module):
    """A stem ConvBNReLU (in_channels -> channels), then n_block identical ConvBNReLU (channels -> channels)."""

    def __init__(self, in_channels: int, channels: int, n_block: int):
        super().__init__()
        self.stem = ConvBNReLU(in_channels, channels)
        self.blocks = nn.ModuleList([ConvBNReLU(channels, channels) for _ in range(n_block)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x


def build_conv_block(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    model = ConvStack(cfg["in_channels"], cfg["channels"], cfg["n_block"])
    x = torch.randn(cfg["batch_size"], cfg["in_channels"], cfg["image_size"], cfg["image_size"], device=device)
    return model.to(device), (x,)


# ---------------------------------------------------------------------- embedding + projection


class ProjectionBlock(nn.Module):
    """Linear (d_model -> d_model) -> ReLU."""

    def __init__(self, d_model: int):
        super().__init__()
        self.linear = nn.Linear(d_model, d_model)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.linear(x))


class EmbeddingProjection(nn.Module):
    """Embedding lookup (vocab_size x d_model), n_block ProjectionBlocks, output projection d_model -> out_features."""

    def __init__(self, vocab_size: int, d_model: int, n_block: int, out_features: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList([ProjectionBlock(d_model) for _ in range(n_block)])
        self.out = nn.Linear(d_model, out_features)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embedding(idx)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build_embedding_projection(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    model = EmbeddingProjection(cfg["vocab_size"], cfg["d_model"], cfg["n_block"], cfg["out_features"])
    idx = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["seq_len"]), device=device)
    return model.to(device), (idx,)


# -------------------------------------------------------------------------------------- MLP


class MLPBlock(nn.Module):
    """Linear (width -> expansion * width) -> GELU (exact, erf) -> Linear (back to width)."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MLPStack(nn.Module):
    def __init__(self, width: int, expansion: int, n_block: int):
        super().__init__()
        self.blocks = nn.ModuleList([MLPBlock(width, expansion * width) for _ in range(n_block)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build_mlp(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    model = MLPStack(cfg["width"], cfg["expansion"], cfg["n_block"])
    x = torch.randn(cfg["batch_size"], cfg["seq_len"], cfg["width"], device=device)
    return model.to(device), (x,)


# ------------------------------------------------------------------ depthwise-separable convs


class DepthwiseSeparableBlock(nn.Module):
    """MobileNet's block: depthwise 3x3 conv (groups = channels) -> BN -> ReLU, pointwise 1x1 conv -> BN -> ReLU
    (convs without bias: BatchNorm's shift replaces it)."""

    def __init__(self, channels: int):
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.pointwise = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.depthwise(x)))
        return self.relu(self.bn2(self.pointwise(x)))


class DepthwiseSeparableStack(nn.Module):
    def __init__(self, channels: int, n_block: int):
        super().__init__()
        self.blocks = nn.ModuleList([DepthwiseSeparableBlock(channels) for _ in range(n_block)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build_depthwise_separable(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    model = DepthwiseSeparableStack(cfg["channels"], cfg["n_block"])
    x = torch.randn(cfg["batch_size"], cfg["channels"], cfg["image_size"], cfg["image_size"], device=device)
    return model.to(device), (x,)


# ----------------------------------------------------------------------------------- custom


def load_factory(spec: str, what: str = "custom factory", key: str = "factory") -> Callable[..., Any]:
    """Resolve ``"package.module:function"`` to the callable (``what``/``key`` word the errors: the custom
    factory, or a train workload's ``loss_fn``).

    Raises:
        WorkloadError: malformed spec, module not importable, attribute missing or not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise WorkloadError(
            f"{what} {spec!r} is not of the form 'package.module:function'; "
            f"set workloads.<name>.{key} accordingly"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(
            f"{what} {spec!r}: cannot import module {module_name!r} ({exc}); "
            "install it or put its folder on PYTHONPATH"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(
            f"{what} {spec!r}: module {module_name!r} has no callable {attr!r}"
        )
    return factory


def build_custom(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    factory = load_factory(cfg["factory"])
    try:
        result = factory(**cfg.get("kwargs", {}))
    except Exception as exc:  # the user's code: one line naming its file:line, its traceback in the log
        raise from_user_exception(exc, f"custom factory {cfg['factory']!r}", LIBRARY_DIRS) from exc
    if (
        not isinstance(result, tuple)
        or len(result) != 2
        or not isinstance(result[0], nn.Module)
    ):
        raise WorkloadError(
            f"custom factory {cfg['factory']!r} must return (model: nn.Module, example_inputs: tuple), "
            f"got {type(result).__name__}"
        )
    model, inputs = result
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return model.to(device), tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)


def build_transformers(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    """A Hugging Face transformers model (``kind: transformers``): :func:`operator_profiler.capture.hf.build_transformers`."""
    from . import hf

    return hf.build_transformers(cfg, device)


BUILDERS: dict[str, Callable[[dict, torch.device], tuple[nn.Module, tuple]]] = {
    "gpt2": build_gpt2,
    "sdpa_attention": build_sdpa_attention,
    "lstm": build_lstm,
    "conv_block": build_conv_block,
    "embedding_projection": build_embedding_projection,
    "mlp": build_mlp,
    "depthwise_separable": build_depthwise_separable,
    "custom": build_custom,
    "transformers": build_transformers,
}


def build_workload(cfg: dict, device: torch.device) -> tuple[nn.Module, tuple]:
    """Build ``(model, example_inputs)`` for one workload's config slice (``cfg["kind"]`` selects)."""
    try:
        builder = BUILDERS[cfg["kind"]]
    except KeyError:
        raise WorkloadError(
            f"unknown workload kind {cfg.get('kind')!r}; choose one of {sorted(BUILDERS)}"
        ) from None
    return builder(cfg, device)


# ----------------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class LayerInstance:
    """One instance of a repeated submodule (a *layer*)."""

    path: str  # module path, e.g. "transformer.h.3"
    cls: str  # Python class name, e.g. "Block"
    param_shapes: dict[str, list[int]]  # parameter name -> shape
    # how it was found: the container and its group of identical children (layers.json ``found_by``)
    found_by: str = ""


def _param_shapes(module: nn.Module) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in module.named_parameters()}


def find_layers(model: nn.Module) -> list[LayerInstance]:
    """The layer instances of ``model``: children of an ``nn.ModuleList``/``nn.Sequential`` with at
    least two members of the same class and identical parameter shapes (GPT-2's ``transformer.h.*``).

    The outermost such container wins (blocks inside blocks are not layers of their own), so layer
    ranges never nest. No table of model families: HF's ``model.layers``, ``transformer.h``, ``encoder.layer``,
    ``vit.layers`` and a ResNet stage's ``layers`` (its first, downsampling, layer differs from the rest and stays
    out) are found alike. Each instance says how it was found (``found_by``). Returned in module (= execution) order.
    """
    layers: list[LayerInstance] = []
    claimed: list[str] = []
    for path, module in model.named_modules():
        if any(path == c or path.startswith(c + ".") for c in claimed):
            continue
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        groups: dict[tuple, list[tuple[str, nn.Module]]] = {}
        for name, child in children:
            key = (type(child).__name__, repr(sorted(_param_shapes(child).items())))
            groups.setdefault(key, []).append((name, child))
        # Parameter-free repeats (activations, dropouts) are not worth a layer class.
        repeated = [g for g in groups.values() if len(g) >= 2 and _param_shapes(g[0][1])]
        if not repeated:
            continue
        container = f"{type(module).__module__.split('.')[0]}.{type(module).__name__}".replace("torch.", "nn.")
        for name, child in children:
            group = next((g for g in repeated if any(child is c for _, c in g)), None)
            if group is not None:
                child_path = f"{path}.{name}" if path else name
                found_by = (f"{container} {path or '(the model)'}: {len(group)} of its {len(children)} children are "
                            f"{type(child).__name__} with identical parameter shapes")
                layers.append(LayerInstance(child_path, type(child).__name__, _param_shapes(child), found_by))
                claimed.append(child_path)
    return layers


def probe_layer_inputs(model: nn.Module, inputs: tuple, layers: list[LayerInstance], grad: bool) -> dict[str, list[dict]]:
    """What each layer instance receives, from one forward of ``model`` outside the profile (RNG state
    restored afterwards): module path -> one entry per call in call order (``path``, ``path#1`` ...):
    ``input_requires_grad`` (any tensor argument requires grad; False for every call when ``grad`` is
    off) and ``input_shapes`` (the tensor arguments' shapes). The layer classification uses it to say why
    identical layers fall into several classes (e.g. the first layer's input needs no gradient, so its
    backward has no input-gradient kernels). Raises what the model raises."""
    modules = dict(model.named_modules())
    seen: dict[str, list[dict]] = {}
    handles = []

    def flat(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from flat(v)
        elif isinstance(value, (tuple, list)):
            for v in value:
                yield from flat(v)

    for layer in layers:
        def record(_module, args, kwargs, _path=layer.path):
            tensors = list(flat((args, kwargs)))
            seen.setdefault(_path, []).append({"input_requires_grad": any(t.requires_grad for t in tensors),
                                               "input_shapes": [list(t.shape) for t in tensors]})
        handles.append(modules[layer.path].register_forward_pre_hook(record, with_kwargs=True))
    devices = [torch.cuda.current_device()] if any(
        isinstance(t, torch.Tensor) and t.is_cuda for t in inputs) else []
    try:
        with torch.random.fork_rng(devices=devices), torch.set_grad_enabled(grad):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen
