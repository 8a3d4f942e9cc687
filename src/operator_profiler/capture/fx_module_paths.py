"""Record the module path of every compiled FX node while torch.compile runs (the torch.profiler capture of a compiled workload),
into ``opprof_module_paths.json`` beside each graph's ``output_code.py``: Inductor's debug files do not keep
``nn_module_stack``, and a whole-model compile has no layer ranges, so a kernel's layer comes from here.
Details: docs/modules.md#capture-fx-module-paths."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Iterator, Mapping

import torch

from ..naming import MODULE_PATHS_FORMAT, MODULE_PATHS_JSON

_log = logging.getLogger(__name__)

__all__ = ["ModulePathRecorder", "bind", "common_path", "recording"]

_ACTIVE: list["ModulePathRecorder"] = []


@contextlib.contextmanager
def recording() -> Iterator["ModulePathRecorder"]:
    """Record module paths for every graph compiled inside the block (the capture's debug output); the model
    is named with :func:`bind` once built (the harness does, when it compiles it)."""
    recorder = ModulePathRecorder()
    _ACTIVE.append(recorder)
    try:
        with recorder.installed():
            yield recorder
    finally:
        _ACTIVE.remove(recorder)


def bind(model: torch.nn.Module) -> None:
    """Tell the recording in progress (if any) which model it compiles."""
    for recorder in _ACTIVE:
        recorder.bind(model)


def common_path(paths: list[str]) -> str:
    """The longest module path all ``paths`` start with, component by component (``""``: only the root)."""
    split = [p.split(".") if p else [] for p in paths]
    out: list[str] = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        out.append(parts[0])
    return ".".join(out)


class _Frame:
    """What the pre-grad pass learnt about one Dynamo frame (one compile id)."""

    def __init__(self, module: str | None, is_model: bool | None):
        self.module = module  # module path of the frame's module ("" = the model), None when not a module of it
        self.is_model = is_model
        self.calls: dict[tuple[str, str], int] = {}  # (stack key, access path) -> call number of its module
        self.per_object: dict[int, int] = {}  # id(module) -> calls numbered so far
        self.pre_grad: dict[str, str | None] = {}


class ModulePathRecorder:
    """Writes ``opprof_module_paths.json`` into each Inductor graph debug dir compiled while :meth:`installed`.

    ``model``: the module torch.compile compiles (or whose submodules it compiles); its ``named_modules()``
    name the paths (or :meth:`bind` it later; unbound, every path is unknown). Needs ``torch._inductor.config.trace.enabled`` (the debug dirs); without them nothing is
    written. Custom passes already set in ``torch._inductor.config`` still run, after the recorder's (passes
    a compile's ``options`` set replace the recorder for that compile: its graphs get no record).
    """

    def __init__(self, model: torch.nn.Module | None = None):
        self._model_id: int | None = None
        self._path_of: dict[int, str] = {}
        if model is not None:
            self.bind(model)
        self._frames: dict[str, _Frame] = {}
        self._pre_grad_graphs: dict[int, dict[str, str | None]] = {}  # id(Dynamo graph) -> node -> path
        self._before: dict[str, dict] = {}  # debug dir -> Inductor's kernel -> post-grad nodes map before codegen

    def bind(self, model: torch.nn.Module) -> None:
        """Name paths after ``model``'s ``named_modules()`` (needed before its compile runs; ids are kept, so the
        model must stay alive while it compiles)."""
        self._model_id = id(model)
        self._path_of = {}
        for path, module in model.named_modules():  # first name of each module, as find_layers names layers
            self._path_of.setdefault(id(module), path)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Install the passes for the block (restored afterwards)."""
        import torch._inductor.config as inductor_config
        from torch._inductor.custom_graph_pass import get_custom_graph_passes

        names = ("pre_grad_custom_pass", "post_grad_custom_pre_pass", "post_grad_custom_post_pass")
        saved = {n: getattr(inductor_config, n) for n in names}
        import torch._inductor.debug as inductor_debug

        for name in names:  # the recorder first, then the passes configured before
            record = self._pre_grad if name == "pre_grad_custom_pass" else self._post_grad
            setattr(inductor_config, name, [_Pass(record), *get_custom_graph_passes(saved[name])])
        dump = inductor_debug.dump_inductor_provenance_info

        def dump_and_record():
            result = dump()
            try:
                self._kernel_nodes(inductor_debug)
            except Exception as exc:  # as in the passes: never break the compile
                _log.warning("kernel -> FX node map not recorded (%s: %s)", type(exc).__name__, exc)
            return result

        inductor_debug.dump_inductor_provenance_info = dump_and_record
        try:
            yield
        finally:
            inductor_debug.dump_inductor_provenance_info = dump
            for name, value in saved.items():
                setattr(inductor_config, name, value)

    # --- the passes ---------------------------------------------------------------------------------------------

    def _pre_grad(self, graph: torch.fx.Graph) -> None:
        frame = self._frames.setdefault(_compile_id(), _Frame(*self._frame_module()))
        seen: dict[tuple[str, str], int] = {}
        for node in graph.nodes:
            for key, (access, _cls) in (node.meta.get("nn_module_stack") or {}).items():
                seen.setdefault((str(key), str(access)), len(seen))
        # Number each module's calls: Dynamo's "@N" key suffix is the call order of one access path; calls
        # through other paths (the same module listed twice) follow the graph's order.
        for key, access in sorted(seen, key=lambda pair: (_call_suffix(pair[0]), seen[pair])):
            self._number(frame, key, access)
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            frame.pre_grad[node.name] = self._encode(frame, node.meta.get("nn_module_stack"))
        self._pre_grad_graphs[id(graph)] = frame.pre_grad

    def _post_grad(self, graph: torch.fx.Graph) -> None:
        from torch._inductor.virtualized import V

        debug = V.debug if V.debug is not None else None
        path = getattr(debug, "_path", None)
        if not path:
            return  # no debug dir: nothing to write beside
        import torch._inductor.debug as inductor_debug

        self._before.setdefault(path, dict(getattr(inductor_debug, "_inductor_triton_kernel_to_post_grad_node_info", {})))
        frame = self._frames.get(_compile_id())
        post: dict[str, str | None] = {}
        derived: list[str] = []
        for node in graph.nodes:
            if node.op in ("output", "get_attr"):
                continue
            found = self._from_node(node)
            if found is None and frame is not None:
                # without a stack here the node is not known to be the frame module's own code (a post-grad
                # pass made it, or a gradient accumulation): only a Dynamo node's empty stack means that
                found = self._encode(frame, node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack"),
                                     empty_is_root=False)
            if found is None and node.op == "call_function":
                inputs = [post.get(i.name) for i in node.all_input_nodes if i.op != "placeholder"]
                if inputs and all(p is not None for p in inputs):
                    found = common_path(inputs)
                    derived.append(node.name)
            if found is not None or node.op != "placeholder":
                post[node.name] = found
        # Inductor names a kernel's "Source Nodes" by each origin's meta["from_node"][0].name, or by the node's own
        # name where it has no from_node (torch/_inductor/utils.py get_kernel_metadata): keep those names' paths.
        sources: dict[str, list[str]] = {}
        for node in graph.nodes:
            if node.op == "call_function":
                origin = node.meta.get("from_node")
                key = getattr(origin[0], "name", None) if origin else node.name
                if key is not None:
                    sources.setdefault(str(key), []).append(node.name)
        self._write(path, frame, post, sources, derived)

    def _kernel_nodes(self, inductor_debug) -> None:
        """After a graph's code generation (Inductor's provenance dump, inside its ``DebugContext``): the entries
        ``"<kernel>:<debug handle>" -> [post-grad nodes]`` it added to Inductor's provenance map, into the record
        as ``kernel_nodes``. torch 2.13 writes its own provenance JSON for forward graphs only; this is the same
        map for every graph (a backward graph's generated kernels have no Source Nodes comment)."""
        from torch._inductor.virtualized import V

        path = getattr(V.debug, "_path", None) if V.debug is not None else None
        if not path:
            return
        before = self._before.pop(path, {})
        now = getattr(inductor_debug, "_inductor_triton_kernel_to_post_grad_node_info", {}) or {}
        added = {str(k): [str(n) for n in v] for k, v in now.items() if before.get(k) != v and isinstance(v, list)}
        self._update(path, lambda record: record.setdefault("kernel_nodes", {}).update(added))

    # --- helpers ------------------------------------------------------------------------------------------------

    def _frame_module(self) -> tuple[str | None, bool | None]:
        """(module path of the frame's module, whether it is the model) from the frame Dynamo is compiling."""
        try:
            from torch._dynamo.symbolic_convert import InstructionTranslator

            tx = InstructionTranslator.current_tx()
            local_values = list(tx.f_locals.values())
        except Exception:  # not inside a Dynamo compile (a direct compile_fx call): unknown frame
            return None, None
        if any(id(v) == self._model_id for v in local_values):
            return "", True
        mine = tx.f_locals.get("self")
        if isinstance(mine, torch.nn.Module) and id(mine) in self._path_of:
            return self._path_of[id(mine)], False
        return None, False

    def _number(self, frame: _Frame, key: str, access: str) -> int:
        if (key, access) not in frame.calls:
            obj = _object_id(key)
            frame.calls[(key, access)] = frame.per_object.get(obj, 0)
            frame.per_object[obj] = frame.calls[(key, access)] + 1
        return frame.calls[(key, access)]

    def _encode(self, frame: _Frame, stack: Mapping | None, empty_is_root: bool = True) -> str | None:
        """The module path of a node from its ``nn_module_stack`` (outermost entry first), relative to the
        frame's module unless that is the model; None when a module is not one of the model's."""
        if frame.module is None:
            return None
        if not stack:
            return "" if empty_is_root else None
        encoded, previous = "", None
        for key, (access, _cls) in stack.items():
            obj = _object_id(str(key))
            canonical = self._path_of.get(obj) if obj is not None else None
            call = frame.calls.get((str(key), str(access)))
            if canonical is None or call is None:
                return None
            suffix = f"#{call}" if call else ""
            if previous and canonical.startswith(previous + "."):
                encoded = f"{encoded}.{canonical[len(previous) + 1:]}{suffix}"
            else:  # the first entry, or a module that is not a submodule of the caller: its own full path
                encoded = canonical + suffix
            previous = canonical
        if frame.module and not frame.is_model:
            if encoded == frame.module:
                return ""
            if encoded.startswith(frame.module + "."):
                return encoded[len(frame.module) + 1:]
        return encoded

    def _from_node(self, node: torch.fx.Node) -> str | None:
        """The module path of the Dynamo node ``node`` was made from (``meta["from_node"]`` chain)."""
        todo = list(node.meta.get("from_node") or [])
        seen = 0
        while todo and seen < 256:
            source = todo.pop(0)
            seen += 1
            graph = self._pre_grad_graphs.get(getattr(source, "graph_id", None))
            if graph is not None and getattr(source, "name", None) in graph:
                return graph[source.name]
            todo.extend(getattr(source, "from_node", None) or [])
        return None

    def _write(self, directory: str, frame: _Frame | None, post: dict, sources: dict, derived: list[str]) -> None:
        def add(record: dict) -> None:
            if frame is not None:
                record.update(scope=None if frame.is_model is None else ("model" if frame.is_model else "frame"),
                              frame_module=frame.module, pre_grad=dict(frame.pre_grad))
            for name, value in post.items():
                if record["post_grad"].get(name) is None:
                    record["post_grad"][name] = value
            for name, nodes in sources.items():
                record["source_nodes"][name] = sorted(set(record["source_nodes"].get(name, [])) | set(nodes))
            record["from_inputs"] = sorted(set(record["from_inputs"]) | {n for n in derived if n in post})

        self._update(directory, add)

    @staticmethod
    def _update(directory: str, change) -> None:
        """Apply ``change(record)`` to the graph dir's record (created empty first) and write it back."""
        import os

        target = os.path.join(directory, MODULE_PATHS_JSON)
        record = {"format": MODULE_PATHS_FORMAT, "compile_id": _compile_id(), "scope": None, "frame_module": None,
                  "pre_grad": {}, "post_grad": {}, "source_nodes": {}, "from_inputs": [], "kernel_nodes": {}}
        if os.path.isfile(target):  # another pass of the same graph wrote first: add to it
            with open(target, encoding="utf-8") as f:
                record = json.load(f)
        change(record)
        with open(target, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)


def _object_id(key: str) -> int | None:
    """``id(module)`` from an ``nn_module_stack`` key (``"140374027353232"`` or ``"140374027353232@1"``)."""
    head = key.split("@", 1)[0]
    return int(head) if head.isdigit() else None


def _call_suffix(key: str) -> int:
    """``N`` of an ``nn_module_stack`` key ``"<id>@N"`` (Dynamo's count of further calls), 0 without one."""
    tail = key.partition("@")[2]
    return int(tail) if tail.isdigit() else 0


def _compile_id() -> str | None:
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    return None if cid is None else str(cid)


@functools.lru_cache(maxsize=1)
def _pass_class():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class RecorderPass(CustomGraphPass):
        """A read-only Inductor custom graph pass calling ``record(graph)``. Its uuid keeps Inductor's default
        pre-grad pass timing (a custom pass without one moves the pre-grad passes before the cache lookup)."""

        def __init__(self, record):
            self._record = record

        def __call__(self, graph):
            try:
                self._record(graph)
            except Exception as exc:  # the record is evidence: a failure must never break the user's compile
                _log.warning("module paths not recorded for a compiled graph (%s: %s): its kernels' layers will "
                             "read unknown", type(exc).__name__, exc)

        def uuid(self):
            return MODULE_PATHS_FORMAT

    return RecorderPass


def _Pass(record):  # noqa: N802 (a class made on first use: torch._inductor is imported only when compiling)
    return _pass_class()(record)
