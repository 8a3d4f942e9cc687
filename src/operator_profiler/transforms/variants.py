"""Variant workloads, without torch (the workflow builds its DAG with this): a variant of a workload is named
``<workload>+<change>+...`` and its config slice is the workload's with the changes added."""

from __future__ import annotations

#: Changes that only exist inside torch.compile with Inductor: a variant with one of them compiles
#: (transforms/changes.py: each has "compile" among its needs).
COMPILER_CHANGES = ("compile", "max_autotune", "cuda_graphs", "freezing", "keep_rnn_library")
SEPARATOR = "+"


def variant_name(workload: str, changes: list[str]) -> str:
    """``gpt2`` + [compile, freezing] -> ``gpt2+compile+freezing`` (the changes the workload does not have yet)."""
    return SEPARATOR.join([workload, *changes])


def advised_variant(workload_name: str, workload: dict, advised: list[str]) -> tuple[str, list[str]]:
    """The advised variant of ``workload_name`` (config slice ``workload``): its name (the results folder the
    workflow and ``opprof optimize`` profile it into; the workload's own when nothing is new) and the advised
    changes it does not have yet (not its own ``changes``, nor ``compile`` when it compiles already), in the
    canonical (catalog) order of transforms.vocabulary.CHANGES whatever order they were advised in, the order the
    verification names its variants in (optimize.ablation.variant_name). An id the catalog does not know keeps
    its advised place after the known ones."""
    from .vocabulary import CHANGES

    own = workload.get("changes", [])
    new = [c for c in advised if c not in own and not (c == "compile" and workload.get("compile"))]
    rank = {c: i for i, c in enumerate(CHANGES)}
    new = sorted(dict.fromkeys(new), key=lambda c: (rank.get(c, len(rank)), new.index(c)))
    return variant_name(workload_name, new), new


def variant_workload(workload: dict, changes: list[str]) -> dict:
    """The config slice of ``workload`` with ``changes`` added after its own (each once); ``compile`` becomes true
    when a change needs torch.compile."""
    result = dict(workload)
    own = list(result.get("changes", []))
    result["changes"] = own + [c for c in changes if c not in own]
    if any(c in COMPILER_CHANGES for c in result["changes"]):
        result["compile"] = True
    if not result["changes"]:
        del result["changes"]
    return result


def split_name(name: str) -> tuple[str, list[str]]:
    """``gpt2+compile+freezing`` -> (``gpt2``, [compile, freezing])."""
    base, *changes = name.split(SEPARATOR)
    return base, changes
