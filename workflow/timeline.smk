rule export_timeline:
    input:
        trace=f"results/{{workload}}/capture/timeline.{TRACE_EXT}",
        lib=[
            LIB / "timeline" / "kineto.py",
            LIB / "timeline" / "nsys.py",
            LIB / "attribution" / "nvtx.py",
            LIB / "naming.py",
            *ANALYSIS_LIB,
        ],
    output:
        **TIMELINE_OUTPUTS,
    log:
        "logs/export_timeline/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/export_timeline.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/export_timeline.py"
