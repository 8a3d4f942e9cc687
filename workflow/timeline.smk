rule export_timeline:
    input:
        trace=f"results/{{workload}}/capture/timeline.{TRACE_EXT}",
        lib=[LIB / "timeline" / "kineto.py", LIB / "naming.py", *ANALYSIS_LIB],
    output:
        kernels="results/{workload}/timeline/kernels.parquet",
        launches="results/{workload}/timeline/launches.parquet",
        ranges="results/{workload}/timeline/ranges.parquet",
    log:
        "logs/export_timeline/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/export_timeline.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/export_timeline.py"
