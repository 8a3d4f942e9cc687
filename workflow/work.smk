# Analytic work (FLOPs, ideal bytes) of every kernel, from the capture's recorded shapes (record_shapes)
# and, for compiled workloads, the fusion map's generated kernels.
rule compute_work:
    input:
        kernels="results/{workload}/timeline/kernels.parquet",
        ranges="results/{workload}/timeline/ranges.parquet",
        attribution="results/{workload}/attribution/kernels.parquet",
        fusion_map=fusion_map_input,
        kineto=kineto_input,
        shapes=shapes_input,
        lib=lib_inputs("compute_work"),
    output:
        "results/{workload}/work/kernels.parquet",
    log:
        "logs/compute_work/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/compute_work.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/compute_work.py"
