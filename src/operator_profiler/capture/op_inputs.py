"""What torch.profiler's ``record_shapes`` leaves out of an op call, recorded in the capture's shapes iterations.

``record_shapes`` writes each argument's dims, dtype, strides and the text of a scalar ("Input Dims", "Input
type", "Input Strides", "Concrete Inputs"), but not a string (``aten::einsum``'s equation, ``aten::gelu``'s
``approximate``) nor the dtypes of a tensor list's elements (``aten::cat``, ``aten::stack``), and nothing at all of
an optional-tensor list (``aten::index``'s indices). The replay of such a call on the meta device
(:mod:`operator_profiler.work.op_calls`) then has no call to make, and its work is unknown.

PyTorch's execution trace (``torch.profiler.ExecutionTraceObserver``) observes the same dispatcher ops as the
profiler, through the same RecordFunction callbacks, and records every argument: strings, scalars, and each
tensor of a list with its shape, strides and dtype. Attached to the shapes iterations' profiler session, it gives
every op a ``rf_id`` equal to the Kineto event's ``Record function id``; :func:`annotate` copies the inputs of
the calls that need them (a string argument, a list of tensors) into their Kineto event's args under
:data:`~operator_profiler.work.op_calls.RECORDED_INPUTS_KEY`, which the Kineto reader keeps as the 5th element of
``input_shapes``. A dispatch mode (``TorchDispatchMode``) cannot do this: it runs below
``CompositeImplicitAutograd``, so it sees ``aten::bmm`` but never the ``aten::einsum`` the profiler records.

The execution trace costs time per op call; it runs in the shapes iterations only, after the measured window.
Its JSON (about twice the size of the shapes trace) is read once and deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..work.op_calls import RECORDED_INPUTS_KEY

#: A Kineto event's record function id, as torch.profiler's export writes it (one event's args on one line).
_RF_ID = re.compile(rb'("Record function id"\s*:\s*)([0-9]+)(?=\s*[,}\r\n])')


@dataclass
class Recording:
    """The execution trace of one profiler session: ``observer`` for ``profile(execution_trace_observer=)``
    (None when it could not be attached, ``reason`` says why); after the session, ``inputs`` (rf_id -> the
    recorded inputs of each call that needs them) and ``summary`` (for run.json)."""

    path: Path
    observer: object | None = None
    reason: str | None = None
    inputs: dict[int, bytes] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)


@contextlib.contextmanager
def execution_trace(next_to: Path) -> Iterator[Recording]:
    """An execution trace written beside ``next_to`` (``<name>.et.json``, deleted on exit), for one
    ``torch.profiler.profile`` session inside this block; on leaving, ``recording.inputs`` holds what
    :func:`annotate` writes. Never raises for the trace itself: without it (another execution trace already
    registered in this process, an unreadable output) the inputs stay empty and ``reason`` says why."""
    path = Path(next_to).with_name(Path(next_to).name + ".et.json")
    recording = Recording(path)
    try:
        from torch.profiler import ExecutionTraceObserver
    except ImportError:  # pragma: no cover - torch 2.13 has it
        recording.reason = "this torch has no ExecutionTraceObserver"
        recording.summary = {"recorded": False, "reason": recording.reason}
        yield recording
        return
    observer = ExecutionTraceObserver()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        observer.register_callback(str(path))
        if not observer.is_registered:
            recording.reason = "an execution trace was already registered in this process"
        else:
            recording.observer = observer
        yield recording
        observer.unregister_callback()  # (the profiler's exit did; this writes the file's end where it did not)
        if recording.observer is not None:
            try:
                recording.inputs, recording.summary = read_inputs(path)
            except (OSError, ValueError) as exc:
                recording.reason = f"the execution trace {path.name} is unreadable: {exc}"
        if recording.reason is not None:
            recording.summary = {"recorded": False, "reason": recording.reason}
    finally:
        if observer.is_registered:
            observer.unregister_callback()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _needs_inputs(types: list) -> bool:
    """Whether record_shapes misses something of these arguments (execution-trace types): a string or a list
    holding tensors."""
    return any(isinstance(t, str) and (t == "String" or (t.startswith("GenericList[") and "Tensor(" in t))
               for t in types)


def _without_tensor_values(types: list, values: list) -> list:
    """The execution trace's values with each tensor's (id, storage, offset, numel, itemsize, device) replaced by
    None: the shapes, strides and dtype say what the replay needs, the ids would only grow the file."""
    out = []
    for t, v in zip(types, values):
        if isinstance(t, str) and t.startswith("Tensor("):
            out.append(None)
        elif isinstance(t, str) and t.startswith("GenericList[") and "Tensor(" in t and isinstance(v, list):
            out.append([None] * len(v))
        else:
            out.append(v)
    return out


def read_inputs(path: Path) -> tuple[dict[int, bytes], dict]:
    """rf_id -> the JSON (bytes) of the inputs of each call whose arguments need more than record_shapes
    writes (:func:`_needs_inputs`): ``{"types", "values", "shapes", "strides", "outputs", "overload"}``, per
    argument as the execution trace writes them (tensor values dropped); and a summary for run.json.

    Raises:
        OSError, ValueError: the file cannot be read or is not an execution trace.
    """
    import orjson

    trace = orjson.loads(Path(path).read_bytes())
    nodes = trace.get("nodes") if isinstance(trace, dict) else None
    if not isinstance(nodes, list):
        raise ValueError("no 'nodes' list")
    inputs: dict[int, bytes] = {}
    for node in nodes:
        given = node.get("inputs") or {}
        types = given.get("types")
        if not isinstance(types, list) or not _needs_inputs(types):
            continue
        attrs = {a.get("name"): a.get("value") for a in node.get("attrs") or [] if isinstance(a, dict)}
        rf_id = attrs.get("rf_id")
        if not isinstance(rf_id, int) or rf_id <= 0:
            continue
        schema_name = str(attrs.get("op_schema") or "").split("(")[0]
        overload = schema_name.split(".", 1)[1] if "." in schema_name else "default"
        returned = node.get("outputs") or {}
        inputs[rf_id] = orjson.dumps({
            "types": types, "values": _without_tensor_values(types, given.get("values") or []),
            "shapes": given.get("shapes"), "strides": given.get("strides"),
            "outputs": {k: returned.get(k) for k in ("types", "shapes", "strides")}, "overload": overload})
    return inputs, {"recorded": True, "calls": len(inputs), "nodes": len(nodes)}


def annotate(lines: Iterator[bytes], inputs: dict[int, bytes], counts: dict) -> Iterator[bytes]:
    """The lines of a torch.profiler Chrome trace with ``"opprof inputs": {...}`` added after the ``Record
    function id`` of each event in ``inputs``; ``counts["annotated"]`` counts them."""
    key = b'"' + RECORDED_INPUTS_KEY.encode() + b'": '

    def add(match: re.Match) -> bytes:
        payload = inputs.get(int(match.group(2)))
        if payload is None:
            return match.group(0)
        counts["annotated"] = counts.get("annotated", 0) + 1
        return match.group(0) + b", " + key + payload

    for line in lines:
        yield _RF_ID.sub(add, line) if inputs and b"Record function id" in line else line
