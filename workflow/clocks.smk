rule select_clocks:
    input:
        lib=lib_inputs("select_clocks"),
    output:
        target="results/{workload}/clocks/target.json",
    log:
        "logs/select_clocks/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/select_clocks.tsv"
    conda:
        "../envs/torch.yaml"
    resources:
        gpu=GPU,
        slurm_extra=GPU_SLURM_EXTRA,
    params:
        job=gpu_job(
            # on CPU nothing is locked: a clocks edit must not re-run the captures (target.json is the same)
            clocks=json.dumps(config["clocks"] if GPU else {}, sort_keys=True),
            device=DEVICE,
        ),
        files=gpu_files,
    shell:
        gpu_shell("select_clocks")
