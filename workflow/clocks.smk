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
            clocks=json.dumps(config["clocks"], sort_keys=True),
            device=DEVICE,
        ),
        files=gpu_files,
    shell:
        gpu_shell("select_clocks")
