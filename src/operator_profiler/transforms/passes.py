"""FX passes of the optimizer, on a torch-level FX graph (Dynamo's graph inside a torch.compile backend, or a
``torch.fx.symbolic_trace`` of the model).

Each pass mutates the ``GraphModule`` (and recompiles it) and returns one record per rewrite, so a profile of the
variant pairs each new operator with the original operators it replaces (docs/optimize.md#passes)::

    {"pass": "attention_to_sdpa", "new_node": "scaled_dot_product_attention", "new_op":
     "aten::scaled_dot_product_attention", "replaced_nodes": [...], "replaced_ops": ["aten::matmul", ...],
     "module_path": "transformer.h.0.attn"}

A candidate that is not rewritten because the result would not be provably equal gets a record with
``"skipped": <reason>`` and no ``new_node``. The new node keeps the replaced nodes' FX meta (``nn_module_stack``,
``stack_trace``), so the module-path capture attributes its kernels to the same module.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

__all__ = ["attention_to_sdpa", "cancel_cast_pairs", "fold_conv_bn", "node_dtype", "node_shape"]

# ------------------------------------------------------------------------------------------- node matching

_MATMUL = ({operator.matmul, torch.matmul}, {"matmul", "__matmul__"})
_TRANSPOSE = ({torch.transpose}, {"transpose"})
_MUL = ({operator.mul, torch.mul}, {"mul", "__mul__", "__rmul__"})
_DIV = ({operator.truediv, torch.div, torch.true_divide}, {"div", "__truediv__", "true_divide"})
_ADD = ({operator.add, torch.add}, {"add", "__add__", "__radd__"})
_MASKED_FILL = ({torch.masked_fill}, {"masked_fill"})
_SOFTMAX = ({torch.softmax, F.softmax, torch.special.softmax}, {"softmax"})
_DROPOUT = ({F.dropout, torch.dropout, torch.nn.functional.dropout1d, torch.nn.functional.dropout2d}, {"dropout"})
_ONES = ({torch.ones}, set())
_TRIL = ({torch.tril}, {"tril"})
_INVERT = ({operator.invert, torch.bitwise_not, torch.logical_not}, {"bitwise_not", "logical_not", "__invert__"})

#: The ATen operator a torch-level node of each kind dispatches to (what a profile of the original model shows).
_ATEN = [(_MATMUL, "aten::matmul"), (_TRANSPOSE, "aten::transpose"), (_MUL, "aten::mul"), (_DIV, "aten::div"),
         (_ADD, "aten::add"), (_MASKED_FILL, "aten::masked_fill"), (_SOFTMAX, "aten::softmax"),
         (_ONES, "aten::ones"), (_TRIL, "aten::tril"), (_INVERT, "aten::bitwise_not")]


def _is(node: Any, kind: tuple[set, set]) -> bool:
    if not isinstance(node, fx.Node):
        return False
    functions, methods = kind
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def _aten_name(node: fx.Node) -> str:
    for kind, name in _ATEN:
        if _is(node, kind):
            return name
    return f"aten::{getattr(node.target, '__name__', node.target)}"


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _meta_value(node: Any) -> Any:
    if not isinstance(node, fx.Node):
        return None
    for key in ("example_value", "val", "tensor_meta"):
        value = node.meta.get(key)
        if value is not None and hasattr(value, "shape"):
            return value
    return None


def node_shape(node: Any) -> tuple | None:
    """The node's tensor shape from its FX meta (Dynamo's ``example_value``, ``val`` or ShapeProp's
    ``tensor_meta``); None when unknown."""
    value = _meta_value(node)
    return tuple(value.shape) if value is not None else None


def node_dtype(node: Any) -> torch.dtype | None:
    """The node's tensor dtype from its FX meta; None when unknown."""
    value = _meta_value(node)
    return getattr(value, "dtype", None) if value is not None else None


def _module_path(nodes: list[fx.Node]) -> str | None:
    """Module path of the innermost module in the nodes' ``nn_module_stack`` (Dynamo's ``L['self'].`` prefix
    removed; "" is the model itself); None when no node has a stack."""
    for node in reversed(nodes):
        stack = node.meta.get("nn_module_stack")
        if stack:
            access = str(list(stack.values())[-1][0])
            for prefix in ("L['self'].", "L['self']", "self.", "self"):
                if access.startswith(prefix):
                    return access[len(prefix):]
            return access
    return None


def _copy_meta(new: fx.Node, source: fx.Node) -> None:
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack", "example_value", "val", "tensor_meta"):
        if key in source.meta:
            new.meta[key] = source.meta[key]


def _erase_if_unused(graph: fx.Graph, nodes: list[fx.Node]) -> list[str]:
    erased = []
    for node in nodes:
        if isinstance(node, fx.Node) and not node.users and node.graph is graph:
            erased.append(node.name)
            graph.erase_node(node)
    return erased


def _is_neg_inf(value: Any) -> bool:
    return isinstance(value, float) and math.isinf(value) and value < 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------------ attention -> SDPA


def _last_dim(node: fx.Node, dim: Any) -> bool:
    shape = node_shape(node)
    return dim == -1 or (shape is not None and isinstance(dim, int) and dim == len(shape) - 1)


def _is_k_transpose(node: Any) -> bool:
    """``k.transpose(-2, -1)`` (or the same two last dims written positively)."""
    if not _is(node, _TRANSPOSE):
        return False
    dims = {_arg(node, 1, "dim0"), _arg(node, 2, "dim1")}
    shape = node_shape(node.args[0])
    if dims == {-2, -1}:
        return True
    return shape is not None and dims == {len(shape) - 2, len(shape) - 1}


def _causal_mask(mask: fx.Node, scores: fx.Node) -> tuple[bool, fx.Node | None]:
    """``mask`` is ``~torch.ones(L, S, dtype=bool).tril()`` built in the graph: (True, the tril node).
    ``is_causal`` needs L == S equal to the scores' last two dims (SDPA's causal mask is ``ones(L, S).tril()``)."""
    if not _is(mask, _INVERT):
        return False, None
    tril = mask.args[0]
    if not _is(tril, _TRIL) or _arg(tril, 1, "diagonal", 0) != 0:
        return False, None
    ones = tril.args[0]
    if not _is(ones, _ONES) or ones.kwargs.get("dtype") is not torch.bool:
        return False, None
    mask_shape, scores_shape = node_shape(tril), node_shape(scores)
    if mask_shape is None or scores_shape is None or len(mask_shape) != 2:
        return False, None
    square = mask_shape[0] == mask_shape[1] and tuple(scores_shape[-2:]) == tuple(mask_shape)
    return square, tril


def attention_to_sdpa(gm: fx.GraphModule) -> list[dict]:
    """Rewrite explicit attention ``softmax(mask(scale(q @ k.transpose(-2, -1)))) @ v`` into
    ``F.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=..., scale=c)``.

    Accepted: scale by ``* c`` or ``/ c`` (a Python number; none -> scale 1.0); mask by ``masked_fill(m, -inf)``
    (``m = ~ones(L, L, dtype=bool).tril()`` built in the graph with L the scores' size -> ``is_causal=True``; any
    other bool ``m`` -> ``attn_mask=~m``) or by ``+ mask`` tensor (additive ``attn_mask``); ``softmax(dim=-1)``
    without dtype. Equal to the original in exact arithmetic (one difference: a row whose every key is masked
    is NaN in eager, which only a non-causal bool mask can produce). Not rewritten, with a ``skipped`` record:
    dropout between softmax and the second matmul, an intermediate used elsewhere, a fill value other than -inf,
    unknown shapes.
    """
    graph = gm.graph
    records: list[dict] = []
    for softmax in [n for n in graph.nodes if _is(n, _SOFTMAX)]:
        dim = _arg(softmax, 1, "dim")
        dtype = softmax.kwargs.get("dtype", softmax.args[3] if softmax.op == "call_function" and len(softmax.args) > 3 else None)
        chain = [softmax]
        x = softmax.args[0]
        mask_op = mask_value = None
        if _is(x, _MASKED_FILL) or (_is(x, _ADD) and isinstance(_other(x), fx.Node) and "alpha" not in x.kwargs):
            mask_op = x
            chain.insert(0, x)
            if _is(x, _MASKED_FILL):
                mask_value = _arg(x, 2, "value")
                x = x.args[0]
            else:
                x = _scores_operand(x)
        scale = 1.0
        if _is(x, _MUL) or _is(x, _DIV):
            operands = list(x.args[:2])
            tensor = [a for a in operands if isinstance(a, fx.Node)]
            numbers = [a for a in operands if _number(a)]
            if len(tensor) == 1 and len(numbers) == 1 and (_is(x, _MUL) or operands[1] is numbers[0]) \
                    and not x.kwargs:
                scale = float(numbers[0]) if _is(x, _MUL) else 1.0 / float(numbers[0])
                chain.insert(0, x)
                x = tensor[0]
        if not _is(x, _MATMUL) or not _is_k_transpose(x.args[1]):
            continue  # not attention: a softmax of something else
        qk = x
        chain.insert(0, qk)
        q, k = qk.args[0], qk.args[1].args[0]
        skip = _attention_skip_reason(chain, mask_op, mask_value, dim, dtype, q)
        # no-op steps between softmax and the second matmul (Hugging Face's eager attention: a cast to the dtype
        # the probabilities already have, dropout with training=False): part of the chain, removed with it
        tail, identities = softmax, []
        while len(tail.users) == 1 and _identity_step(next(iter(tail.users)), node_dtype(softmax) or dtype
                                                      or node_dtype(q)):
            tail = next(iter(tail.users))
            identities.append(tail)
        users = list(tail.users)
        pv = users[0] if len(users) == 1 and _is(users[0], _MATMUL) and users[0].args[0] is tail else None
        if skip is None and pv is not None:
            skip = _operand_skip_reason(q, k, pv.args[1], mask_op)
        if skip is None and pv is None:
            if any(_is(u, _DROPOUT) or (u.op == "call_module" and isinstance(_submodule(gm, u), nn.Dropout))
                   for u in users):
                skip = "dropout between softmax and the second matmul: SDPA without dropout_p would differ"
            elif len(users) > 1:
                skip = f"the attention probabilities ({softmax.name}) are also used by " + \
                       ", ".join(u.name for u in users if u is not (pv or None))
            else:
                skip = "the softmax is not followed by a matmul with v"
        if skip is not None:
            records.append({"pass": "attention_to_sdpa", "skipped": skip,
                            "replaced_nodes": [n.name for n in chain + identities], "module_path": _module_path(chain)})
            continue
        chain += identities
        chain.append(pv)
        v = pv.args[1]
        causal, _tril = (False, None)
        attn_mask = None
        if mask_op is not None:
            if _is(mask_op, _MASKED_FILL):
                causal, _tril = _causal_mask(mask_op.args[1], qk)
                if not causal:
                    fill_mask = mask_op.args[1]
                    if _is(fill_mask, _INVERT) and node_dtype(fill_mask.args[0]) is torch.bool:
                        # ~m filled with -inf: attend where m (only a bool m: SDPA adds a float mask as a bias, so
                        # logical_not of a 0/1 float tensor is not m)
                        attn_mask = fill_mask.args[0]
                    else:
                        with graph.inserting_before(pv):
                            attn_mask = graph.call_function(torch.logical_not, (fill_mask,))
                        for key in ("nn_module_stack", "stack_trace"):
                            if key in mask_op.meta:
                                attn_mask.meta[key] = mask_op.meta[key]
            else:
                attn_mask = _other(mask_op)
        kwargs = {"attn_mask": attn_mask, "dropout_p": 0.0, "is_causal": causal, "scale": scale}
        with graph.inserting_before(pv):
            sdpa = graph.call_function(F.scaled_dot_product_attention, (q, k, v), kwargs)
        _copy_meta(sdpa, pv)
        pv.replace_all_uses_with(sdpa)
        replaced_ops = [_aten_name(n) for n in chain]
        replaced = [n.name for n in chain]
        # the k transpose and an in-graph mask's builders die with the chain (erased only when nothing else uses them)
        helpers = [qk.args[1]]
        if mask_op is not None and _is(mask_op, _MASKED_FILL) and attn_mask is not mask_op.args[1]:
            node = mask_op.args[1]
            while isinstance(node, fx.Node) and (_is(node, _INVERT) or _is(node, _TRIL) or _is(node, _ONES)):
                helpers.append(node)
                node = node.args[0] if node.args else None
        _erase_if_unused(graph, list(reversed(chain)))
        removed = _erase_if_unused(graph, helpers)
        records.append({
            "pass": "attention_to_sdpa", "new_node": sdpa.name, "new_op": "aten::scaled_dot_product_attention",
            "replaced_nodes": replaced, "replaced_ops": replaced_ops, "removed_nodes": removed,
            "module_path": _module_path(chain), "is_causal": causal, "scale": scale,
            "attn_mask": attn_mask.name if attn_mask is not None else None,
        })
    gm.recompile()
    return records


def _identity_step(node: Any, dtype: Any) -> bool:
    """``node`` returns its input unchanged: a cast to ``dtype``, the dtype it already has (``x.to(dtype)``,
    ``x.type(dtype)``, no other argument), or dropout that does not drop (``training=False`` or ``p == 0``)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and node.target in ("to", "type") and len(node.args) == 2 and not node.kwargs:
        return isinstance(node.args[1], torch.dtype) and dtype is not None and node.args[1] == dtype
    if _is(node, _DROPOUT) and node.target is not torch.dropout:
        p = _arg(node, 1, "p", 0.5)
        training = _arg(node, 2, "training", True)
        return _number(p) and (training is False or float(p) == 0.0) and not _arg(node, 3, "inplace", False)
    return False


def _other(add: fx.Node) -> Any:
    """The additive mask of ``scores + mask``: the operand that is not the scaled scores (the second one)."""
    return add.args[1] if len(add.args) > 1 else add.kwargs.get("other")


def _scores_operand(add: fx.Node) -> Any:
    return add.args[0]


def _submodule(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    try:
        return gm.get_submodule(str(node.target))
    except AttributeError:
        return None


def _attention_skip_reason(chain: list[fx.Node], mask_op: fx.Node | None, mask_value: Any, dim: Any, dtype: Any,
                           q: Any) -> str | None:
    """Why the matched chain is not provably equal to SDPA (None: it is, as far as the chain up to softmax)."""
    softmax = chain[-1]
    if not _last_dim(softmax.args[0], dim):
        return f"softmax over dim {dim!r}, not the last (key) dimension"
    if dtype is not None and dtype != node_dtype(q):  # softmax(dtype=q's dtype) is plain softmax (HF's eager attention)
        return f"softmax with dtype={dtype}: SDPA computes in the inputs' dtype"
    if mask_op is not None and _is(mask_op, _MASKED_FILL) and not _is_neg_inf(mask_value):
        return f"masked_fill value {mask_value!r} is not -inf: SDPA's bool mask means -inf"
    shape = node_shape(q)
    if shape is None:
        return "no shape metadata on q (run ShapeProp on a symbolically traced graph): equality not provable"
    if len(shape) < 2:
        return f"q has {len(shape)} dimension(s): matmul of a vector is not attention"
    for node in chain[:-1]:
        if len(node.users) != 1:
            others = ", ".join(u.name for u in node.users)
            return f"intermediate {node.name} is also used elsewhere ({others})"
    return None


# ------------------------------------------------------------------------------------------------ conv-BN fold


def fold_conv_bn(gm: fx.GraphModule) -> list[dict]:
    """Fold ``BatchNorm2d(Conv2d(x))`` into one Conv2d (``torch.nn.utils.fusion.fuse_conv_bn_eval``) on a graph
    with ``call_module`` nodes (a ``torch.fx.symbolic_trace`` of the model). Folded only when the BN is in eval
    mode with running statistics, the conv output feeds nothing but the BN, and neither module is called elsewhere.
    Dynamo's graph holds parameters as inputs, not modules: there this pass finds nothing, and Inductor freezing
    does the fold (docs/optimize.md#changes)."""
    graph = gm.graph
    records: list[dict] = []
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[str(node.target)] = calls.get(str(node.target), 0) + 1
    for bn_node in [n for n in graph.nodes if n.op == "call_module"]:
        bn = _submodule(gm, bn_node)
        if not isinstance(bn, nn.BatchNorm2d):
            continue
        conv_node = bn_node.args[0] if bn_node.args else None
        conv = _submodule(gm, conv_node) if isinstance(conv_node, fx.Node) and conv_node.op == "call_module" else None
        if not isinstance(conv, nn.Conv2d):
            continue
        names = [conv_node.name, bn_node.name]
        skip = None
        if bn.training or conv.training:
            skip = "BatchNorm2d in training mode: its output uses the batch statistics"
        elif not bn.track_running_stats or bn.running_mean is None:
            skip = "BatchNorm2d without running statistics"
        elif len(conv_node.users) != 1:
            skip = f"the conv output {conv_node.name} is also used by " + \
                   ", ".join(u.name for u in conv_node.users if u is not bn_node)
        elif calls[str(conv_node.target)] != 1 or calls[str(bn_node.target)] != 1:
            skip = "the conv or BN module is called more than once"
        if skip:
            records.append({"pass": "fold_conv_bn", "skipped": skip, "replaced_nodes": names,
                            "module_path": str(conv_node.target)})
            continue
        fused = torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
        _set_submodule(gm, str(conv_node.target), fused)
        bn_node.replace_all_uses_with(conv_node)
        graph.erase_node(bn_node)
        records.append({"pass": "fold_conv_bn", "new_node": conv_node.name, "new_op": "aten::conv2d",
                        "replaced_nodes": names, "replaced_ops": ["aten::conv2d", "aten::batch_norm"],
                        "module_path": str(conv_node.target), "folded_module": str(bn_node.target)})
    gm.delete_all_unused_submodules()
    gm.recompile()
    return records


def _set_submodule(root: nn.Module, target: str, module: nn.Module) -> None:
    parent, _, name = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


# ------------------------------------------------------------------------------------------------- cast pairs

#: dtype -> the floating dtypes that hold every one of its values exactly (a cast there and back is the identity).
EXACT_WIDENINGS: dict[torch.dtype, frozenset[torch.dtype]] = {
    torch.float16: frozenset({torch.float32, torch.float64}),
    torch.bfloat16: frozenset({torch.float32, torch.float64}),
    torch.float32: frozenset({torch.float64}),
}
_CAST_METHODS = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


def _cast_target(node: Any) -> torch.dtype | None:
    """The dtype a pure dtype cast converts to (``x.to(dtype)``, ``x.float()``..., ``x.type(dtype)``,
    ``aten._to_copy(x, dtype=)``, ``prims.convert_element_type(x, dtype)``); None for anything else (a ``to``
    that also moves device, changes memory format or copies is not a pure cast)."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_method" and node.target in _CAST_METHODS and len(node.args) == 1 and not node.kwargs:
        return _CAST_METHODS[node.target]
    if node.op == "call_method" and node.target in ("to", "type"):
        rest = list(node.args[1:])
        kwargs = dict(node.kwargs)
        dtype = rest.pop(0) if rest and isinstance(rest[0], torch.dtype) else kwargs.pop("dtype", None)
        if isinstance(dtype, torch.dtype) and not rest and not kwargs:
            return dtype
        return None
    if node.op == "call_function":
        if node.target is torch.ops.aten._to_copy.default and set(node.kwargs) == {"dtype"} and len(node.args) == 1:
            return node.kwargs["dtype"]
        if node.target is torch.ops.prims.convert_element_type.default and len(node.args) == 2:
            return node.args[1]
    return None


def _mutated(node: fx.Node) -> bool:
    """A user updates the value in place (``add_``, ``copy_``...): an alias would then differ from a copy."""
    for user in node.users:
        name = user.target if isinstance(user.target, str) else getattr(user.target, "__name__", "")
        if name.endswith("_") and not name.startswith("__"):
            return True
    return False


def cancel_cast_pairs(gm: fx.GraphModule) -> list[dict]:
    """Remove ``x.to(wide).to(orig)`` where ``wide`` holds every value of ``orig`` exactly (fp16/bf16 -> fp32 or
    fp64, fp32 -> fp64): the round trip is the identity, so the second cast's users read ``x``. A narrowing pair
    (fp32 -> bf16 -> fp32) rounds and is never cancelled (a ``skipped`` record says so); neither is a pair whose
    source dtype is unknown, or whose result or source is updated in place (the result would alias ``x``)."""
    graph = gm.graph
    records: list[dict] = []
    for second in list(graph.nodes):
        back = _cast_target(second)
        first = second.args[0] if back is not None and second.args else None
        wide = _cast_target(first)
        if wide is None:
            continue
        source = first.args[0]
        orig = node_dtype(source)
        names = [first.name, second.name]
        if orig is None or orig != back:
            continue  # not a round trip (or unknown source dtype): nothing to say
        skip = None
        if wide != orig and wide not in EXACT_WIDENINGS.get(orig, frozenset()):
            skip = f"{orig} -> {wide} -> {orig} rounds to {wide}: the round trip changes values"
        elif _mutated(second) or _mutated(source):
            skip = "the result or the source is updated in place: removing the copy would alias them"
        if skip:
            records.append({"pass": "cancel_cast_pairs", "skipped": skip, "replaced_nodes": names,
                            "module_path": _module_path([first, second])})
            continue
        second.replace_all_uses_with(source)
        erased = _erase_if_unused(graph, [second, first])
        records.append({"pass": "cancel_cast_pairs", "new_node": source.name, "new_op": None,
                        "replaced_nodes": names, "replaced_ops": ["aten::to", "aten::to"], "removed_nodes": erased,
                        "module_path": _module_path([first, second]), "dtypes": [str(orig), str(wide)]})
    gm.recompile()
    return records


def _operand_skip_reason(q: Any, k: Any, v: Any, mask_op: fx.Node | None) -> str | None:
    """Why q, k, v (and an additive mask) do not meet SDPA's contract as the matmuls used them (None: they do):
    matmul broadcasts batch dimensions, SDPA needs them equal; SDPA takes a float mask only in q's dtype (eager's
    ``scores + mask`` would promote instead)."""
    shapes = [node_shape(n) for n in (q, k, v)]
    if any(s is None for s in shapes):
        return "no shape metadata on q, k or v: equality not provable"
    if len({len(s) for s in shapes}) != 1 or len({tuple(s[:-2]) for s in shapes}) != 1:
        return f"q, k, v batch dimensions differ ({', '.join(str(tuple(s)) for s in shapes)}): matmul broadcasts"
    dtypes = {node_dtype(n) for n in (q, k, v)}
    if len(dtypes) != 1:
        return f"q, k, v dtypes differ ({', '.join(sorted(map(str, dtypes)))})"
    if mask_op is not None and _is(mask_op, _ADD):
        mask_dtype = node_dtype(_other(mask_op))
        if mask_dtype != node_dtype(q):
            return f"additive mask of dtype {mask_dtype} with q of dtype {node_dtype(q)}: eager promotes, SDPA " \
                   "refuses"
    return None
