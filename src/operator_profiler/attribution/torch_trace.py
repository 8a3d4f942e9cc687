"""The modules of compiled FX nodes as a TORCH_TRACE log states them, for Inductor debug dirs captured outside the
workflow (no ``opprof_module_paths.json``: :mod:`operator_profiler.capture.fx_module_paths`).

torch 2.13 debug dirs keep no ``nn_module_stack``. What ``TORCH_COMPILE_DEBUG=1`` does keep, in the TORCH_TRACE
log (``torch_compile_debug/tlparse/dedicated_log_torch_trace_*.log``, docs/formats.md#inductor-torch_trace-log),
is per compiled frame: the Dynamo graph (``dynamo_output_graph``: the pre-grad FX nodes, in execution order,
with the graph inputs each reads), the source of every graph input (``describe_source``: a parameter is
``L['self']._modules['blocks']._modules['0']._modules['ln']._parameters['weight']``, so its module is
``blocks.0.ln``), its shape (``describe_tensor``), and the call stack the frame was compiled under
(``dynamo_start``). From these, per pre-grad node (:func:`node_entries`):

* a node that reads parameters or buffers lies in the module owning them (their common module path);
* a node that reads none lies, in execution order, between two such nodes ``a`` and ``b``. A module's forward
  runs as one contiguous stretch of the graph, so every module instance whose call holds both ``a`` and ``b``
  holds the node too: the entry ``"A|B"`` (the two module paths) says exactly that, and a layer instance
  containing both modules contains the node (:func:`operator_profiler.layers.site_membership`);
* unknown (None): a node before the first or after the last parameter-reading node, and every node of a module
  whose parameters are read by more than one node or whose parameter-reading nodes are not contiguous (a module
  called twice, a weight shared with another module: which call a node belongs to is not in the log).

Limits, stated in docs/formats.md: a parameter read outside its module's forward (a parent reading a child's
weight) places that node in the child; backward graphs have no pre-grad graph (their kernels keep no module).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

TORCH_TRACE_GLOB = "dedicated_log_torch_trace_*.log"
# A record: glog prefix, then the metadata JSON on one line; its payload follows on lines starting with a tab
# (torch/_logging/_internal.py TorchLogsFormatter).
_RECORD_RE = re.compile(r"^[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] (\{.*\})\s*$")
# A parameter or buffer of a module reached from a frame local: L['self']._modules['h']._modules['0']._parameters['w']
_PARAM_SOURCE_RE = re.compile(r"^L\['(?P<root>[^']+)'\](?P<chain>(?:\._modules\['[^']+'\])*)\._(?:parameters|buffers)"
                              r"\['(?P<name>[^']+)'\]$")
_MODULE_RE = re.compile(r"\._modules\['([^']+)'\]")
_FORWARD_RE = re.compile(r"^    def forward\(")
# A node of the printed graph (torch.fx print_readable): `name: "f32[2, 16]" = expr;  a = b = None`
_NODE_RE = re.compile(r"^ {8}(?P<name>[A-Za-z_]\w*)(?:: \"[^\"]*\")? = (?P<expr>.*?)(?:;  [\w =]*None)?\s*$")
_IDENTIFIER_RE = re.compile(r"\b[A-Za-z_]\w*\b")
MODULE_CALL = ("_call_impl", "torch/nn/modules/module.py")


def sanitized(source: str) -> str:
    """The name Dynamo gives the graph input of ``source`` (``L['x']`` -> ``L_x_``): runs of characters other
    than letters and digits become ``_`` (torch/_dynamo/output_graph.py)."""
    return re.sub(r"[^a-zA-Z0-9]+", "_", source)


@dataclass
class Frame:
    """What the log says about one compiled frame (Dynamo compile id ``frame_id/frame_compile_id``).

    ``scope``: ``model`` (the frame is the one module call on the stack: the compiled model's forward, so paths
    are the model's ``named_modules()`` paths), ``frame`` (a module called inside another module's forward:
    paths relative to it), None (not a module call, or not known). ``nodes``: pre-grad node names in graph
    (execution) order. ``reads``: node -> the module paths of the parameters/buffers it reads (sorted).
    ``param_reads``: ``(module path, parameter name)`` -> the nodes reading it. ``shapes``: module path ->
    ``{parameter name: shape}``. ``roots``: the frame locals the parameters hang from (one for a module's
    forward: ``self``)."""

    compile_id: str
    scope: str | None = None
    nodes: list[str] = field(default_factory=list)
    reads: dict[str, list[str]] = field(default_factory=dict)
    param_reads: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    shapes: dict[str, dict[str, list]] = field(default_factory=dict)
    roots: set[str] = field(default_factory=set)


def _records(log: Path) -> Iterable[tuple[dict, list[str]]]:
    """``(metadata, payload lines)`` of every record of a TORCH_TRACE log; malformed records are skipped."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for i, line in enumerate(lines):
        m = _RECORD_RE.match(line)
        if m is None:
            continue
        try:
            meta = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(meta, dict):
            continue
        payload = []
        if meta.get("has_payload"):
            for nxt in lines[i + 1:]:
                if not nxt.startswith("\t"):
                    break
                payload.append(nxt[1:])
        yield meta, payload


def _compile_id(meta: Mapping) -> str | None:
    if meta.get("compiled_autograd_id") is not None or "frame_id" not in meta:
        return None  # compiled autograd graphs: no frame of the user's code
    return f"{meta['frame_id']}/{meta.get('frame_compile_id')}"


def read_frames(root: Path) -> dict[str, Frame]:
    """Compile id -> :class:`Frame`, from every TORCH_TRACE log under ``root`` (``{}`` without one). A frame
    whose Dynamo graph is not in the log is left out; of several graphs of one compile id (restarted
    analyses) the last counts."""
    frames: dict[str, Frame] = {}
    root = Path(root)
    for log in sorted(root.rglob(TORCH_TRACE_GLOB)) if root.is_dir() else []:
        strings: dict[int, str] = {}
        sources: dict[str, dict[int, str]] = {}
        sizes: dict[str, dict[int, list]] = {}
        stacks: dict[str, list] = {}
        graphs: dict[str, list[str]] = {}
        for meta, payload in _records(log):
            if isinstance(meta.get("str"), list) and len(meta["str"]) == 2:
                strings[meta["str"][1]] = str(meta["str"][0])
                continue
            cid = _compile_id(meta)
            if cid is None:
                continue
            if isinstance(meta.get("describe_source"), dict):
                d = meta["describe_source"]
                sources.setdefault(cid, {})[d.get("id")] = str(d.get("source"))
            elif isinstance(meta.get("describe_tensor"), dict):
                d = meta["describe_tensor"]
                sizes.setdefault(cid, {})[d.get("id")] = d.get("size")
            elif isinstance(meta.get("dynamo_start"), dict):
                stacks[cid] = meta["dynamo_start"].get("stack") or []
            elif "dynamo_output_graph" in meta and payload:
                graphs[cid] = payload
        for cid, payload in graphs.items():
            frames[cid] = _frame(cid, payload, sources.get(cid, {}), sizes.get(cid, {}), stacks.get(cid), strings)
    return frames


def _scope(stack: list | None, strings: Mapping[int, str]) -> str | None:
    """``model`` when exactly one frame of the stack is a module call (torch's ``Module._call_impl``), counting
    the compiled frame: the compiled frame is (or is the forward of) the outermost module; ``frame`` for more
    (a module called inside another's forward: regional compilation); None for none or no stack."""
    if not stack:
        return None
    calls = 0
    for entry in stack:
        if not isinstance(entry, dict):
            continue
        name = entry.get("name")
        filename = entry.get("filename")
        path = strings.get(filename, "") if isinstance(filename, int) else str(filename or "")
        if name == MODULE_CALL[0] and path.replace("\\", "/").endswith(MODULE_CALL[1]):
            calls += 1
    return None if calls == 0 else ("model" if calls == 1 else "frame")


def _frame(cid: str, payload: list[str], sources: Mapping[int, str], sizes: Mapping[int, list], stack,
           strings: Mapping[int, str]) -> Frame:
    frame = Frame(cid, _scope(stack, strings))
    param_of: dict[str, tuple[str, str]] = {}  # graph input name -> (module path, parameter name)
    shape_of: dict[str, list] = {}
    counts: dict[str, int] = {}
    for sid, source in sources.items():
        counts[sanitized(source)] = counts.get(sanitized(source), 0) + 1
    for sid, source in sources.items():
        m = _PARAM_SOURCE_RE.match(source)
        name = sanitized(source)
        if m is None or counts[name] != 1:  # two sources of one name: which one a node reads is not known
            continue
        frame.roots.add(m.group("root"))
        param_of[name] = (".".join(_MODULE_RE.findall(m.group("chain"))), m.group("name"))
        if sid in sizes:
            shape_of[name] = sizes[sid]
    if len(frame.roots) > 1:  # parameters of several locals: paths relative to which module?
        param_of = {}
    in_forward = False
    alias: dict[str, str] = {}  # node name -> graph input it rebinds (`l_x_ = L_x_`)
    for line in payload:
        if not in_forward:
            in_forward = bool(_FORWARD_RE.match(line))
            continue
        if line.strip() and not line.startswith(" " * 8):
            break  # the top-level forward ends (nested subgraph classes follow)
        m = _NODE_RE.match(line)
        if m is None:
            continue
        name, expr = m.group("name"), m.group("expr").strip()
        if re.fullmatch(r"[LG]_\w*", expr):
            alias[name] = expr  # a graph input under its node name (`l_x_ = L_x_`): not a computation
            continue
        reads = sorted({param_of[alias.get(t, t)] for t in _IDENTIFIER_RE.findall(expr) if alias.get(t, t) in param_of})
        frame.nodes.append(name)
        if reads:
            frame.reads[name] = sorted({module for module, _ in reads})
            for read in reads:
                frame.param_reads.setdefault(read, []).append(name)
    for name, (module, param) in param_of.items():
        if name in shape_of:
            frame.shapes.setdefault(module, {})[param] = shape_of[name]
    return frame


def common_path(paths: Iterable[str]) -> str:
    """The longest module path all ``paths`` start with, component by component (``""``: only the root)."""
    split = [p.split(".") if p else [] for p in paths]
    out: list[str] = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        out.append(parts[0])
    return ".".join(out)


def _under(path: str, prefix: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + ".")


def node_entries(frame: Frame) -> dict[str, str | None]:
    """Pre-grad node -> its module entry (module docstring): an exact module path (``"blocks.0.ln"``; ``""``
    the frame module's own), ``"A|B"`` (inside every module instance whose call holds both module paths), or
    None (unknown)."""
    exact: dict[str, str | None] = {n: common_path(paths) for n, paths in frame.reads.items()}
    # modules whose calls cannot be told apart: a parameter read by several nodes (a module called twice, a
    # weight shared with another module), or a module's reads interrupted by another module's (its parameter
    # read outside its own forward). Only modules owning what they read: a container (an nn.ModuleList) is
    # never called, so other code between its children's calls is no sign of anything.
    doubtful: set[str] = {module for (module, _), nodes in frame.param_reads.items() if len(nodes) > 1}
    order = [n for n in frame.nodes if n in exact]
    for owner in {m for paths in frame.reads.values() for m in paths}:
        at = [i for i, n in enumerate(order) if owner in frame.reads[n]]
        if at and at[-1] - at[0] + 1 != len(at):
            doubtful.add(owner)
    for n in order:
        if any(_under(m, d) for m in frame.reads[n] for d in doubtful):
            exact[n] = None
    entries: dict[str, str | None] = {}
    previous: str | None = None
    pending: list[str] = []  # parameter-free nodes since the last parameter-reading one
    started = False
    for n in frame.nodes:
        if n not in exact:
            pending.append(n)
            continue
        here = exact[n]
        for p in pending:
            if not started or previous is None or here is None:
                entries[p] = None
            else:  # between two reads of one module: inside its call
                entries[p] = previous if previous == here else f"{previous}|{here}"
        pending = []
        entries[n] = here
        previous, started = here, True
    for p in pending:
        entries[p] = None  # after the last parameter-reading node: nothing bounds it
    return entries


def infer_layers(frames: Iterable[Frame]) -> list[dict]:
    """Layer instances by the capture's rule (``capture.workloads.find_layers``) on what the log shows: children
    of a container, named by index (``blocks.0``, ``blocks.1``: an ``nn.ModuleList``/``nn.Sequential``), at least
    two with identical parameter shapes, the outermost container winning; from frames of scope ``model`` only.
    ``[{"path", "class", "param_shapes"}]`` as ``layers.json`` holds them, in module path order; ``class`` is
    ``"Layer"`` (the log does not name module classes)."""
    shapes: dict[str, dict[str, list]] = {}
    for frame in frames:
        if frame.scope == "model":
            for module, params in frame.shapes.items():
                shapes.setdefault(module, {}).update(params)
    params = {(f"{m}.{p}" if m else p): s for m, ps in shapes.items() for p, s in ps.items()}
    containers: dict[str, set[str]] = {}
    for full in params:
        parts = full.split(".")
        for i in range(len(parts) - 1):
            if parts[i].isdigit():
                containers.setdefault(".".join(parts[:i]), set()).add(parts[i])
    layers: list[dict] = []
    claimed: list[str] = []
    for container in sorted(containers, key=lambda c: (c.count(".") if c else -1, c)):
        if any(_under(container, c) and container != c for c in claimed) or container in claimed:
            continue
        groups: dict[str, list[str]] = {}
        subtree: dict[str, dict[str, list]] = {}
        for child in sorted(containers[container], key=int):
            path = f"{container}.{child}" if container else child
            mine = {k[len(path) + 1:]: v for k, v in params.items() if k.startswith(path + ".")}
            subtree[path] = mine
            groups.setdefault(json.dumps(sorted(mine.items())), []).append(path)
        repeated = [g for key, g in groups.items() if len(g) >= 2 and json.loads(key)]
        for path in sorted((p for g in repeated for p in g), key=lambda p: int(p.rsplit(".", 1)[-1])):
            layers.append({"path": path, "class": "Layer", "param_shapes": subtree[path]})
            claimed.append(path)
    return sorted(layers, key=lambda entry: [(0, int(p), "") if p.isdigit() else (1, 0, p)
                                             for p in entry["path"].split(".")])
