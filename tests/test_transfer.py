"""Pairing the kernels of two runs of one program by invocation order (attribution/transfer.py).

Kernel tables are written by the test; names are real demangled kernel names as Kineto (C++ ABI
demangler) and nsys print them.
"""

from __future__ import annotations

import pandas as pd

from operator_profiler.attribution.transfer import align_runs, kernel_signature

FILL_KINETO = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
               "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")
ABS = ("void at::native::vectorized_elementwise_kernel<4, at::native::AbsFunctor<float>, "
       "at::detail::Array<char*, 2> >(int, at::native::AbsFunctor<float>, at::detail::Array<char*, 2>)")
SOFTMAX_KINETO = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)"
SOFTMAX_OTHER = "void at::native::{anonymous}::cunn_SoftMaxForward<4, float>(float *, const float *, int)"


def kernels(names, pid=1, iterations=None, t0=0):
    n = len(names)
    return pd.DataFrame({
        "kernel_id": range(n), "pid": pid, "name": names,
        "iteration": pd.array(iterations if iterations is not None else [None] * n, dtype="Int64"),
        "launch_start_ns": [t0 + 100 * i for i in range(n)], "start_ns": [t0 + 100 * i + 50 for i in range(n)],
    })


def test_signature_keeps_template_arguments_and_drops_parameters_and_spacing():
    assert kernel_signature(SOFTMAX_KINETO) == kernel_signature(SOFTMAX_OTHER.replace("{anonymous}", "(anonymous namespace)"))
    assert kernel_signature(SOFTMAX_KINETO) == "voidat::native::{anon}::cunn_SoftMaxForward<4,float>"
    assert kernel_signature(SOFTMAX_OTHER) == kernel_signature(SOFTMAX_KINETO)
    assert kernel_signature(FILL_KINETO) != kernel_signature(ABS)
    assert kernel_signature("triton_poi_fused_add_0") == "triton_poi_fused_add_0"


def test_identical_sequences_pair_position_by_position():
    names = ["ampere_sgemm_128x64_tn", SOFTMAX_KINETO, "triton_poi_fused_add_0"] * 2
    target = kernels([n.replace("(anonymous namespace)", "{anonymous}") for n in names], pid=77, iterations=[0, 0, 0, 1, 1, 1],
                     t0=10**9)
    source = kernels(names, pid=5, iterations=[0, 0, 0, 1, 1, 1])
    pairs, summary = align_runs(target, source)
    assert pairs.values.tolist() == [[i, i] for i in range(6)]
    assert summary["paired"] == 6 and summary["keyed_by"] == "iteration" and summary["first_difference"] is None


def test_another_program_pairs_nothing():
    """QA finding: nvFuser's FillFunctor/Abs kernels must not pair with AlexNet's ReLU kernel because
    both are vectorized_elementwise_kernel."""
    target = kernels([FILL_KINETO, ABS, "nvfuser_pointwise_f0_c1_r0_g0"])
    source = kernels([ABS, FILL_KINETO, "ampere_sgemm_128x64_tn"])
    pairs, summary = align_runs(target, source)
    assert len(pairs) == 0 and summary["paired"] == 0 and summary["mismatched_iterations"] == [-1]
    assert summary["first_difference"]["position"] == 0


def test_only_the_iteration_that_differs_stays_unpaired():
    """An extra kernel in iteration 1 of the source run (say, an autotuning launch): iteration 0 pairs,
    iteration 1 does not."""
    target = kernels(["a_kernel", "b_kernel", "a_kernel", "b_kernel"], iterations=[0, 0, 1, 1])
    source = kernels(["a_kernel", "b_kernel", "a_kernel", "extra_kernel", "b_kernel"], iterations=[0, 0, 1, 1, 1])
    pairs, summary = align_runs(target, source)
    assert pairs.values.tolist() == [[0, 0], [1, 1]]
    assert summary["mismatched_iterations"] == [1]
    assert summary["first_difference"] == {"rank": 0, "iteration": 1, "position": 1, "target": "b_kernel",
                                           "source": "extra_kernel", "target_kernels": 2, "source_kernels": 3}
