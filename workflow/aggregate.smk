rule aggregate:
    input:
        attribution="results/{workload}/attribution/kernels.parquet",
        instances="results/{workload}/layers/instances.parquet",
        classes="results/{workload}/layers/classes.json",
        counters=counters_input,
        matching=matching_input,
        work="results/{workload}/work/kernels.parquet",
        ceilings=f"results/ceilings/{DEVICE}.json",
        lib=lib_inputs("aggregate"),
    output:
        operators="results/{workload}/operators.parquet",
        operators_csv=report(
            "results/{workload}/operators.csv",
            caption="report/operators.rst",
            category="{workload}",
            subcategory="Operators",
            labels={"workload": "{workload}", "file": "operators.csv"},
        ),
        phases="results/{workload}/phases.parquet",
        modules="results/{workload}/modules.parquet",
        layer_classes="results/{workload}/layer_classes.parquet",
        coverage=report(
            "results/{workload}/coverage.json",
            caption="report/coverage.rst",
            category="{workload}",
            subcategory="Coverage",
            labels={"workload": "{workload}", "file": "coverage.json"},
        ),
    log:
        "logs/aggregate/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/aggregate.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        options=json.dumps({**config["aggregate"], "device": DEVICE}, sort_keys=True),
    script:
        "../scripts/aggregate.py"
