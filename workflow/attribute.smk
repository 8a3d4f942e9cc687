# With an nsys timeline, the pairing of its kernels with the torch.profiler run's is summarised too.
ATTRIBUTION_OUTPUTS = {"kernels": "results/{workload}/attribution/kernels.parquet"}
if TIMELINE == "nsys":
    ATTRIBUTION_OUTPUTS["pairing"] = "results/{workload}/attribution/pairing.json"


rule attribute:
    input:
        kernels="results/{workload}/timeline/kernels.parquet",
        ranges="results/{workload}/timeline/ranges.parquet",
        kernel_layers="results/{workload}/layers/kernel_layers.parquet",
        fusion_map=fusion_map_input,
        kineto=kineto_input,
        runs=runs_input,
        lib=lib_inputs("attribute"),
    output:
        **ATTRIBUTION_OUTPUTS,
    log:
        "logs/attribute/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/attribute.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        nvtx=config["nvtx"],
        workload=workload_params,
    script:
        "../scripts/attribute.py"
