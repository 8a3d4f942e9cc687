"""Tests for layer instances and layer classes (operator_profiler.layers).

Inputs are small synthetic Kineto traces (written to tmp_path and read with the real reader), so the kernels and
ranges have exactly the columns the pipeline produces. Expected classes are derived from how the synthetic
trace was built, not from the code under test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from operator_profiler import layers as L
from operator_profiler.timeline.kineto import read_kineto

BLOCK = ["aten::addmm", "aten::gelu", "aten::addmm"]
LAYERS_JSON = [{"path": f"h.{i}", "class": "Block", "param_shapes": {"w": [4, 4]}} for i in range(3)]


def _trace(tmp_path: Path, sequences: dict[str, list[str]], iterations: int = 2, stray: bool = False) -> Path:
    """A CPU trace: per iteration, one rest kernel, the three layers, one rest kernel; durations 1..n µs."""
    events = []
    t = 0
    dur = 0

    def call(name):
        nonlocal t, dur
        dur += 1
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": dur})
        t += dur + 1

    if stray:  # a call before the first measured iteration (outside every iteration range)
        call("aten::zeros")
    for it in range(iterations):
        it_start = t
        t += 1
        call("aten::embedding")
        for path, seq in sequences.items():
            start = t
            t += 1
            for name in seq:
                call(name)
            events.append({"ph": "X", "cat": "user_annotation", "name": f"opprof.layer:{path}", "pid": 1, "tid": 1,
                           "ts": start, "dur": t - start})
            t += 1
        call("aten::mm")
        events.append({"ph": "X", "cat": "user_annotation", "name": f"opprof.iteration:{it}", "pid": 1, "tid": 1,
                       "ts": it_start, "dur": t - it_start})
        t += 5
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _classify(tmp_path, sequences, **kw):
    t = read_kineto(_trace(tmp_path, sequences, **kw))
    return t, L.classify_layers(t.kernels, t.ranges, LAYERS_JSON)


def test_identical_layers_form_one_class(tmp_path):
    t, (kl, instances, classes) = _classify(tmp_path, {f"h.{i}": BLOCK for i in range(3)})
    assert set(classes) == {L.REST_CLASS, next(c for c in classes if c != L.REST_CLASS)}
    assert len(classes) == 2
    (block,) = [c for c in classes.values() if c["class"] != L.REST_CLASS]
    assert block["instances"] == ["h.0", "h.1", "h.2"]
    assert block["representative"] == "h.0"
    assert block["module_class"] == "Block"
    assert block["class"].startswith("Block-")
    assert block["kernel_count"] == len(BLOCK)
    assert [s[0] for s in block["signature"]] == BLOCK
    rest = classes[L.REST_CLASS]
    assert [s[0] for s in rest["signature"]] == ["aten::embedding", "aten::mm"]
    assert rest["instances"] == [L.REST_CLASS] and rest["module_class"] is None

    # Per kernel: its layer, class, and position within (instance, iteration).
    merged = kl.merge(t.kernels[["kernel_id", "name", "iteration"]], on="kernel_id")
    assert len(merged) == len(t.kernels) == 2 * (3 * len(BLOCK) + 2)
    in_layers = merged[merged["layer"].notna()]
    assert (in_layers["layer_class"] == block["class"]).all()
    assert (merged.loc[merged["layer"].isna(), "layer_class"] == L.REST_CLASS).all()
    for (layer, it), g in in_layers.groupby(["layer", "iteration"]):
        assert list(g["name"]) == BLOCK
        assert list(g["position"]) == [0, 1, 2]
    assert sorted(in_layers["layer"].unique()) == ["h.0", "h.1", "h.2"]

    # Instances: one row per (layer, iteration), times = sum of the kernels' durations.
    assert len(instances) == 2 * 4  # 3 layers + rest, 2 iterations
    for row in instances.itertuples(index=False):
        mine = merged[(merged["layer"].fillna(L.REST_CLASS) == row.layer) & (merged["iteration"] == row.iteration)]
        assert row.kernel_count == len(mine)
        dur = t.kernels.set_index("kernel_id").loc[mine["kernel_id"], "duration_ns"]
        assert row.time_ns == int(dur.sum())
    reps = set(instances.loc[instances["representative"], "layer"])
    assert reps == {"h.0", L.REST_CLASS}


def test_changed_sequence_splits_the_class(tmp_path):
    changed = {"h.0": BLOCK, "h.1": BLOCK, "h.2": ["aten::addmm", "aten::relu", "aten::addmm"]}
    _, (kl, _, classes) = _classify(tmp_path, changed)
    layer_classes = {n: c for n, c in classes.items() if n != L.REST_CLASS}
    assert len(layer_classes) == 2
    by_instances = sorted(c["instances"] for c in layer_classes.values())
    assert by_instances == [["h.0", "h.1"], ["h.2"]]
    h2 = next(c for c in layer_classes.values() if c["instances"] == ["h.2"])
    assert h2["representative"] == "h.2"
    assert [s[0] for s in h2["signature"]] == changed["h.2"]
    assert set(kl.loc[kl["layer"] == "h.2", "layer_class"]) == {h2["class"]}


def test_class_name_depends_only_on_signature(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, (_, _, a) = _classify(tmp_path / "a", {f"h.{i}": BLOCK for i in range(3)})
    _, (_, _, b) = _classify(tmp_path / "b", {f"h.{i}": BLOCK for i in range(3)}, iterations=3)
    assert sorted(a) == sorted(b)
    (tmp_path / "c").mkdir()
    _, (_, _, c) = _classify(tmp_path / "c", {f"h.{i}": BLOCK[:2] for i in range(3)})
    assert set(c) - {L.REST_CLASS} != set(a) - {L.REST_CLASS}


def test_kernels_outside_iterations_do_not_hide_the_layers(tmp_path):
    """A call before the first measured iteration must not become the 'first iteration' of the signatures."""
    t, (kl, _, classes) = _classify(tmp_path, {f"h.{i}": BLOCK for i in range(3)}, stray=True)
    assert t.kernels["iteration"].isna().sum() == 1
    layer_classes = [c for n, c in classes.items() if n != L.REST_CLASS]
    assert len(layer_classes) == 1 and layer_classes[0]["instances"] == ["h.0", "h.1", "h.2"]
    assert kl["layer_class"].notna().all()


def test_kernel_layers_uses_the_launch_thread(tmp_path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "opprof.layer:h.0", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1, "dur": 2},  # other thread
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 9, "dur": 3},  # ends after
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = read_kineto(path)
    got = L.kernel_layers(t.kernels, t.ranges)
    by = {(int(tid), int(s)): v for tid, s, v in zip(t.kernels["launch_tid"], t.kernels["start_ns"], got["layer"])}
    assert by == {(1, 1000): "h.0", (2, 1000): None, (1, 9000): None}


def test_write_classes_is_canonical_and_removes_stale(tmp_path):
    t = read_kineto(_trace(tmp_path, {f"h.{i}": BLOCK for i in range(3)}))
    _, _, classes = L.classify_layers(t.kernels, t.ranges, LAYERS_JSON)
    out = tmp_path / "classes"
    out.mkdir()
    stale = out / "Old-deadbeef.json"
    stale.write_text("{}\n")
    L.write_classes(classes, out)
    assert not stale.exists()
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == sorted(f"{name}.json" for name in classes)
    for name, entry in classes.items():
        text = (out / f"{name}.json").read_text()
        assert json.loads(text) == json.loads(json.dumps(entry))
        assert text == json.dumps(entry, sort_keys=True, indent=1) + "\n"
    # Unchanged content: files are not rewritten (mtime kept), so Snakemake sees no change.
    past = 1_000_000_000
    for p in out.glob("*.json"):
        os.utime(p, ns=(past, past))
    L.write_classes(classes, out)
    assert all(p.stat().st_mtime_ns == past for p in out.glob("*.json"))
    # Changed content is rewritten.
    changed = {n: dict(c, kernel_count=c["kernel_count"] + 1) if n == L.REST_CLASS else c for n, c in classes.items()}
    L.write_classes(changed, out)
    assert (out / f"{L.REST_CLASS}.json").stat().st_mtime_ns != past
    assert json.loads((out / f"{L.REST_CLASS}.json").read_text())["kernel_count"] == classes[L.REST_CLASS]["kernel_count"] + 1


def test_canonical_json_ignores_key_order():
    a = {"b": 1, "a": [1, 2], "c": {"y": 1, "x": 2}}
    b = {"c": {"x": 2, "y": 1}, "a": [1, 2], "b": 1}
    assert L.canonical_json(a) == L.canonical_json(b)
    assert L.canonical_json(a).endswith("\n")
    assert json.loads(L.canonical_json(a)) == a


def test_no_layer_ranges_gives_only_rest(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": i * 10, "dur": 2}
              for i, n in enumerate(["aten::mm", "aten::add", "aten::mm"])]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = read_kineto(path)
    kl, instances, classes = L.classify_layers(t.kernels, t.ranges, [])
    assert list(classes) == [L.REST_CLASS]
    assert classes[L.REST_CLASS]["kernel_count"] == 3
    assert kl["layer"].isna().all() and list(kl["position"]) == [0, 1, 2]
    assert len(instances) == 1 and int(instances["kernel_count"].iloc[0]) == 3


def test_verify_names_two_instances_per_class_to_replay(tmp_path):
    t = read_kineto(_trace(tmp_path, {f"h.{i}": BLOCK for i in range(3)}))
    _, _, plain = L.classify_layers(t.kernels, t.ranges, LAYERS_JSON)
    _, _, verified = L.classify_layers(t.kernels, t.ranges, LAYERS_JSON, verify=True)
    (cls,) = [c for c in plain if c != L.REST_CLASS]
    assert plain[cls]["replay_instances"] == ["h.0"]
    assert verified[cls]["replay_instances"] == ["h.0", "h.1"]
    assert verified[L.REST_CLASS]["replay_instances"] == [L.REST_CLASS]  # nothing to compare the rest with


def _entry(name: str, instances: list[str], kernels: list[str]) -> dict:
    return {"class": name, "module_class": "Block", "instances": instances, "representative": instances[0],
            "kernel_count": len(kernels), "signature": [[k, "", ""] for k in kernels]}


def test_a_split_made_by_whole_model_fusion_says_so():
    """GPT-2 under a whole-model compile (seen on the default config, CPU): Inductor stores the residual stream only
    every other block, so h.0/h.2's second LayerNorm kernel recomputes earlier code (a cross-layer kernel, class
    rest) and h.1/h.3 run an in-layer one more: two classes, reason ``compiled_boundary_differs``. The same split
    with a library kernel differing, or without cross-layer kernels, keeps ``kernels_differ``."""
    common = ["aten::addmm", "graph_0_cpp_fused_gelu_view_5", "aten::addmm"]
    layers_json = [{"path": f"h.{i}", "class": "Block", "param_shapes": {"w": [4, 4]}} for i in range(4)]
    boundary = L.Counter({"h.0": 3, "h.1": 2, "h.2": 3, "h.3": 2})  # cross-layer kernels touching each instance

    def split(extra: str, generated: set[str], touched=boundary):
        classes = {"A": _entry("A", ["h.0", "h.2"], common), "B": _entry("B", ["h.1", "h.3"], [*common, extra])}
        L.explain_splits(classes, layers_json, {}, touched, frozenset(generated))
        return classes

    fused = "graph_0_cpp_fused_add_native_layer_norm_view_7"
    classes = split(fused, {fused, "graph_0_cpp_fused_gelu_view_5"})
    assert {c["split_reason"] for c in classes.values()} == {"compiled_boundary_differs"}
    assert classes["B"]["split_from"] == ["A"] and "h.1 2" in classes["B"]["split_detail"]
    assert f"only here: {fused} x1" in classes["B"]["split_detail"]
    assert {c["split_reason"] for c in split("aten::bmm", {fused}).values()} == {"kernels_differ"}
    assert {c["split_reason"] for c in split(fused, {fused}, L.Counter()).values()} == {"kernels_differ"}
    # SDPA (default config): blocks.0 runs one more generated kernel (its LayerNorm on the model's input), though
    # cross-layer kernels touch both blocks alike
    alike = L.Counter({"h.0": 2, "h.1": 2, "h.2": 2, "h.3": 2})
    assert {c["split_reason"] for c in split(fused, {fused}, alike).values()} == {"compiled_boundary_differs"}
    assert "compiled_boundary_differs" in L.SPLIT_REASONS


def test_generated_kernel_names_come_from_non_extern_call_sites():
    import pandas as pd

    fusion = pd.DataFrame({"kind": ["cpp", "extern", "triton"], "kernel": ["cpp_fused_0", "extern_kernels.mm", "t_1"],
                           "profiler_name": ["graph_0_cpp_fused_0", "aten::mm", None],
                           "gpu_symbol": [None, None, "triton_poi_fused_1"]})
    assert L.generated_kernel_names(fusion) == {"cpp_fused_0", "graph_0_cpp_fused_0", "t_1", "triton_poi_fused_1"}
    assert L.generated_kernel_names(None) == frozenset()


def test_positions_count_within_instance_and_iteration_in_kernel_order():
    import numpy as np

    codes = np.array([0, 1, 0, 0, 1, 2, 0])
    iteration = np.array([0, 0, 0, 1, 1, -1, 0])
    # (0,0): rows 0,2,6 -> 0,1,2; (1,0): row 1 -> 0; (0,1): row 3 -> 0; (1,1): row 4 -> 0; (2,-1): row 5 -> 0
    assert L._positions(codes, iteration).tolist() == [0, 0, 1, 0, 0, 0, 2]
    assert L._positions(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).tolist() == []


def test_kernel_layer_classes_is_the_kernel_table_of_classify_layers(tmp_path):
    """Attribution's shortcut gives classify_layers' kernel table row for row: equal layers, a split class,
    kernels outside every iteration, and a trace without layer ranges (all rest)."""
    import pandas as pd

    cases = {
        "equal": ({f"h.{i}": BLOCK for i in range(3)}, {}),
        "split": ({"h.0": BLOCK, "h.1": BLOCK + ["aten::relu"], "h.2": BLOCK}, {}),
        "stray": ({f"h.{i}": BLOCK for i in range(3)}, {"stray": True}),
        "rest only": ({}, {}),
    }
    for label, (sequences, kw) in cases.items():
        folder = tmp_path / label.replace(" ", "_")
        folder.mkdir()
        timeline = read_kineto(_trace(folder, sequences, **kw))
        full = L.classify_layers(timeline.kernels, timeline.ranges, LAYERS_JSON)[0]
        short = L.kernel_layer_classes(timeline.kernels, timeline.ranges, LAYERS_JSON)
        pd.testing.assert_frame_equal(full, short, obj=label)
        layered = full["layer"].notna()
        assert (full.loc[~layered, "layer_class"] == "rest").all(), label
        # Position: the index within (instance, iteration), counted independently here.
        iteration = timeline.kernels["iteration"].fillna(-1).astype(int)
        instance = full["layer"].fillna("rest")
        expected = pd.Series(range(len(full))).groupby([instance, iteration]).cumcount()
        assert full["position"].tolist() == expected.tolist(), label
    assert full["layer"].isna().all()  # the last case: no layer ranges


def test_rest_kernels_only_after_the_first_iteration_have_no_class_in_both_tables(tmp_path):
    """Like an instance, rest has a class only when it has kernels in the first measured iteration: a rest
    kernel of a later iteration has no layer class, in classify_layers' table and in attribution's shortcut."""
    import pandas as pd

    events, t = [], 0
    for it in range(2):
        start = t
        names = ["aten::addmm"] + (["aten::mm"] if it else [])  # the rest kernel only in iteration 1
        layer_start = t
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": t + 1, "dur": 2})
        events.append({"ph": "X", "cat": "user_annotation", "name": "opprof.layer:h.0", "pid": 1, "tid": 1,
                       "ts": layer_start, "dur": 4})
        t += 5
        for name in names[1:]:
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": 2})
            t += 3
        events.append({"ph": "X", "cat": "user_annotation", "name": f"opprof.iteration:{it}", "pid": 1, "tid": 1,
                       "ts": start, "dur": t - start})
        t += 5
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    timeline = read_kineto(path)
    full = L.classify_layers(timeline.kernels, timeline.ranges, LAYERS_JSON[:1])[0]
    short = L.kernel_layer_classes(timeline.kernels, timeline.ranges, LAYERS_JSON[:1])
    pd.testing.assert_frame_equal(full, short)
    rest = full["layer"].isna()
    assert rest.sum() == 1 and full.loc[rest, "layer_class"].isna().all()
    assert full.loc[~rest, "layer_class"].notna().all()
