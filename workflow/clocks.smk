rule select_clocks:
    output:
        "results/{workload}/clocks/target.json",
    log:
        "logs/select_clocks/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/select_clocks.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=GPU,
    params:
        clocks=json.dumps(config["clocks"], sort_keys=True),
        device=DEVICE,
    script:
        "../scripts/select_clocks.py"
