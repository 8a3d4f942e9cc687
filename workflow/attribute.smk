rule attribute:
    input:
        kernels="results/{workload}/timeline/kernels.parquet",
        ranges="results/{workload}/timeline/ranges.parquet",
        kernel_layers="results/{workload}/layers/kernel_layers.parquet",
        fusion_map=fusion_map_input,
        kineto=kineto_input,
        lib=[
            LIB / "attribution" / "correlation.py",
            LIB / "attribution" / "merge.py",
            LIB / "attribution" / "inductor.py",
            LIB / "attribution" / "nvtx.py",
            *ANALYSIS_LIB,
        ],
    output:
        "results/{workload}/attribution/kernels.parquet",
    log:
        "logs/attribute/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/attribute.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        nvtx=config["nvtx"],
    script:
        "../scripts/attribute.py"
