"""Analytic work of TorchInductor's generated kernels (C++ and Triton), from the debug directory.

* FLOPs: the sum over the kernel's post-grad FX nodes (the fusion map's ``post_grad_nodes``, else those of
  its ``source_nodes`` that are post-grad nodes; not those of ops an extern call computes, its
  ``listed_not_computed``) of each node's count: for an op a PyTorch FLOP formula covers
  (``torch.utils.flop_counter``'s registry: a GEMM or convolution template, flex attention), that formula on
  the shapes of the node's arguments, provided this is the only generated kernel of the graph that lists the
  node (Inductor's provenance can list one node on several kernels, e.g. a layout copy and the template: which
  one computes it is then unknown, and so are its FLOPs, said so); else the per-element rule of
  :mod:`.flop_rules` on the node's output (or, for a reduction, its input) shape, read from the
  ``name: "f32[2, 32, 64]" = torch.ops.aten...`` annotations of ``fx_graph_transformed.py`` (else
  ``fx_graph_readable.py``). A higher-order op (``torch.ops.higher_order.*``) without a formula has no rule:
  the kernel's FLOPs are unknown, never counted as 0.
* Bytes: the kernel's own buffer arguments at its call site in ``output_code.py``: each argument passed to
  an ``in_ptr`` parameter is read, ``out_ptr`` written, ``in_out_ptr`` both; its size is the buffer's
  (``empty_strided_*``, ``reinterpret_tensor`` views, ``assert_size_stride`` graph inputs) and its dtype
  the buffer's or the FX placeholder's.

Extern and fallback calls (``extern_kernels.addmm``) are ATen ops in the timeline with recorded shapes:
their work comes from :mod:`.op_calls`, not from here.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pandas as pd

from ..attribution import inductor
from . import flop_rules

WORK_COLUMNS = ["graph", "call_index", "flops", "flops_formula", "bytes_read", "bytes_written", "flops_rule", "dtype",
                "note"]
#: The columns :func:`with_fused_work` adds to a fusion map (``work_`` + the work column).
FUSION_MAP_WORK_COLUMNS = [f"work_{c}" for c in WORK_COLUMNS[2:]]

_FX_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
              "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "b8": "bool",
              "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "c64": "complex64"}
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
             "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8}
# `name: "f32[2, 32, 64]" = torch.ops.aten.add.Tensor(a, b)`; multi-output nodes have no annotation.
_NODE_RE = re.compile(r'^\s*(\w+)(?:\s*:\s*"([a-z0-9]+)\[([^\]]*)\]")?\s*=\s*torch\.ops\.(\w+)\.(\w+)\.\w+\((.*)$',
                      re.M)
# `flex_attention = torch.ops.higher_order.flex_attention(arg0_1, arg0_1, arg0_1, sdpa_score0, (...), 0.125, ...)`
_HOP_RE = re.compile(r'^\s*(\w+)(?:\s*:\s*"([a-z0-9]+)\[([^\]]*)\]")?\s*=\s*torch\.ops\.(higher_order)\.(\w+)\((.*)$',
                     re.M)
_PLACEHOLDER_RE = re.compile(r'(\w+)\s*:\s*"([a-z0-9]+)\[([^\]]*)\]"')
# a call of something other than an operator: a post-grad pattern's replacement (`fn_1: "f32[2, 8, 16, 16]" =
# torch__inductor_fx_passes_mkldnn_fusion_fn(arg11_1, ...)`, which an extern call of the graph runs): its
# annotation sizes what reads it; its work is unknown unless an extern call lists it (op `opaque::<callee>`)
_OPAQUE_RE = re.compile(r'^\s*(\w+)\s*:\s*"([a-z0-9]+)\[([^\]]*)\]"\s*=\s*(?!torch\.ops\.)([A-Za-z_][\w.]*)\((.*)$',
                        re.M)
# a constant of a frozen graph: `add_tensor: "f32[8]" = self._frozen_param24` (a get_attr node: no arithmetic)
_CONSTANT_NODE_RE = re.compile(r'^\s*(\w+)\s*:\s*"([a-z0-9]+)\[([^\]]*)\]"\s*=\s*self\.(\w+)\s*$', re.M)
_BUFFER_RE = re.compile(r"^(\w+)\s*=\s*empty_strided_\w+\((.*)\)\s*$")
# `buf1 = buf0; del buf0  # reuse`; `buf20 = reinterpret_tensor(buf23, (2, 16, 64), (3072, 192, 1), 0)  # alias`
_ALIAS_RE = re.compile(r"^(\w+)\s*=\s*(\w+)\s*(?:;\s*del\s+\w+\s*)?#\s*(?:reuse|alias)")
_VIEW_RE = re.compile(r"^(\w+)\s*=\s*reinterpret_tensor\((.*)\)\s*(?:;\s*del\s+\w+\s*)?(?:#.*)?$")
_ASSERT_RE = re.compile(r"^assert_size_stride\((\w+),\s*(\(.*?\)),")
#: A constant of the compiled graph at module level (freezing's ``_frozen_param3``, a lifted constant), its device,
#: dtype, size and stride in the comment Inductor writes: ``_frozen_param3 = None  # device(type='cpu')
#: torch.float32 (768,) (1,) 7f8e...``.
_CONSTANT_RE = re.compile(r"^(\w+) = None  # device\(type='\w+'(?:, index=\d+)?\) torch\.(\w+) \(([\d, ]*)\) "
                          r"\(([\d, ]*)\)", re.M)
_CPP_SIGNATURE_RE = re.compile(r'extern\s+"C"\s+void\s+kernel\(([^)]*)\)', re.S)
_TRITON_SIGNATURE_RE = re.compile(r"def\s+(triton_\w*)\(([^)]*)\)")
_PTR_RE = re.compile(r"\b((?:in_out|in|out)_ptr\d+)\b")


def fused_kernel_work(graph_dir: Path, fusion_map: pd.DataFrame) -> pd.DataFrame:
    """Work of the generated (``cpp``/``triton``) kernels of one graph's fusion-map rows.

    Returns one row per such row: :data:`WORK_COLUMNS` (FLOPs, bytes; ``flops``/``bytes_*`` null with a
    ``note`` when the debug files do not tell). Raises :class:`~..attribution.inductor.InductorArtifactError`
    for a missing or malformed ``output_code.py`` (as the fusion map does).
    """
    graph_dir = Path(graph_dir)
    code_path = graph_dir / inductor.OUTPUT_CODE
    text = code_path.read_text(encoding="utf-8")
    nodes, placeholders = _fx_nodes(graph_dir)
    sites = _call_sites(text, code_path)
    params = _kernel_params(text)
    buffers: dict[str, tuple[tuple, str | None]] = {m.group(1): (_shape(m.group(3)), m.group(2))
                                                    for m in _CONSTANT_RE.finditer(text)}
    buffers.update({n: (shape, dtype) for n, (dtype, shape) in placeholders.items()})
    rows = []
    rows_of_graph = fusion_map[fusion_map["graph"] == graph_dir.name]
    by_index = {int(r["call_index"]): r for r in rows_of_graph.to_dict("records")}
    listing: dict[str, int] = {}  # post-grad node -> how many generated kernels of the graph list it
    extern_nodes: set[str] = set()  # nodes an extern or fallback call of the graph lists: that call computes them
    for r in by_index.values():
        if r.get("kind") in ("cpp", "triton"):
            for name in set(_listed(r)):
                listing[name] = listing.get(name, 0) + 1
        else:
            extern_nodes.update(_listed(r))
    for call_index, (line, kernel, kdef) in enumerate(_walk(sites, buffers)):
        row = by_index.get(call_index)
        if row is None or kdef.kind not in ("cpp", "triton"):
            continue
        flops, dtype, note, formula_flops = _node_flops(row, nodes, placeholders, listing, extern_nodes)
        read, written, byte_note = _argument_bytes(line, kernel, params.get(kernel), buffers)
        if dtype is None:  # a kernel that only moves data: the dtype of what it moves
            dtype = next((d for _, d, _ in params.get(kernel) or [] if d and d.startswith(("float", "bfloat"))), None)
        rows.append({"graph": graph_dir.name, "call_index": call_index, "flops": flops,
                     "flops_formula": None if flops is None else formula_flops, "bytes_read": read,
                     "bytes_written": written, "flops_rule": None if flops is None else "fused_nodes",
                     "dtype": dtype, "note": "; ".join(n for n in (note, byte_note) if n) or None})
    return pd.DataFrame(rows, columns=WORK_COLUMNS)


def _call_sites(text: str, code_path: Path) -> list[tuple[str, str | None, object]]:
    """Every line of ``call()`` in order, with the kernel it calls (as the fusion map numbers call sites)."""
    kernels = inductor._kernel_defs(text)
    out = []
    for raw in inductor._call_body(text, code_path):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        call = inductor._match_call(line, kernels)
        out.append((line, *(call if call is not None else (None, None))))
    return out


def _walk(sites, buffers):
    """Yield the kernel calls in order, keeping ``buffers`` (name -> (shape, dtype)) current up to each."""
    for line, kernel, kdef in sites:
        if kernel is None:
            _track_buffer(line, buffers)
            continue
        yield line, kernel, kdef


def _track_buffer(line: str, buffers: dict) -> None:
    if m := _BUFFER_RE.match(line):
        try:
            call = ast.parse(f"f({m.group(2)})", mode="eval").body
            shape = ast.literal_eval(call.args[0])
            dtype_node = call.args[2] if len(call.args) > 2 else None
            dtype = dtype_node.attr if isinstance(dtype_node, ast.Attribute) else None
            buffers[m.group(1)] = (tuple(shape), dtype)
        except (SyntaxError, ValueError, IndexError):
            buffers.pop(m.group(1), None)
    elif m := _ALIAS_RE.match(line):
        if m.group(2) in buffers:
            buffers[m.group(1)] = buffers[m.group(2)]
    elif m := _VIEW_RE.match(line):
        resolved = _resolve(ast.parse(f"reinterpret_tensor({m.group(2)})", mode="eval").body, buffers)
        if resolved is not None:
            buffers[m.group(1)] = resolved
    elif m := _ASSERT_RE.match(line):
        try:
            shape = tuple(ast.literal_eval(m.group(2)))
        except (SyntaxError, ValueError):
            return
        buffers[m.group(1)] = (shape, (buffers.get(m.group(1)) or ((), None))[1])


def _resolve(node, buffers) -> tuple[tuple, str | None] | None:
    """(shape, dtype) of a call-site argument: a buffer name or ``reinterpret_tensor(buf, size, stride, off)``."""
    if isinstance(node, ast.Name):
        return buffers.get(node.id)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "reinterpret_tensor" and node.args:
        base = _resolve(node.args[0], buffers)
        try:
            shape = tuple(ast.literal_eval(node.args[1]))
        except (ValueError, IndexError, SyntaxError):
            return None
        return (shape, base[1] if base else None)
    return None


_C_TYPES = {"float": "float32", "double": "float64", "bfloat16": "bfloat16", "at::BFloat16": "bfloat16",
            "c10::BFloat16": "bfloat16", "half": "float16", "at::Half": "float16", "c10::Half": "float16",
            "int64_t": "int64", "int32_t": "int32", "int16_t": "int16", "int8_t": "int8", "uint8_t": "uint8",
            "bool": "bool"}
_TRITON_TYPES = {"*fp32": "float32", "*fp64": "float64", "*bf16": "bfloat16", "*fp16": "float16", "*i64": "int64",
                 "*i32": "int32", "*i16": "int16", "*i8": "int8", "*u8": "uint8", "*i1": "bool",
                 "*fp8e4nv": "float8_e4m3fn", "*fp8e5": "float8_e5m2"}
_TRITON_META_RE = re.compile(r"triton_meta=\{'signature':\s*(\{[^}]*\})")


def _kernel_params(text: str) -> dict[str, list[tuple[str, str | None, str | None]]]:
    """Kernel name -> its parameters as (name, element dtype of a pointer parameter or None, role), from its
    source: the C++ signature's pointer types, or Triton's ``triton_meta['signature']`` (keyed by position or
    name). ``role``: ``scalar`` for a parameter that is no pointer; for a pointer ``read``, ``written`` or
    ``both`` (``in_ptr``, ``out_ptr``, ``in_out_ptr``; a template's own parameters: a C++ GEMM template's
    ``const float* X`` is read and its ``float* Y`` written, a Triton template's ``arg_A`` read), or None when
    its name does not say."""
    starts = list(inductor._KERNEL_DEF_RE.finditer(text))
    out = {}
    for i, m in enumerate(starts):
        seg = text[m.start(): starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        if m.group(2).startswith("cpp"):
            sig = _CPP_SIGNATURE_RE.search(seg)
            if sig is None:
                continue
            params = []
            for p in sig.group(1).split(","):
                words = p.replace("*", " * ").split()
                if not words:
                    continue
                ctype = [w for w in words[:-1] if w not in ("const", "*", "__restrict__")]
                pointer = "*" in words
                role = _role(words[-1], ("read" if "const" in words else "written") if pointer else "scalar")
                params.append((words[-1], _C_TYPES.get(ctype[-1]) if ctype and pointer else None, role))
            out[m.group(1)] = params
        elif m.group(2) == "triton":
            sig = _TRITON_SIGNATURE_RE.search(seg)
            meta = _TRITON_META_RE.search(seg)
            if sig is None:
                continue
            names = [p.split(":")[0].strip() for p in sig.group(2).split(",") if p.strip()]
            try:
                types = ast.literal_eval(meta.group(1)) if meta else {}
            except (ValueError, SyntaxError):
                types = {}
            params = []
            for j, n in enumerate(names):
                ttype = types.get(n, types.get(j))
                pointer = isinstance(ttype, str) and ttype.startswith("*")
                params.append((n, _TRITON_TYPES.get(ttype),
                               _role(n, ("read" if n.startswith("arg_") else None) if pointer else "scalar")))
            out[m.group(1)] = params
    return out


def _role(name: str, otherwise: str | None) -> str | None:
    """A parameter's role by Inductor's naming (``in_ptr0`` read, ``out_ptr0`` written, ``in_out_ptr0`` both),
    else ``otherwise``."""
    if _PTR_RE.fullmatch(name):
        return "both" if name.startswith("in_out_ptr") else "read" if name.startswith("in_ptr") else "written"
    return otherwise


def _argument_bytes(line: str, kernel: str, params: list[tuple[str, str | None, str | None]] | None,
                    buffers) -> tuple[float | None, float | None, str | None]:
    if params is None:
        return None, None, f"no signature found for {kernel}"
    try:
        call = ast.parse(line, mode="eval").body
    except SyntaxError:
        return None, None, f"call of {kernel} not parsable"
    read = written = 0.0
    for (name, elem_dtype, role), arg in zip(params, call.args):
        if role == "scalar":
            continue
        if role is None:  # a pointer its name does not describe: never skipped as if it moved nothing
            return None, None, f"whether {kernel} reads or writes its pointer parameter {name} is not known"
        resolved = _resolve(arg, buffers)
        dtype = elem_dtype or (resolved[1] if resolved else None)
        if resolved is None or dtype not in _ITEMSIZE:
            return None, None, f"size or dtype of {ast.unparse(arg)} (argument {name} of {kernel}) not found"
        size = math.prod(resolved[0]) * _ITEMSIZE[dtype]
        if role in ("read", "both"):
            read += size
        if role in ("written", "both"):
            written += size
    return read, written, None


def _fx_nodes(graph_dir: Path) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Post-grad node name -> (dtype, shape, op, first argument name, the call's argument text); placeholders ->
    (dtype, shape). A higher-order op's node is named ``higher_order::<op>``."""
    nodes: dict[str, tuple] = {}
    placeholders: dict[str, tuple] = {}
    for fname in inductor.FX_GRAPH_FILES:  # readable first; transformed (post-grad passes) overrides
        p = graph_dir / fname
        if not p.is_file():
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        sig = re.search(r"def forward\(self,?(.*?)\):", text, re.S)
        if sig:
            for m in _PLACEHOLDER_RE.finditer(sig.group(1)):
                placeholders[m.group(1)] = (_FX_DTYPES.get(m.group(2)), _shape(m.group(3)))
        for m in _CONSTANT_NODE_RE.finditer(text):  # read like an input: no arithmetic of its own
            placeholders[m.group(1)] = (_FX_DTYPES.get(m.group(2)), _shape(m.group(3)))
        for m in _OPAQUE_RE.finditer(text):
            first = re.match(r"\s*(\w+)", m.group(5))
            nodes[m.group(1)] = (_FX_DTYPES.get(m.group(2)), _shape(m.group(3)), f"opaque::{m.group(4)}",
                                 first.group(1) if first else None, _call_arguments(m.group(5)))
        for regex in (_NODE_RE, _HOP_RE):
            for m in regex.finditer(text):
                first = re.match(r"\s*(\w+)", m.group(6))
                nodes[m.group(1)] = (_FX_DTYPES.get(m.group(2)) if m.group(2) else None,
                                     _shape(m.group(3)) if m.group(2) else None,
                                     f"{m.group(4)}::{m.group(5)}", first.group(1) if first else None,
                                     _call_arguments(m.group(6)))
    return nodes, {k: (d, s) for k, (d, s) in placeholders.items()}


def _call_arguments(rest: str) -> str | None:
    """The argument text of a node's call from the text after its ``(`` (``a, b);  a = b = None`` -> ``a, b``);
    None when its closing parenthesis is not on the line."""
    depth = 0
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            if ch == quote and rest[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return rest[:i] if ch == ")" else None
            depth -= 1
    return None


def _shape(text: str) -> tuple | None:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        return None  # symbolic sizes (s0): not countable


def _shape_of(name: str | None, nodes: dict, placeholders: dict) -> tuple | None:
    if name in nodes:
        return nodes[name][1]
    if name in placeholders:
        return placeholders[name][1]
    return None


def _listed(row: dict) -> list:
    """The FX nodes a fusion-map row lists: its ``post_grad_nodes``, else its ``source_nodes``."""
    post_grad = row.get("post_grad_nodes")
    source = row.get("source_nodes")
    return list(post_grad) if post_grad is not None and len(post_grad) else (list(source) if source is not None else [])


def _node_flops(row: dict, nodes: dict, placeholders: dict, listing: dict | None = None,
                extern_nodes: set | frozenset = frozenset()) -> tuple[float | None, str | None, str | None, float]:
    """(FLOPs, dtype, note, the part of the FLOPs PyTorch's formulas counted) of one generated kernel's nodes;
    ``listing``: node -> how many generated kernels of the graph list it (a formula op listed by more than one
    is unknown); ``extern_nodes``: nodes an extern or fallback call of the graph lists, whose work is that
    call's (a frozen conv's fused ReLU, listed by the kernel that lays out its input too)."""
    listed = _listed(row)
    wanted = [n for n in listed if n in nodes and n not in extern_nodes]
    if not wanted and listed and all(n in placeholders or n in extern_nodes for n in listed):
        # it reads inputs or constants for a call that computes elsewhere (a layout copy, a bias copy): no arithmetic
        return 0.0, None, None, 0.0
    if not wanted:
        return None, None, ("no FX nodes recorded for this call site (torch 2.13 writes Inductor's provenance for "
                            "forward graphs only, and this kernel has no Source Nodes comment): its FLOPs are "
                            "unknown"), 0.0
    total, formula_total, dtype, unknown, uncounted = 0.0, 0.0, None, [], []
    # ops the kernel's provenance lists but an extern call of the graph computes (a conv's input-layout kernel
    # lists the convolution): their FLOPs are that call's
    elsewhere = set(row.get("listed_not_computed") if row.get("listed_not_computed") is not None else [])
    for name in wanted:
        ndtype, shape, op, first = nodes[name][:4]
        if op in elsewhere:
            continue
        formula = _formula_of(op)
        if formula is not None:
            shared = (listing or {}).get(name, 1)
            if shared > 1:
                uncounted.append(f"{op} (node {name} is listed by {shared} generated kernels: which one computes "
                                 "it is not known)")
                continue
            flops, why = _formula_flops(formula, nodes[name], nodes, placeholders)
            if flops is None:
                uncounted.append(f"{op} ({why})")
                continue
            total += flops
            formula_total += flops
            if dtype is None:
                dtype = _first_floating(nodes[name], nodes, placeholders)
            continue
        rule = flop_rules.rule_for(op)
        if rule is None:
            unknown.append(op)
            continue
        if rule.per_element == 0:
            continue
        basis = shape if rule.basis == "output" else _shape_of(first, nodes, placeholders)
        if basis is None:
            unknown.append(f"{op} (shape of {name if rule.basis == 'output' else first} unknown)")
            continue
        total += rule.per_element * math.prod(basis)
        if dtype is None and ndtype and ndtype.startswith(("float", "bfloat")):
            dtype = ndtype
    if unknown or uncounted:
        notes = ([f"no FLOP rule for {', '.join(sorted(set(unknown)))}"] if unknown else []) + \
            ([f"PyTorch's FLOP formula not applied to {', '.join(sorted(set(uncounted)))}"] if uncounted else [])
        return None, dtype, "; ".join(notes), 0.0
    return total, dtype, None, formula_total


def _formula_of(op: str):
    """PyTorch's FLOP formula for ``op`` (``aten::mm``, ``higher_order::flex_attention``), or None."""
    from .op_calls import _formulas, _torch

    ns, _, name = op.partition("::")
    try:
        packet = getattr(getattr(_torch().ops, ns), name)
    except (AttributeError, RuntimeError):
        return None
    return _formulas().get(packet)


def _formula_flops(formula, node: tuple, nodes: dict, placeholders: dict) -> tuple[float | None, str | None]:
    """The formula on the node's arguments as meta tensors of their annotated shapes and dtypes, its output
    that of its annotation; (None, why) when an argument is not known."""
    torch = __import__("torch")
    text = node[4] if len(node) > 4 else None
    if text is None:
        return None, "its arguments are not in the FX graph"
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError:
        return None, "its arguments are not parsable"

    def value(expr):
        if isinstance(expr, ast.Name):
            known = nodes.get(expr.id) or placeholders.get(expr.id)
            if known is None or known[0] is None or known[1] is None:
                return _Unknown(expr.id)  # a subgraph (flex attention's score_mod) or a node without annotation
            return torch.empty(known[1], dtype=getattr(torch, known[0]), device="meta")
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "torch":
            return getattr(torch, expr.attr, _Unknown(ast.unparse(expr)))
        if isinstance(expr, (ast.Tuple, ast.List)):
            items = [value(e) for e in expr.elts]
            return tuple(items) if isinstance(expr, ast.Tuple) else items
        try:
            return ast.literal_eval(expr)
        except ValueError:
            return _Unknown(ast.unparse(expr))

    args = [value(a) for a in call.args]
    kwargs = {k.arg: value(k.value) for k in call.keywords if k.arg}
    out = (torch.empty(node[1], dtype=getattr(torch, node[0]), device="meta")
           if node[0] is not None and node[1] is not None else None)
    try:
        return float(formula(*args, **kwargs, out_val=out)), None
    except Exception as exc:  # noqa: BLE001 - an argument it needed is unknown, or the formula refused it
        return None, f"PyTorch's formula could not count it: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


class _Unknown:
    """An argument whose value the FX text does not give; a formula that reads it fails, and the FLOPs are
    unknown."""

    def __init__(self, text: str):
        self.text = text

    def __getattr__(self, name):
        raise ValueError(f"argument {self.text} is not known")


def _first_floating(node: tuple, nodes: dict, placeholders: dict) -> str | None:
    """The dtype of the node's first floating-point argument (what its compute ceiling is), else its own."""
    for name in re.findall(r"\b(\w+)\b", node[4] or "") if len(node) > 4 else []:
        known = nodes.get(name) or placeholders.get(name)
        if known is not None and known[0] and known[0].startswith(("float", "bfloat")):
            return known[0]
    return node[0]


def with_fused_work(fusion_map: pd.DataFrame, graph_dirs: list[Path]) -> pd.DataFrame:
    """``fusion_map`` with :data:`FUSION_MAP_WORK_COLUMNS` (null for extern/fallback rows, whose work the
    timeline's recorded shapes give)."""
    parts = [fused_kernel_work(d, fusion_map) for d in graph_dirs]
    work = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else \
        pd.DataFrame(columns=WORK_COLUMNS)
    work = work.rename(columns={c: f"work_{c}" for c in WORK_COLUMNS[2:]})
    work["call_index"] = work["call_index"].astype("int64")
    out = fusion_map.merge(work, on=["graph", "call_index"], how="left")
    for c in ("work_flops", "work_flops_formula", "work_bytes_read", "work_bytes_written"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    for c in ("work_flops_rule", "work_dtype", "work_note"):
        out[c] = out[c].astype(object).where(out[c].notna(), None)
    return out
