"""Module paths of compiled FX nodes from a TORCH_TRACE log, on logs written here as torch 2.13
writes them (docs/formats.md#inductor-torch_trace-log: glog-prefixed JSON records, tab-indented payloads, the
Dynamo graph as print_readable prints it) and on the real torch 2.13 debug dirs of
../shared/data/real/inductor-cpu (a pre-LN transformer block compiled whole, trained: a forward and a backward
graph), whose output_code.py and provenance JSON are used unchanged. Expected entries are read off the graphs
written here (which node reads which module's parameters, what lies between), never from the code under test."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import REAL_DATA, need_real

from operator_profiler import layers
from operator_profiler.attribution import inductor
from operator_profiler.attribution.torch_trace import infer_layers, node_entries, read_frames, sanitized

MODULE_PY = "/usr/lib/python3/site-packages/torch/nn/modules/module.py"
PREFIX = "V1205 00:06:57.374000 19188 torch/_dynamo/output_graph.py:2841] "


def _record(meta: dict, payload: str | None = None) -> str:
    """One TORCH_TRACE record: the glog prefix, the metadata JSON, then the payload lines each behind a tab."""
    if payload is None:
        return PREFIX + json.dumps(meta) + "\n"
    meta = {**meta, "has_payload": hashlib.md5(payload.encode()).hexdigest()}
    return PREFIX + json.dumps(meta) + "\n" + "".join(f"\t{line}\n" for line in payload.splitlines())


def _frame_records(params: dict[str, list], graph: list[tuple[str, str]], calls: int = 1, frame=(0, 0),
                   root: str = "self", inputs=(("x", [2, 8]),)) -> str:
    """The records of one compiled frame: its stack (``calls`` module calls, the last frame the compiled
    forward), the sources and shapes of its inputs (``params``: ``"blocks.0.ln.weight"`` -> shape), and its
    Dynamo graph (``graph``: ``(node, expr)``, where ``P(blocks.0.ln.weight)`` stands for that parameter's node)."""
    ids = {"frame_id": frame[0], "frame_compile_id": frame[1], "attempt": 0}
    stack = [{"line": 18, "name": "<module>", "filename": 1, "loc": "model(x)"}]
    for _ in range(calls):
        stack += [{"line": 1778, "name": "_wrapped_call_impl", "filename": 3, "loc": "return self._call_impl()"},
                  {"line": 1789, "name": "_call_impl", "filename": 3, "loc": "return forward_call(*args)"},
                  {"line": 12, "name": "forward", "filename": 1}]
    out = _record({"str": ["/home/u/model.py", 1]}) + _record({"str": [MODULE_PY, 3]})
    out += _record({"dynamo_start": {"stack": stack}, **ids})
    names = {}
    for i, (name, shape) in enumerate([*((f"x:{n}", s) for n, s in inputs), *params.items()]):
        if name.startswith("x:"):
            source = f"L['{name[2:]}']"
        else:
            *mods, param = name.split(".")
            source = f"L['{root}']" + "".join(f"._modules['{m}']" for m in mods) + f"._parameters['{param}']"
        names[name] = sanitized(source)
        out += _record({"describe_tensor": {"id": i, "size": shape}, **ids})
        out += _record({"describe_source": {"describer_id": 0, "id": i, "source": source}, **ids})
    lines = ["class GraphModule(torch.nn.Module):",
             "    def forward(self, " + ", ".join(f'{n}: "f32[2]"' for n in names.values()) + "):"]
    lines += [f"        {n.lower()} = {n}" for n in names.values()]
    lines.append("")
    for node, expr in graph:
        for name in params:
            expr = expr.replace(f"P({name})", names[name].lower())
        lines.append(f'        {node}: "f32[2, 8][8, 1]cpu" = {expr};  {node}_dead = None')
    lines.append("        return (x,)")
    return out + _record({"dynamo_output_graph": {"sizes": {}}, **ids}, "\n".join(lines))


def _write_log(folder: Path, text: str) -> Path:
    log = folder / "tlparse" / "dedicated_log_torch_trace_abc.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    return log


BLOCKS = {f"blocks.{i}.{m}.{p}": ([8, 8] if m == "fc" and p == "weight" else [8])
          for i in range(2) for m in ("ln", "fc") for p in ("weight", "bias")}
BLOCK_GRAPH = [  # x -> inp (outside) -> 2 x (ln, fc, relu, residual add) -> head
    ("linear", "torch._C._nn.linear(l_x_, P(inp.weight), P(inp.bias))"),
    ("mul", "linear * 11.0"),
    ("layer_norm", "torch.nn.functional.layer_norm(mul, (8,), P(blocks.0.ln.weight), P(blocks.0.ln.bias), 1e-05)"),
    ("linear_1", "torch._C._nn.linear(layer_norm, P(blocks.0.fc.weight), P(blocks.0.fc.bias))"),
    ("relu", "torch.relu(linear_1)"),
    ("x_1", "mul + relu"),
    ("layer_norm_1", "torch.nn.functional.layer_norm(x_1, (8,), P(blocks.1.ln.weight), P(blocks.1.ln.bias), 1e-05)"),
    ("linear_2", "torch._C._nn.linear(layer_norm_1, P(blocks.1.fc.weight), P(blocks.1.fc.bias))"),
    ("relu_1", "torch.relu(linear_2)"),
    ("x_2", "x_1 + relu_1"),
    ("linear_3", "torch._C._nn.linear(x_2, P(head.weight), P(head.bias))"),
    ("softmax", "torch.softmax(linear_3, -1)"),
]
PARAMS = {"inp.weight": [8, 8], "inp.bias": [8], **BLOCKS, "head.weight": [4, 8], "head.bias": [4]}


def test_a_node_takes_the_module_of_the_parameters_it_reads_and_the_others_lie_between(tmp_path):
    _write_log(tmp_path, _frame_records(PARAMS, BLOCK_GRAPH))
    (frame,) = read_frames(tmp_path).values()
    assert frame.compile_id == "0/0" and frame.scope == "model" and frame.roots == {"self"}
    assert node_entries(frame) == {
        "linear": "inp", "mul": "inp|blocks.0.ln", "layer_norm": "blocks.0.ln", "linear_1": "blocks.0.fc",
        "relu": "blocks.0.fc|blocks.1.ln", "x_1": "blocks.0.fc|blocks.1.ln", "layer_norm_1": "blocks.1.ln",
        "linear_2": "blocks.1.fc", "relu_1": "blocks.1.fc|head", "x_2": "blocks.1.fc|head", "linear_3": "head",
        "softmax": None}  # after the last parameter read: nothing bounds it
    assert infer_layers([frame]) == [
        {"path": f"blocks.{i}", "class": "Layer",
         "param_shapes": {"ln.weight": [8], "ln.bias": [8], "fc.weight": [8, 8], "fc.bias": [8]}} for i in range(2)]


def test_between_entries_name_a_layer_only_when_one_holds_both_ends():
    paths = {"blocks.0", "blocks.1"}
    assert layers.site_membership(["blocks.0.ln|blocks.0.fc"], "model", paths) == ("fx_nodes", "blocks.0", [])
    assert layers.site_membership(["blocks.0.fc|blocks.1.ln"], "model", paths) is None  # end of 0 or start of 1
    assert layers.site_membership(["inp|head"], "model", paths) == ("outside_layers", None, [])
    assert layers.site_membership(["blocks.0.fc", "blocks.0.fc|blocks.1.ln"], "model", paths) is None
    assert layers.site_membership(["blocks.0.fc", "blocks.1.ln"], "model", paths) == \
        ("cross_layer", None, ["blocks.0", "blocks.1"])


def test_modules_whose_calls_the_log_cannot_tell_apart_are_unknown(tmp_path):
    """A LayerNorm called twice (its weight read by two nodes), and a weight read outside its module's stretch
    (the head reading blocks.0.fc's weight after blocks.1: tied weights): their nodes, and what lies next to
    them, get no module; blocks.1's own nodes keep theirs."""
    graph = [
        ("layer_norm", "torch.nn.functional.layer_norm(l_x_, (8,), P(blocks.0.ln.weight), P(blocks.0.ln.bias))"),
        ("linear_1", "torch._C._nn.linear(layer_norm, P(blocks.0.fc.weight), P(blocks.0.fc.bias))"),
        ("layer_norm_2", "torch.nn.functional.layer_norm(linear_1, (8,), P(blocks.0.ln.weight), P(blocks.0.ln.bias))"),
        ("tanh", "torch.tanh(layer_norm_2)"),
        ("layer_norm_1", "torch.nn.functional.layer_norm(tanh, (8,), P(blocks.1.ln.weight), P(blocks.1.ln.bias))"),
        ("relu", "torch.relu(layer_norm_1)"),
        ("linear_2", "torch._C._nn.linear(relu, P(blocks.1.fc.weight), P(blocks.1.fc.bias))"),
        ("head", "torch._C._nn.linear(linear_2, P(blocks.0.fc.weight))"),
    ]
    _write_log(tmp_path, _frame_records(BLOCKS, graph))
    (frame,) = read_frames(tmp_path).values()
    assert node_entries(frame) == {
        "layer_norm": None, "linear_1": None, "layer_norm_2": None, "tanh": None, "layer_norm_1": "blocks.1.ln",
        "relu": "blocks.1.ln|blocks.1.fc", "linear_2": "blocks.1.fc", "head": None}


@pytest.mark.parametrize("calls, scope", [(1, "model"), (2, "frame"), (0, None)])
def test_the_frame_is_the_model_only_when_it_is_the_one_module_call_on_the_stack(tmp_path, calls, scope):
    """torch.compile(model) called from the script: one Module._call_impl on the stack; a block compiled and
    called inside the model's forward: two (its paths are relative to the block); a compiled function: none.
    Only frames of the model give layers."""
    _write_log(tmp_path, _frame_records(PARAMS, BLOCK_GRAPH, calls=calls))
    (frame,) = read_frames(tmp_path).values()
    assert frame.scope == scope
    assert [e["path"] for e in infer_layers([frame])] == (["blocks.0", "blocks.1"] if scope == "model" else [])


def test_parameters_of_two_frame_locals_or_with_one_name_for_two_sources_are_not_read(tmp_path):
    _write_log(tmp_path, _frame_records(PARAMS, BLOCK_GRAPH, frame=(0, 0))
               + _frame_records({"inp.weight": [8, 8]}, [("linear", "torch._C._nn.linear(l_x_, P(inp.weight))")],
                                frame=(1, 0), root="other", inputs=(("x", [2, 8]), ("self_", [1]))))
    frames = read_frames(tmp_path)
    assert frames["1/0"].roots == {"other"} and frames["1/0"].reads == {"linear": ["inp"]}
    # a second root in one frame: relative to which module? nothing is read
    text = _frame_records(PARAMS, BLOCK_GRAPH).replace("\"L['self']._modules['head']", "\"L['model']._modules['head']")
    _write_log(tmp_path, text)
    (frame,) = read_frames(tmp_path).values()
    assert frame.roots == {"self", "model"} and frame.reads == {}
    assert set(node_entries(frame).values()) == {None}
    # L['a.b'] and L['a_b'] have one input name: neither is used
    assert sanitized("L['a.b']") == sanitized("L['a_b']") == "L_a_b_"


def test_layers_are_the_outermost_repeated_children_with_equal_shapes(tmp_path):
    params = {
        **{f"enc.{i}.sub.{j}.w": [4] for i in range(2) for j in range(2)},  # nested repeats: enc.* wins
        "dec.0.w": [4], "dec.1.w": [8],  # different shapes: no layer
        "only.0.w": [4],  # one child: no layer
    }
    graph = [(f"n{i}", f"torch.relu(P({name}))") for i, name in enumerate(params)]
    _write_log(tmp_path, _frame_records(params, graph))
    (frame,) = read_frames(tmp_path).values()
    assert [(e["path"], e["param_shapes"]) for e in infer_layers([frame])] == [
        ("enc.0", {"sub.0.w": [4], "sub.1.w": [4]}), ("enc.1", {"sub.0.w": [4], "sub.1.w": [4]})]


# ------------------------------------------------------------------------------ the real torch 2.13 debug dirs

REAL = ("inductor-cpu", "torchinductor")  # ../shared/data/real/inductor-cpu/README.md
# gen_inductor_cpu.py's Block (ln1, qkv, proj, ln2, fc1, fc2; d=64, ff=128) as Dynamo traced it: the node names
# of the real provenance JSON's preToPost, in its order, with the getitems of `q, k, v = ...split()` between
REAL_PARAMS = {"ln1.weight": [64], "ln1.bias": [64], "qkv.weight": [192, 64], "qkv.bias": [192],
               "proj.weight": [64, 64], "proj.bias": [64], "ln2.weight": [64], "ln2.bias": [64],
               "fc1.weight": [128, 64], "fc1.bias": [128], "fc2.weight": [64, 128], "fc2.bias": [64]}
REAL_GRAPH = [
    ("layer_norm", "torch.nn.functional.layer_norm(l_x_, (64,), P(ln1.weight), P(ln1.bias), 1e-05)"),
    ("linear", "torch._C._nn.linear(layer_norm, P(qkv.weight), P(qkv.bias))"),
    ("split", "linear.split(64, dim = -1)"), ("q", "split[0]"), ("k", "split[1]"), ("v", "split[2]"),
    ("view", "q.view(2, 16, 4, 16)"), ("q_1", "view.transpose(1, 2)"),
    ("view_1", "k.view(2, 16, 4, 16)"), ("k_1", "view_1.transpose(1, 2)"),
    ("view_2", "v.view(2, 16, 4, 16)"), ("v_1", "view_2.transpose(1, 2)"),
    ("a", "torch._C._nn.scaled_dot_product_attention(q_1, k_1, v_1, is_causal = True)"),
    ("transpose_3", "a.transpose(1, 2)"), ("reshape", "transpose_3.reshape(2, 16, 64)"),
    ("linear_1", "torch._C._nn.linear(reshape, P(proj.weight), P(proj.bias))"),
    ("x", "l_x_ + linear_1"),
    ("layer_norm_1", "torch.nn.functional.layer_norm(x, (64,), P(ln2.weight), P(ln2.bias), 1e-05)"),
    ("linear_2", "torch._C._nn.linear(layer_norm_1, P(fc1.weight), P(fc1.bias))"),
    ("gelu", "torch._C._nn.gelu(linear_2)"),
    ("linear_3", "torch._C._nn.linear(gelu, P(fc2.weight), P(fc2.bias))"),
    ("x_1", "x + linear_3"),
]


def _real_debug_root(tmp_path: Path) -> tuple[Path, list[Path]]:
    """The two real graph dirs under ``run_x/torchinductor/`` and a TORCH_TRACE log linking both to compile id
    0/0 (``inductor_output_code``: the MD5 of each output_code.py, as torch logs it)."""
    source = need_real(REAL_DATA.joinpath(*REAL))
    root = tmp_path / "torch_compile_debug"
    dirs = []
    for name in ("model__0_forward_1.0", "model__0_backward_3.1"):
        dirs.append(root / "run_x" / "torchinductor" / name)
        shutil.copytree(source / name, dirs[-1])
    text = _frame_records(REAL_PARAMS, REAL_GRAPH, inputs=(("x", [2, 16, 64]),))
    for d in dirs:
        code = (d / "output_code.py").read_text()
        text += PREFIX + json.dumps({"inductor_output_code": {"filename": "/tmp/c.py"}, "frame_id": 0,
                                     "frame_compile_id": 0, "attempt": 0,
                                     "has_payload": hashlib.md5(code.encode()).hexdigest()}) + "\n"
        text += "".join(f"\t{line}\n" for line in code.splitlines())
    _write_log(root, text)
    return root, dirs


def test_the_real_forward_graph_gets_module_paths_and_the_backward_none(tmp_path):
    root, (forward, backward) = _real_debug_root(tmp_path)
    fusion = inductor.load_fusion_map(root)
    paths = {r.kernel + (f":{r.debug_handle}" if r.debug_handle == r.debug_handle else ""): list(r.module_paths)
             for r in fusion[fusion["graph"] == forward.name].itertuples()}
    # cppCodeToPost -> postToPre of the real provenance JSON, then the entries of the graph above (view ops of
    # another module's output, view_7 of linear_1, do not count: formats.md#inductor-provenance)
    assert paths == {
        "cpp_fused_native_layer_norm_0:1": ["ln1"],
        "extern_kernels.addmm:2": ["qkv"],
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:3": ["qkv|proj"],
        "extern_kernels.addmm:4": ["proj"],
        "cpp_fused_add_native_layer_norm_view_1:5": ["ln2", "proj|ln2"],
        "extern_kernels.addmm:6": ["fc1"],
        "cpp_fused_gelu_view_2:7": ["fc1|fc2"],
        "extern_kernels.addmm:8": ["fc2"],
        "cpp_fused_add_view_3:9": [],  # x_1, the last residual add: after the last parameter read
    }
    assert set(fusion.loc[fusion["graph"] == forward.name, "module_paths_scope"]) == {"model"}
    # the backward graph's Source Nodes name backward nodes: no pre-grad node, no module
    mine = fusion[fusion["graph"] == backward.name]
    assert len(mine) and mine["module_paths"].map(len).eq(0).all() and mine["module_paths_scope"].isna().all()
    assert fusion.attrs["layers"] == []  # one block, no module list
