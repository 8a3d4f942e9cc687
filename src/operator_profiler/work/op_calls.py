"""Analytic work of one operator call from its recorded input shapes: FLOPs and ideal bytes.

The call is re-run on PyTorch's ``meta`` device (shapes and dtypes only, no data, no arithmetic) with the
inputs torch.profiler's ``record_shapes`` wrote ("Input Dims", "Input type", "Concrete Inputs", "Input
Strides", in schema order) and, where the capture's shapes iterations added them (``input_shapes``' 5th element,
:data:`RECORDED_INPUTS_KEY`, :mod:`operator_profiler.capture.op_inputs`), the execution trace's record of what
record_shapes leaves out: string arguments (``aten::einsum``'s equation) and each tensor of a list with its
shape, strides and dtype (``aten::cat``, ``aten::stack``, ``aten::index``'s optional indices). Without that record
such a call cannot be re-run, and its work is unknown (``note`` names the argument). The replay runs under a
dispatch mode that counts the FLOPs of every ATen op the call dispatches:

* an op in ``torch.utils.flop_counter``'s registry (mm, addmm, bmm, baddbmm, convolution and its backward,
  scaled-dot-product attention and its backward ...) counts what PyTorch's own formula says
  (``flops_rule`` ``pytorch_formula``); CPU flash attention and the attention entry points the registry lacks
  (the composite ``aten::scaled_dot_product_attention`` an eager model calls, its math variant) use the
  registry's SDPA formula (:data:`EXTRA_FORMULAS`): q @ k^T and attention @ v over the full s_q x s_k
  square, causal or not, as ``flop_counter`` counts it;
* a call of such an op counts its formula and nothing else, never also the ops its meta kernel decomposes into
  (on the meta device the eager SDPA takes the math path: two ``bmm`` and the scale, mask and softmax around
  them, which the formula does not count); a formula that refuses the recorded shapes leaves the FLOPs unknown;
* other ops count by :mod:`.flop_rules` (one documented count per element), or 0 for data movement and
  views; an op with no rule leaves the call's FLOPs unknown, named in ``note``.

Ideal bytes are the bytes of the call's inputs and outputs: distinct elements of each tensor argument
(a broadcast, stride-0 dimension read once), an ``out=`` argument written and not read, an in-place
argument read and written, a view returned 0 bytes. Results are cached per (op, recorded inputs): a
model repeats the same calls every layer and iteration.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from dataclasses import dataclass

from . import flop_rules

#: Kineto "Input type" of a tensor argument -> torch dtype name (c10 TypeMeta names, as torch.profiler writes them).
KINETO_DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "long": "int64", "int": "int32", "short int": "int16", "short": "int16",
    "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128", "c10::complex<c10::Half>": "complex32",
    "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz", "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
}
NON_TENSOR_TYPES = frozenset({"Scalar", "ScalarList", "", "GenericList", "String", "Device", "Layout"})


@dataclass(frozen=True)
class CallWork:
    """Work of one call. ``flops``/``bytes_*`` are None when unknown (``note`` says why); ``flops_formula``
    is the part counted by PyTorch's own formulas; ``dtype``: the dtype of the call's first floating-point
    tensor input (what its compute ceiling is), else of its first tensor."""

    flops: float | None
    flops_formula: float | None
    bytes_read: float | None
    bytes_written: float | None
    flops_rule: str | None  # pytorch_formula | per_element | movement | none
    dtype: str | None
    note: str | None = None

    @property
    def bytes(self) -> float | None:
        if self.bytes_read is None or self.bytes_written is None:
            return None
        return self.bytes_read + self.bytes_written


@functools.lru_cache(maxsize=4096)
def is_composite(name: str) -> bool:
    """Whether ``name`` (``aten::linear``) is CompositeImplicitAutograd in its main overload (``default``, else
    ``Tensor``, ``input``, ``self``; its ``out`` variant may not be): it only decomposes into other ops, so its own
    (exclusive) time is overhead, never where its work ran. False for unknown ops."""
    if not isinstance(name, str) or "::" not in name:
        return False
    torch = _torch()
    ns, _, op = name.partition("::")
    try:
        overloads = getattr(getattr(torch.ops, ns), op).overloads()
    except (AttributeError, RuntimeError):
        return False
    main = next((o for o in ("default", "Tensor", "input", "self") if o in overloads), None)
    if main is None:
        return False
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(
            name if main == "default" else f"{name}.{main}", "CompositeImplicitAutograd"))
    except RuntimeError:
        return False


class NotReplayable(Exception):
    """The recorded inputs do not make a call of any overload of the op."""


def _torch():
    import torch  # here: importing this module must not import torch (the DAG process and light tools)

    return torch


def call_work(name: str, input_shapes: str | None, missing: str | None = None) -> CallWork:
    """Work of a call of ``name`` (``aten::addmm``) with its ``input_shapes`` (the ranges column); ``missing``:
    why a call has none, when known."""
    if not input_shapes or (isinstance(input_shapes, float) and input_shapes != input_shapes):
        return CallWork(None, None, None, None, None, None,
                        missing or "no input shapes recorded (the trace was recorded without record_shapes)")
    return _call_work(name, input_shapes)


@functools.lru_cache(maxsize=65536)
def _call_work(name: str, input_shapes: str) -> CallWork:
    try:
        parts = json.loads(input_shapes)
        dims, types, concrete, strides = parts[:4]
    except (ValueError, TypeError):
        return CallWork(None, None, None, None, None, None, "input shapes are not [dims, types, concrete, strides]")
    n = len(dims)
    types = list(types or [""] * n)
    concrete = list(concrete or [""] * n)
    strides = list(strides or [None] * n)
    if not (len(types) == len(concrete) == len(strides) == n):
        return CallWork(None, None, None, None, None, None, "input shapes lists differ in length")
    recorded = _recorded_inputs(parts[4] if len(parts) > 4 else None, n)
    dtype = _call_dtype(types, recorded)
    if name in flop_rules.NO_WORK_OPS:
        return CallWork(0.0, 0.0, 0.0, 0.0, "movement", dtype)
    if name in PACKED_WEIGHT_OPS:
        return _packed_weight_work(name, dims, types, concrete, recorded, dtype)
    try:
        overload, args, kwargs, read_bytes = _rebuild(name, dims, types, concrete, strides, dtype, recorded)
    except NotReplayable as exc:
        return CallWork(None, None, None, None, None, dtype, f"not replayable on the meta device: {exc}")
    formula = _formulas().get(overload._overloadpacket)
    counter = _FlopCounter()
    try:
        if formula is not None:
            # A call a FLOP formula covers counts the formula and nothing else: its meta kernel may take another
            # path than the profiled device did (eager SDPA decomposes into the math path on meta: two bmm
            # and the element-wise ops around them, which the formula does not count).
            result = overload(*args, **kwargs)
        else:
            with counter:
                result = overload(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure of a meta kernel means: work unknown, said so
        written = _recorded_output_bytes(recorded)
        if written is not None and flop_rules.is_data_only(name):
            # a gather whose output size depends on the data (a boolean-mask aten::index): the meta device
            # cannot size it, the recorded output can; no arithmetic either way
            return CallWork(0.0, 0.0, read_bytes, written, "movement", dtype)
        return CallWork(None, None, None, None, None, dtype,
                        f"not replayable on the meta device: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    written = _written_bytes(overload, result, [*args, *kwargs.values()])
    if formula is not None:
        try:
            flops = float(formula(*args, **kwargs, out_val=result))
        except Exception as exc:  # noqa: BLE001 - a formula refusing the shapes (incompatible q/k/v): unknown
            return CallWork(None, None, read_bytes, written, None, dtype,
                            f"PyTorch's FLOP formula refused the recorded inputs: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200]}")
        return CallWork(flops, flops, read_bytes, written, "pytorch_formula", dtype)
    if not written and not counter.total and not counter.unknown:
        read_bytes = 0.0  # it wrote nothing (a view, or contiguous() of a contiguous tensor): nothing moved
    flops = None if counter.unknown else counter.total
    rule = None if counter.unknown else ("pytorch_formula" if counter.formula else
                                         ("per_element" if counter.total else "movement"))
    note = f"no FLOP rule for {', '.join(sorted(counter.unknown))}" if counter.unknown else None
    return CallWork(flops, float(counter.formula), read_bytes, written, rule, dtype, note)


def _call_dtype(types: list, recorded: dict | None = None) -> str | None:
    """The dtype of the call's first floating-point tensor input, else of its first tensor input; tensor-list
    elements count where their dtypes were recorded (``recorded``, see :func:`_recorded_inputs`)."""
    tensor = []
    for i, t in enumerate(types):
        if isinstance(t, str) and t in KINETO_DTYPES:
            tensor.append(KINETO_DTYPES[t])
        elif recorded is not None:
            tensor.extend(d for d in _list_dtypes(recorded["types"][i]) or [] if d is not None)
    floating = [t for t in tensor if t.startswith(("float", "bfloat", "complex"))]
    return (floating or tensor or [None])[0]


#: The key of a Kineto op event's args holding what record_shapes leaves out: strings, the dtypes and shapes of
#: tensor-list elements (written by the capture's shapes iterations, :mod:`operator_profiler.capture.op_inputs`).
RECORDED_INPUTS_KEY = "opprof inputs"


def _recorded_inputs(value, n: int) -> dict | None:
    """The 5th element of ``input_shapes``: ``{"types", "values", "shapes", "strides"}`` (one entry per argument,
    as PyTorch's execution trace writes them; ``outputs``: its outputs' ``shapes``/``types``/``strides``), or
    None when absent or not of that form (then only the Kineto fields are used)."""
    if not isinstance(value, dict):
        return None
    lists = [value.get(k) for k in ("types", "values", "shapes", "strides")]
    if not all(isinstance(x, list) and len(x) == n for x in lists):
        return None
    return value


def _list_dtypes(et_type) -> list | None:
    """``GenericList[Tensor(float),Tensor(nullptr (uninitialized))]`` -> ``["float32", None]``; None when the
    execution-trace type is not a list of tensors (or names a dtype this module does not know: never a guess)."""
    if not isinstance(et_type, str) or not et_type.startswith("GenericList[") or not et_type.endswith("]"):
        return None
    inner = et_type[len("GenericList["):-1]
    if not inner:
        return []
    out = []
    for element in inner.split(","):
        if not (element.startswith("Tensor(") and element.endswith(")")):
            return None
        name = element[len("Tensor("):-1]
        if name.startswith("nullptr"):
            out.append(None)  # an undefined tensor: None of a Tensor?[] (aten::index)
        elif name in KINETO_DTYPES:
            out.append(KINETO_DTYPES[name])
        else:
            return None
    return out


def _recorded_output_bytes(recorded: dict | None) -> float | None:
    """Bytes of the outputs the execution trace recorded (shapes and dtypes), or None when it recorded none."""
    outputs = (recorded or {}).get("outputs")
    if not isinstance(outputs, dict):
        return None
    shapes, types, strides = (outputs.get(k) for k in ("shapes", "types", "strides"))
    if not (isinstance(shapes, list) and isinstance(types, list) and len(shapes) == len(types)):
        return None
    strides = strides if isinstance(strides, list) and len(strides) == len(shapes) else [None] * len(shapes)
    torch = _torch()
    total = 0.0
    for shape, t, st in zip(shapes, types, strides):
        if not (isinstance(t, str) and t.startswith("Tensor(") and t[7:-1] in KINETO_DTYPES):
            return None
        if not (isinstance(shape, list) and all(isinstance(x, int) for x in shape)):
            return None
        itemsize = torch.empty((), dtype=getattr(torch, KINETO_DTYPES[t[7:-1]])).element_size()
        total += _distinct_elements(shape, st if isinstance(st, list) else None) * itemsize
    return total


def _distinct_elements(size: list, stride: list | None) -> int:
    """Elements a tensor of ``size``/``stride`` really holds: a stride-0 (broadcast) dimension counts once."""
    if any(s == 0 for s in size):
        return 0
    if not stride or len(stride) != len(size):
        return math.prod(size)
    return math.prod(s for s, st in zip(size, stride) if st != 0)


def _parse_scalar(text: str):
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _rebuild(name: str, dims, types, concrete, strides, call_dtype, recorded: dict | None = None):
    """The overload of ``name`` whose schema the recorded inputs fit, its meta arguments and the bytes the
    call reads. ``recorded``: what the execution trace added (:func:`_recorded_inputs`), whose ``overload``
    (the schema the call ran) is tried first."""
    torch = _torch()
    ns, _, op = name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), op)
    except (AttributeError, RuntimeError):
        raise NotReplayable(f"{name} is not a registered operator here") from None
    tried = []
    overloads = packet.overloads()
    ran = (recorded or {}).get("overload")
    if ran in overloads:
        overloads = [ran, *(o for o in overloads if o != ran)]
    for overload_name in overloads:
        overload = getattr(packet, overload_name)
        schema = overload._schema
        if len(schema.arguments) != len(dims):
            continue
        try:
            return (overload, *_arguments(schema, dims, types, concrete, strides, call_dtype, recorded))
        except NotReplayable as exc:
            tried.append(f"{overload_name}: {exc}")
    raise NotReplayable(f"no overload of {name} takes {len(dims)} arguments of types {types}"
                        + (f" ({'; '.join(tried[:3])})" if tried else ""))


def _arguments(schema, dims, types, concrete, strides, call_dtype, recorded=None):
    torch = _torch()
    overwrites = schema.name in flop_rules.OVERWRITING_OPS
    args, kwargs, read_bytes = [], {}, 0.0
    for index, (arg, d, t, c, st) in enumerate(zip(schema.arguments, dims, types, concrete, strides)):
        kind = _kind(arg.type)
        written = arg.alias_info is not None and arg.alias_info.is_write
        et_type = recorded["types"][index] if recorded is not None else None
        list_dtypes = _list_dtypes(et_type) if kind == "tensor_list" else None
        if list_dtypes is not None:
            # the execution trace's record of a tensor list: each element's shape, strides and dtype (None: an
            # undefined element of a Tensor?[], such as aten::index's unindexed dimensions)
            shapes, list_strides = recorded["shapes"][index], recorded["strides"][index]
            if not (isinstance(shapes, list) and len(shapes) == len(list_dtypes)):
                raise NotReplayable(f"argument {arg.name}: the recorded tensor list has no shape per element")
            list_strides = (list_strides if isinstance(list_strides, list) and len(list_strides) == len(shapes)
                            else [None] * len(shapes))
            value = []
            for x, s, element_dtype in zip(shapes, list_strides, list_dtypes):
                if element_dtype is None:
                    value.append(None)
                    continue
                element = _meta(x, s, element_dtype)
                value.append(element)
                read_bytes += _distinct_elements(x, s) * element.element_size()
        elif et_type == "String" and isinstance(recorded["values"][index], str):
            if str(arg.type) not in ("str", "Optional[str]"):
                raise NotReplayable(f"argument {arg.name} is {arg.type}, recorded a string")
            value = recorded["values"][index]  # einsum's equation, gelu's approximate, pad's mode ...
        elif t in KINETO_DTYPES:
            if kind not in ("tensor", "optional_tensor"):
                raise NotReplayable(f"argument {arg.name} is {arg.type}, recorded a tensor")
            value = _meta(d, st, KINETO_DTYPES[t])
            elements = _distinct_elements(d, st)
            if not (written and (arg.kwarg_only or (index == 0 and overwrites))):  # out= (or copy_'s self): not read
                read_bytes += elements * value.element_size()
        elif t == "TensorList":
            if kind != "tensor_list":
                raise NotReplayable(f"argument {arg.name} is {arg.type}, recorded a TensorList")
            # Kineto records no dtype for list elements: the call's own tensor dtype (an LSTM's states and
            # weights, a cat's inputs must share it); without one the bytes would be a guess.
            if call_dtype is None:
                raise NotReplayable("a TensorList whose element dtype is not recorded")
            st = st if isinstance(st, list) and len(st) == len(d) else [None] * len(d)
            value = [_meta(x, s, call_dtype) for x, s in zip(d, st)]
            read_bytes += sum(_distinct_elements(x, s) * v.element_size() for x, s, v in zip(d, st, value))
        elif kind == "tensor" and not t and not c and d in ([], None):
            value = None  # an undefined tensor (a dense flash attention backward's cum_seq_q): None, as PyTorch passes it
        else:
            if kind in ("tensor", "tensor_list"):
                raise NotReplayable(f"argument {arg.name} is {arg.type}, recorded {t or 'None'}")
            value = _non_tensor(arg, c, torch)
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs, read_bytes


def _kind(t) -> str:
    torch = _torch()
    if isinstance(t, torch.TensorType):
        return "tensor"
    if isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.TensorType):
        return "optional_tensor"
    if isinstance(t, torch.ListType):
        e = t.getElementType()
        if isinstance(e, torch.OptionalType):
            e = e.getElementType()
        if isinstance(e, torch.TensorType):
            return "tensor_list"
    return "other"


def _meta(size, stride, dtype_name: str):
    torch = _torch()
    dtype = getattr(torch, dtype_name)
    if not isinstance(size, list) or not all(isinstance(s, int) for s in size):
        raise NotReplayable(f"tensor dims {size!r} are not a list of ints")
    if isinstance(stride, list) and len(stride) == len(size) and all(isinstance(s, int) for s in stride):
        return torch.empty_strided(size, stride, dtype=dtype, device="meta")
    return torch.empty(size, dtype=dtype, device="meta")


def _non_tensor(arg, text, torch):
    """A non-tensor argument from its "Concrete Inputs" text, typed by the schema; devices become meta."""
    type_text = str(arg.type)
    if text == "" or text is None:
        if "Device" in type_text:
            return torch.device("meta")
        if type_text.startswith("Optional") or arg.has_default_value():
            return None if type_text.startswith("Optional") else arg.default_value
        if type_text == "str":
            raise NotReplayable(f"argument {arg.name} (str) was not recorded: torch.profiler's record_shapes keeps "
                                "no strings (this workflow's shapes iterations record them, docs/work.md)")
        raise NotReplayable(f"argument {arg.name} ({type_text}) was not recorded")
    if type_text in ("str", "Optional[str]") and isinstance(text, str):
        return text
    value = _parse_scalar(text) if isinstance(text, str) else text
    if "ScalarType" in type_text and isinstance(value, int):
        return _SCALAR_TYPES()[value]
    if "Device" in type_text:
        return torch.device("meta")
    if "Layout" in type_text:
        return torch.strided
    if "MemoryFormat" in type_text and isinstance(value, int):
        return [torch.contiguous_format, torch.preserve_format, torch.channels_last, torch.channels_last_3d][value]
    return value


@functools.lru_cache(maxsize=1)
def _SCALAR_TYPES():  # noqa: N802 - a constant table, built on first use (needs torch)
    torch = _torch()
    # c10::ScalarType codes, in their enum order (c10/core/ScalarType.h)
    names = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32",
             "complex64", "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16"]
    return {i: getattr(torch, n) for i, n in enumerate(names)}


def _written_bytes(overload, result, inputs: list) -> float:
    """Bytes of the call's outputs: each returned tensor that is not a view of an input (an in-place or
    ``out=`` result is written; a may-alias result such as ``contiguous``'s or ``reshape``'s is written
    only when the call made a new tensor)."""
    torch = _torch()
    returns = overload._schema.returns
    values = result if isinstance(result, (tuple, list)) else (result,)
    given = {id(x) for x in inputs if isinstance(x, torch.Tensor)}
    total = 0.0
    for i, value in enumerate(values):
        ret = returns[i] if i < len(returns) else None
        alias = ret.alias_info if ret is not None else None
        tensors = value if isinstance(value, (tuple, list)) else (value,)
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            if alias is not None and not alias.is_write and (id(t) in given or t._is_view()):
                continue  # a view of an input: nothing written
            total += _distinct_elements(list(t.shape), list(t.stride())) * t.element_size()
    return total


@functools.lru_cache(maxsize=1)
def _formulas() -> dict:
    """Op packet -> FLOP formula: ``torch.utils.flop_counter``'s registry and :data:`EXTRA_FORMULAS` (those of
    this torch build; an op it lacks is left out)."""
    torch = _torch()
    from torch.utils.flop_counter import flop_registry

    registry = dict(flop_registry)
    for packet_name, formula in EXTRA_FORMULAS.items():
        ns, _, op = packet_name.partition("::")
        packet = getattr(getattr(torch.ops, ns), op, None)
        if packet is not None:
            registry[packet] = formula()
    return registry


@functools.lru_cache(maxsize=1)
def _counter_class():
    torch = _torch()
    from torch.utils._python_dispatch import TorchDispatchMode

    registry = _formulas()

    class FlopCounter(TorchDispatchMode):
        """Counts FLOPs of every ATen op dispatched on meta tensors (see the module docstring)."""

        def __init__(self):
            super().__init__()
            self.total = 0.0
            self.formula = 0.0
            self.unknown: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            formula = registry.get(packet)
            if formula is not None:
                flops = float(formula(*args, **kwargs, out_val=out))
                self.total += flops
                self.formula += flops
                return out
            op = f"{packet._qualified_op_name}" if hasattr(packet, "_qualified_op_name") else str(packet)
            op = op.replace(".", "::", 1) if "::" not in op else op
            rule = flop_rules.rule_for(op)
            if rule is None:
                self.unknown.add(op)
            elif rule.per_element:
                basis = out if rule.basis == "output" else (args[0] if args else out)
                tensors = [t for t in (basis if isinstance(basis, (tuple, list)) else (basis,))
                           if isinstance(t, torch.Tensor)]
                if tensors:  # a foreach op: every tensor of its list; otherwise the first (values, not indices)
                    counted = tensors if flop_rules.base_op(op)[1] else tensors[:1]
                    self.total += rule.per_element * float(sum(t.numel() for t in counted))
            return out

    return FlopCounter


def _FlopCounter():  # noqa: N802 - the class is built on first use (it needs torch)
    return _counter_class()()


def _shape(x):
    """A tensor's shape; a shape as is (FlopCounterMode's custom mappings receive shapes)."""
    return tuple(getattr(x, "shape", x))


#: Formulas the registry lacks, built from the registry's own: CPU flash attention and the scaled-dot-product
#: attention entry points (the composite ``aten::scaled_dot_product_attention`` an eager model calls, its math and
#: backend-overridable variants) have the work PyTorch counts for its CUDA attention kernels: q @ k^T and
#: attention @ v over the full s_q x s_k square, causal or not (``sdpa_flop_count``).
def _sdpa_cpu():
    from torch.utils.flop_counter import sdpa_flop_count

    def formula(query, key, value, *args, out_val=None, **kwargs):
        return sdpa_flop_count(_shape(query), _shape(key), _shape(value))

    return formula


def _sdpa_cpu_backward():
    from torch.utils.flop_counter import sdpa_backward_flop_count

    def formula(grad_out, query, key, value, *args, out_val=None, **kwargs):
        return sdpa_backward_flop_count(_shape(grad_out), _shape(query), _shape(key), _shape(value))

    return formula


EXTRA_FORMULAS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_cpu_backward,
    "aten::scaled_dot_product_attention": _sdpa_cpu,
    "aten::_scaled_dot_product_attention_math": _sdpa_cpu,
    "aten::_scaled_dot_product_attention_math_for_mps": _sdpa_cpu,
    "aten::_scaled_dot_product_fused_attention_overrideable": _sdpa_cpu,
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_cpu_backward,
}


#: The GEMMs and convolutions Inductor's CPU freezing calls with a prepacked weight (oneDNN's ``mkldnn::*_pointwise``,
#: MKL's ``mkl::_mkl_linear``), their element-wise epilogue fused in (``attr``: relu, gelu ...; ``binary_attr``:
#: add ...). Their work comes from the recorded shapes, not a meta replay: the packed weight is an opaque blob
#: (``_mkl_linear``'s is [1459233, 1] for a [2, 32] weight; oneDNN's has strides [1, 0, 0, 0]) and the epilogue
#: is named by strings. Per op: argument positions by argument count (schemas of torch 2.13's
#: ``torch.ops.mkldnn``/``torch.ops.mkl``): the input, the weight (its logical shape: ``_mkl_linear``'s
#: ``ORI_W``), the bias, a binary epilogue's other operand, the padding/stride/dilation/groups of a convolution,
#: the epilogue's strings, and whether the other operand is the output (in-place ``_convolution_pointwise_``).
PACKED_WEIGHT_OPS = {
    # name: {argument count: positions}
    "mkldnn::_convolution_pointwise": {
        10: dict(x=0, w=1, b=2, padding=3, stride=4, dilation=5, groups=6, unary=7),
        13: dict(x=0, other=1, w=2, b=3, padding=4, stride=5, dilation=6, groups=7, binary=8, unary=10)},
    "mkldnn::_convolution_pointwise_": {
        13: dict(other=0, x=1, w=2, b=3, padding=4, stride=5, dilation=6, groups=7, binary=8, unary=10,
                 in_place=True)},
    "mkldnn::_convolution_transpose_pointwise": {
        11: dict(x=0, w=1, b=2, padding=3, output_padding=4, stride=5, dilation=6, groups=7, unary=8,
                 transposed=True)},
    "mkldnn::_linear_pointwise": {
        6: dict(x=0, w=1, b=2, unary=3),
        5: dict(x=0, other=1, w=2, b=3, binary=4)},
    "mkl::_mkl_linear": {5: dict(x=0, w=2, b=3)},
}


def _packed_weight_work(name, dims, types, concrete, recorded, dtype) -> CallWork:
    """FLOPs and ideal bytes of a :data:`PACKED_WEIGHT_OPS` call. The GEMM or convolution counts what
    ``torch.utils.flop_counter`` counts for ``aten::mm``/``aten::convolution`` of the same shapes (2 * M * N * K;
    2 * N * C_out * C_in/groups * kernel elements * output positions, input positions for a transposed one; no
    bias), its epilogue one FLOP per output element per element-wise op (as :mod:`.flop_rules` counts the eager
    ops it replaces). Bytes: input, logical weight, bias and other operand read, the output written."""
    positions = PACKED_WEIGHT_OPS[name].get(len(dims))
    if positions is None:
        return CallWork(None, None, None, None, None, dtype,
                        f"{name} with {len(dims)} arguments: not a schema this version knows")
    values = (recorded or {}).get("values")

    def value(key):
        i = positions[key]
        if values is not None and values[i] is not None:
            return values[i]
        return _parse_scalar(concrete[i]) if concrete[i] not in ("", None) else None

    def shape(key):
        i = positions.get(key)
        d = dims[i] if i is not None else None
        return list(d) if isinstance(d, list) and d and all(isinstance(v, int) for v in d) else None

    x, w = shape("x"), shape("w")
    if x is None or w is None:
        return CallWork(None, None, None, None, None, dtype, f"{name}: the input or weight shape was not recorded")
    if "padding" in positions:
        spatial = len(w) - 2
        try:
            padding, stride, dilation = (list(value(k)) for k in ("padding", "stride", "dilation"))
            groups = int(value("groups"))
            if positions.get("transposed"):
                out_pad = list(value("output_padding"))
                out_spatial = [(size - 1) * s - 2 * p + d * (k - 1) + op + 1 for size, s, p, d, k, op in
                               zip(x[2:], stride, padding, dilation, w[2:], out_pad)]
                out = [x[0], w[1] * groups, *out_spatial]
                positions_counted = math.prod(x[2:])
            else:
                out_spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, s, p, d, k in
                               zip(x[2:], stride, padding, dilation, w[2:])]
                out = [x[0], w[0], *out_spatial]
                positions_counted = math.prod(out_spatial)
        except (TypeError, ValueError):
            return CallWork(None, None, None, None, None, dtype,
                            f"{name}: padding, stride, dilation or groups were not recorded")
        if len(x) != spatial + 2 or any(v <= 0 for v in out[2:]):
            return CallWork(None, None, None, None, None, dtype, f"{name}: input {x} and weight {w} do not fit")
        formula = 2 * x[0] * positions_counted * math.prod(w)  # w: C_out x C_in/groups x kernel (or transposed)
    else:
        if x[-1] != w[-1] or len(w) != 2:
            return CallWork(None, None, None, None, None, dtype, f"{name}: input {x} and weight {w} do not fit")
        out = [*x[:-1], w[0]]
        formula = 2 * math.prod(x[:-1]) * w[0] * w[1]
    epilogue = 0
    for key in ("binary", "unary"):
        if key not in positions:
            continue
        attr = value(key)
        if attr is None and values is None:
            return CallWork(None, None, None, None, None, dtype,
                            f"{name}: its fused element-wise op ({key} attr) was not recorded")
        epilogue += 0 if attr in (None, "", "none") else 1
    torch = _torch()
    itemsize = torch.empty((), dtype=getattr(torch, dtype or "float32")).element_size()
    operands = [x, w, shape("b"), shape("other")]
    read = sum(math.prod(s) for s in operands if s is not None) * itemsize
    written = math.prod(out) * itemsize
    flops = float(formula + epilogue * math.prod(out))
    return CallWork(flops, float(formula), float(read), float(written), "pytorch_formula", dtype)
