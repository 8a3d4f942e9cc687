rule export_timeline:
    input:
        trace=f"results/{{workload}}/capture/timeline.{TRACE_EXT}",
        lib=lib_inputs("export_timeline"),
    output:
        **TIMELINE_OUTPUTS,
    log:
        "logs/export_timeline/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/export_timeline.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        expect_gpu=DEVICE == "cuda",
    script:
        "../scripts/export_timeline.py"


# With an nsys timeline, the separate torch.profiler run (capture_kineto) is read the same way;
# attribute pairs its kernels with the nsys ones by invocation order for paths (a) and (c).
rule export_kineto_timeline:
    input:
        trace="results/{workload}/capture/kineto.json.gz",
        lib=lib_inputs("export_kineto_timeline"),
    output:
        kernels="results/{workload}/timeline_kineto/kernels.parquet",
        launches="results/{workload}/timeline_kineto/launches.parquet",
        ranges="results/{workload}/timeline_kineto/ranges.parquet",
        diagnostics="results/{workload}/timeline_kineto/diagnostics.json",
    log:
        "logs/export_kineto_timeline/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/export_kineto_timeline.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        expect_gpu=True,
    script:
        "../scripts/export_kineto_timeline.py"
