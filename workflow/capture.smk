# GPU (or CPU) captures, kept apart from the CPU parsers: a capture re-runs on an edit of what it imports
# (lib_inputs), never because a parser it does not import changed.


# With torch.profiler, the input shapes of one more iteration (recorded apart: recording them in the measured
# window would slow it); an nsys timeline takes them from the Kineto run (capture_kineto).
# The torch.profiler capture also writes Inductor's debug output of the compile it profiles (inductor/debug/:
# output_code.py, FX graphs, provenance, module paths; for an eager workload a folder with a note): one compile per
# workload, and the fusion map describes the very kernels the trace holds. With nsys the Kineto run beside it does.
DEBUG_OUTPUT = {"debug": directory("results/{workload}/inductor/debug")}
CAPTURE_OUTPUTS = {}
if TIMELINE != "nsys":
    CAPTURE_OUTPUTS["shapes"] = "results/{workload}/capture/shapes.kineto.json.gz"
    CAPTURE_OUTPUTS.update(DEBUG_OUTPUT)


rule capture_timeline:
    input:
        clocks="results/{workload}/clocks/target.json",
        lib=lib_inputs("capture_timeline"),
        model=custom_model_source,
    output:
        **CAPTURE_OUTPUTS,
        trace=f"results/{{workload}}/capture/timeline.{TRACE_EXT}",
        run="results/{workload}/capture/run.json",
        layers="results/{workload}/capture/layers.json",
        clocks="results/{workload}/capture/clocks_applied.json",
    log:
        "logs/capture_timeline/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/capture_timeline.tsv"
    conda:
        "../envs/torch.yaml"
    # harness.threads: the job holds the cores the harness's torch threads use (1 when not set)
    threads: HARNESS_THREADS or 1
    resources:
        gpu=GPU,
        slurm_extra=GPU_SLURM_EXTRA,
    params:
        job=gpu_job(
            workload=workload_params,
            int8_forced=int8_forced,
            harness=json.dumps(config["harness"], sort_keys=True),
            device=DEVICE,
            timeline=TIMELINE,
            timeline_requested=config["timeline"],
        ),
        files=gpu_files,
    shell:
        gpu_shell("capture_timeline")


# nsys and torch.profiler cannot share CUPTI in one process: path (a) needs its own run.
rule capture_kineto:
    input:
        clocks="results/{workload}/clocks/target.json",
        lib=lib_inputs("capture_kineto"),
        model=custom_model_source,
    output:
        **(DEBUG_OUTPUT if TIMELINE == "nsys" else {}),
        trace="results/{workload}/capture/kineto.json.gz",
        run="results/{workload}/capture/kineto_run.json",
        clocks="results/{workload}/capture/kineto_clocks_applied.json",
    log:
        "logs/capture_kineto/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/capture_kineto.tsv"
    conda:
        "../envs/torch.yaml"
    threads: HARNESS_THREADS or 1
    resources:
        gpu=GPU,
        slurm_extra=GPU_SLURM_EXTRA,
    params:
        job=gpu_job(
            workload=workload_params,
            int8_forced=int8_forced,
            harness=json.dumps(config["harness"], sort_keys=True),
            device=DEVICE,
        ),
        files=gpu_files,
    shell:
        gpu_shell("capture_kineto")


rule build_fusion_map:
    input:
        debug="results/{workload}/inductor/debug",
        lib=lib_inputs("build_fusion_map"),
    output:
        "results/{workload}/inductor/fusion_map.parquet",
    log:
        "logs/build_fusion_map/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/build_fusion_map.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/build_fusion_map.py"
