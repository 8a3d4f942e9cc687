rule export_trace:
    input:
        kernels="results/{workload}/timeline/kernels.parquet",
        ranges="results/{workload}/timeline/ranges.parquet",
        launches="results/{workload}/timeline/launches.parquet",
        activities="results/{workload}/timeline/gpu_activities.parquet",
        attribution="results/{workload}/attribution/kernels.parquet",
        counters=counters_input,
        lib=lib_inputs("export_trace"),
    output:
        report(
            "results/{workload}/trace.json",
            caption="report/trace.rst",
            category="{workload}",
            subcategory="Timeline",
            labels={"workload": "{workload}", "file": "trace.json"},
        ),
    log:
        "logs/export_trace/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/export_trace.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/export_trace.py"
