rule match_invocations:
    input:
        kernels="results/{workload}/timeline/kernels.parquet",
        ncu=ncu_tables,
        kernel_layers="results/{workload}/layers/kernel_layers.parquet",
        replays=replay_records,
        lib=lib_inputs("match_invocations"),
    output:
        metrics="results/{workload}/matched/kernel_metrics.parquet",
        diagnostics="results/{workload}/matched/diagnostics.json",
    log:
        "logs/match_invocations/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/match_invocations.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/match_invocations.py"
