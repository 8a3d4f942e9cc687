"""The arguments torch.profiler's record_shapes leaves out, recorded in the capture's shapes iterations.

record_shapes writes no strings (``aten::einsum``'s equation), no dtypes of a tensor list's elements
(``aten::cat``/``aten::stack``) and nothing of an optional-tensor list (``aten::index``'s indices): the Kineto
event's "Input type" is ``""`` or ``"TensorList"`` for them (/work/shared/docs/kineto-and-inductor.md section 1.5;
seen in the traces recorded below). The capture's shapes iterations run PyTorch's execution trace beside the
profiler (its nodes' ``inputs`` {values, shapes, types, strides} and ``attrs`` ``rf_id``/``op_schema``, Chakra
schema 1.1.1; ``rf_id`` is the Kineto event's "Record function id", kineto-and-inductor.md section 1.5), and
the op events that need them get the recorded inputs under ``"opprof inputs"`` (capture/op_inputs.py).

The models are run through the real harness, timeline reader, attribution and work stage; the expected FLOPs
are PyTorch's FlopCounterMode around the same model, run independently, and bytes are computed by hand.
"""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
import torch
from conftest import importable_module
from torch.utils.flop_counter import FlopCounterMode

from operator_profiler import stages
from operator_profiler.capture import op_inputs
from operator_profiler.timeline.kineto import read_kineto
from operator_profiler.work.op_calls import RECORDED_INPUTS_KEY, call_work

ITERATIONS = 2

MODELS = '''
import torch
import torch.nn as nn


class Mixer(nn.Module):
    """einsum attention, a cat of two dtypes, a stack, an index gather, a boolean mask and an einsum without a
    contraction (an element-wise product)."""

    def __init__(self, d=32):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.register_buffer("rows", torch.tensor([0, 2, 3, 1]))
        self.register_buffer("mask", torch.tensor([True, False, True, True, False, True, True, True]))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        s = torch.einsum("bqd,bkd->bqk", q, k).softmax(-1)
        o = torch.einsum("bqk,bkd->bqd", s, v)
        both = torch.cat([o, x.to(torch.float64)], dim=-1)
        stacked = torch.stack([both, both * 2])
        scaled = torch.einsum("bqd,bqd->bqd", o, q)
        return stacked[:, self.rows].sum() + o[:, self.mask].sum() + scaled.sum()


def mixer():
    torch.manual_seed(0)
    return Mixer().eval(), (torch.randn(4, 8, 32),)
'''


@pytest.fixture(scope="module")
def mixer_capture(tmp_path_factory):
    """The Mixer model through the harness (shapes iterations with the execution trace), the timeline, the
    attribution and the work stage: (folder, run.json, work, the model and its inputs)."""
    from operator_profiler.capture import harness

    root = tmp_path_factory.mktemp("op_inputs_models")
    out = tmp_path_factory.mktemp("mixer")
    with importable_module(root, "op_inputs_models", MODELS):
        run = harness.run_capture({"kind": "custom", "factory": "op_inputs_models:mixer"},
                                  {"seed": 0, "warmup": 1, "iterations": ITERATIONS}, "cpu", out / "trace.json.gz",
                                  out / "layers.json", out / "run.json", shapes_path=out / "shapes.json.gz")
        model, inputs = __import__("op_inputs_models").mixer()
    stages.export_timeline(out / "trace.json.gz", out / "timeline")
    stages.attribute_files(out / "timeline", None, None, out / "attribution.parquet")
    work = stages.work_files(out / "timeline", out / "attribution.parquet", out / "work.parquet",
                             shapes_trace=out / "shapes.json.gz")
    return out, run, work, model, inputs


def _flop_counter(model, inputs) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops()


def test_einsum_cat_stack_and_index_get_their_work_from_the_shapes_iterations(mixer_capture):
    out, run, work, model, inputs = mixer_capture
    assert work["flops"].notna().all(), work.loc[work["flops"].isna(), "work_note"].unique()
    assert work["bytes"].notna().all()
    expected = _flop_counter(model, inputs)
    measured = work["flops_formula"].sum() / ITERATIONS
    assert expected > 0 and abs(measured - expected) / expected < 0.02
    assert measured == expected  # exactly: the same formulas on the same shapes
    assert run["shapes_inputs"]["recorded"] is True
    assert run["shapes_inputs"]["annotated"] == run["shapes_inputs"]["calls"] > 0
    assert not list(out.glob("*.et.json"))  # the execution trace is read and deleted


def test_the_work_of_each_such_call_is_what_its_arguments_say(mixer_capture):
    """Per op: FLOPs and bytes of one call of each, by hand from the model's shapes (b=4, s=8, d=32)."""
    out, _, work, _, _ = mixer_capture
    ranges = pd.read_parquet(out / "timeline" / "ranges.parquet")
    shapes = read_kineto(out / "shapes.json.gz").ranges
    calls = {}
    for name in ("aten::einsum", "aten::cat", "aten::stack", "aten::index"):
        rows = shapes[shapes["name"] == name]
        calls[name] = [call_work(name, text) for text in rows["input_shapes"]]
    b, s, d = 4, 8, 32
    einsum = calls["aten::einsum"]
    assert [w.flops for w in einsum[:3]] == [2 * b * s * s * d, 2 * b * s * s * d, b * s * d]
    assert [w.flops_formula for w in einsum[:3]] == [2 * b * s * s * d, 2 * b * s * s * d, 0]
    assert einsum[0].bytes_read == 4 * 2 * b * s * d and einsum[0].bytes_written == 4 * b * s * s
    cat = calls["aten::cat"][0]  # float32 o and float64 x: the output is float64
    assert (cat.flops, cat.bytes_read, cat.bytes_written) == (0, 4 * b * s * d + 8 * b * s * d, 8 * b * s * 2 * d)
    stack = calls["aten::stack"][0]
    assert (stack.flops, stack.bytes_read, stack.bytes_written) == (0, 2 * 8 * b * s * 2 * d, 8 * 2 * b * s * 2 * d)
    gather, masked = calls["aten::index"][:2]
    # stacked[:, rows]: the whole stacked tensor read (ideal bytes: each input once), 4 int64 indices, out 2x4 rows
    assert gather.bytes_read == 8 * 2 * b * s * 2 * d + 8 * 4
    assert gather.bytes_written == 8 * 2 * 4 * s * 2 * d
    # o[:, mask]: the output size depends on the mask (6 of 8 true): the recorded output's, not the meta device's
    assert masked.bytes_read == 4 * b * s * d + 8 and masked.bytes_written == 4 * b * 6 * d
    assert len(ranges)  # (the measured timeline exists)


def test_the_measured_window_records_no_inputs(mixer_capture):
    out, _, _, _, _ = mixer_capture
    measured = json.loads(gzip.open(out / "trace.json.gz").read())["traceEvents"]
    assert not any(RECORDED_INPUTS_KEY in (e.get("args") or {}) for e in measured)
    assert not any((e.get("args") or {}).get("Record function id") for e in measured)  # no execution trace there
    shapes = json.loads(gzip.open(out / "shapes.json.gz").read())["traceEvents"]
    annotated = {e["name"] for e in shapes if RECORDED_INPUTS_KEY in (e.get("args") or {})}
    assert {"aten::einsum", "aten::cat", "aten::stack", "aten::index"} <= annotated
    assert "aten::addmm" not in annotated and "aten::linear" not in annotated  # record_shapes says all of them


def test_a_window_that_records_shapes_records_the_inputs_too(tmp_path):
    """The Kineto run beside an nsys timeline records shapes in its own window (window_shapes, whose times are
    not the measured ones): the execution trace runs there as well, and no shapes iterations follow."""
    from operator_profiler.capture import harness

    with importable_module(tmp_path, "op_inputs_window", MODELS):
        run = harness.run_capture({"kind": "custom", "factory": "op_inputs_window:mixer"},
                                  {"seed": 0, "warmup": 1, "iterations": 1}, "cpu", tmp_path / "kineto.json.gz",
                                  tmp_path / "layers.json", tmp_path / "run.json", window_shapes=True)
    assert run["shapes"] == "measured window"
    assert run["shapes_inputs"]["recorded"] and run["shapes_inputs"]["annotated"] == run["shapes_inputs"]["calls"]
    ranges = read_kineto(tmp_path / "kineto.json.gz").ranges
    einsum = ranges.loc[ranges["name"] == "aten::einsum", "input_shapes"]
    assert len(einsum) == 3 and call_work("aten::einsum", einsum.iloc[0]).flops == 2 * 4 * 8 * 8 * 32
    assert not list(tmp_path.glob("*.et.json"))


def test_a_trace_without_the_recorded_inputs_leaves_their_work_unknown_and_says_why(mixer_capture, tmp_path):
    """A trace recorded elsewhere (torch.profiler alone): the same calls without "opprof inputs"."""
    out, _, _, _, _ = mixer_capture
    trace = json.loads(gzip.open(out / "shapes.json.gz").read())
    for e in trace["traceEvents"]:
        (e.get("args") or {}).pop(RECORDED_INPUTS_KEY, None)
    (tmp_path / "plain.json").write_text(json.dumps(trace))
    shapes = read_kineto(tmp_path / "plain.json").ranges
    notes = {}
    for name in ("aten::einsum", "aten::cat", "aten::stack", "aten::index"):
        work = call_work(name, shapes.loc[shapes["name"] == name, "input_shapes"].iloc[0])
        assert work.flops is None and work.bytes is None
        notes[name] = work.note
    assert "argument equation (str) was not recorded" in notes["aten::einsum"]
    assert "TensorList whose element dtype is not recorded" in notes["aten::cat"]
    assert "argument indices" in notes["aten::index"]


def test_both_reader_paths_keep_the_recorded_inputs_alike(mixer_capture):
    out, _, _, _, _ = mixer_capture
    typed = read_kineto(out / "shapes.json.gz").ranges
    general = read_kineto(out / "shapes.json.gz", typed=False).ranges
    assert typed["input_shapes"].tolist() == general["input_shapes"].tolist()
    einsum = json.loads(typed.loc[typed["name"] == "aten::einsum", "input_shapes"].iloc[0])
    assert len(einsum) == 5 and einsum[4]["values"][0] == "bqd,bkd->bqk"
    assert einsum[4]["types"][1] == "GenericList[Tensor(float),Tensor(float)]"


# ------------------------------------------------------------------------------ the pieces, by hand

#: An execution-trace node as ExecutionTraceObserver writes it (torch 2.13, schema "1.1.1-chakra.0.0.4"): the
#: einsum of a [2, 3, 4] and a [2, 4, 5] tensor.
ET_EINSUM = {
    "id": 3, "name": "aten::einsum", "ctrl_deps": 2,
    "inputs": {"values": ["bij,bjk->bik", [[4, 5, 0, 24, 4, "cpu"], [6, 7, 0, 40, 4, "cpu"]], "<None>"],
               "shapes": [[], [[2, 3, 4], [2, 4, 5]], []],
               "types": ["String", "GenericList[Tensor(float),Tensor(float)]", "None"],
               "strides": [[], [[12, 4, 1], [20, 5, 1]], []]},
    "outputs": {"values": [[43, 36, 0, 30, 4, "cpu"]], "shapes": [[2, 3, 5]], "types": ["Tensor(float)"],
                "strides": [[15, 5, 1]]},
    "attrs": [{"name": "rf_id", "type": "uint64", "value": 7},
              {"name": "op_schema", "type": "string",
               "value": "aten::einsum(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor"}]}
ET_ADDMM = {"id": 4, "name": "aten::addmm", "ctrl_deps": 2,
            "inputs": {"values": [[1, 1, 0, 4, 4, "cpu"]], "shapes": [[4]], "types": ["Tensor(float)"],
                       "strides": [[1]]},
            "outputs": {}, "attrs": [{"name": "rf_id", "type": "uint64", "value": 8}]}


def test_the_execution_trace_is_read_into_the_inputs_of_the_calls_that_need_them(tmp_path):
    path = tmp_path / "x.et.json"
    path.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "nodes": [ET_EINSUM, ET_ADDMM]}))
    inputs, summary = op_inputs.read_inputs(path)
    assert set(inputs) == {7} and summary == {"recorded": True, "calls": 1, "nodes": 2}  # addmm needs nothing
    recorded = json.loads(inputs[7])
    assert recorded["values"] == ["bij,bjk->bik", [None, None], "<None>"]  # tensor ids dropped
    assert recorded["overload"] == "default" and recorded["outputs"]["shapes"] == [[2, 3, 5]]
    # a Kineto event (one event's args on one line, as torch.profiler exports them) gains them after its id
    lines = [b'  "args": {\n', b'    "External id": 2,"Record function id": 7, "Input Dims": [[], [[2, 3, 4], '
             b'[2, 4, 5]], []], "Input type": ["", "TensorList", ""], "Concrete Inputs": ["", "", ""], '
             b'"Input Strides": [[], [[12, 4, 1], [20, 5, 1]], []]\n', b'  }\n']
    counts: dict = {}
    args = json.loads(b"{" + b"".join(op_inputs.annotate(iter(lines), inputs, counts))[len(b'  "args": {'):])
    assert counts == {"annotated": 1}
    assert args["Record function id"] == 7 and args[RECORDED_INPUTS_KEY] == recorded
    shapes = json.dumps([args["Input Dims"], args["Input type"], args["Concrete Inputs"], args["Input Strides"],
                         args[RECORDED_INPUTS_KEY]])
    work = call_work("aten::einsum", shapes)
    assert (work.flops, work.flops_formula) == (2 * 2 * 3 * 4 * 5, 2 * 2 * 3 * 4 * 5)
    assert work.bytes_read == 4 * (24 + 40) and work.bytes_written == 4 * 30


def test_an_unreadable_execution_trace_leaves_the_inputs_empty_and_says_why(tmp_path, monkeypatch):
    def broken(path):
        raise ValueError("no 'nodes' list")

    monkeypatch.setattr(op_inputs, "read_inputs", broken)
    with op_inputs.execution_trace(tmp_path / "shapes.json.gz") as recording:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                    execution_trace_observer=recording.observer):
            torch.einsum("ij,jk->ik", torch.ones(2, 3), torch.ones(3, 4))
    assert recording.inputs == {}
    assert recording.summary == {"recorded": False, "reason": recording.reason}
    assert "unreadable" in recording.reason and not list(tmp_path.iterdir())
