rule replay_ncu:
    input:
        cls="results/{workload}/layers/classes/{cls}.json",
        clocks="results/{workload}/clocks/target.json",
    output:
        "results/{workload}/ncu/{cls}.csv",
    log:
        "logs/replay_ncu/{workload}/{cls}.log",
    benchmark:
        "results/{workload}/benchmarks/replay_ncu/{cls}.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=GPU,
    params:
        workload=workload_params,
    script:
        "../scripts/replay_ncu.py"


rule parse_ncu:
    input:
        csv="results/{workload}/ncu/{cls}.csv",
        lib=[LIB / "ncu" / "csv_reader.py", *ANALYSIS_LIB],
    output:
        "results/{workload}/ncu/{cls}.parquet",
    log:
        "logs/parse_ncu/{workload}/{cls}.log",
    benchmark:
        "results/{workload}/benchmarks/parse_ncu/{cls}.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/parse_ncu.py"
