# Profile-guided optimization (docs/optimize.md): the rule catalog over each profile -> advice.json; for the
# workloads under optimize.workloads, the advised variant <workload>+<changes> is profiled by the same rules as
# any workload, verified on the device (numerics, interleaved wall time, ablation) and reported.


checkpoint advise:
    input:
        operators="results/{workload}/operators.parquet",
        attribution="results/{workload}/attribution/kernels.parquet",
        run="results/{workload}/capture/run.json",
        coverage="results/{workload}/coverage.json",
        shapes=shapes_input,
        catalog=CATALOG,
        lib=lib_inputs("advise"),
    output:
        "results/{workload}/advice.json",
    log:
        "logs/advise/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/advise.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/advise.py"


# Wall time must not share the cores with another job: the measurement takes them all (and times the variants
# with harness.threads, by default every usable CPU).
rule verify_variants:
    input:
        advice="results/{workload}/advice.json",
        lib=lib_inputs("verify_variants"),
        model=custom_model_source,
    output:
        verification="results/{workload}/optimize/verification.json",
    log:
        "logs/verify_variants/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/verify_variants.tsv"
    conda:
        "../envs/torch.yaml"
    threads: all_cores
    resources:
        gpu=GPU,
        slurm_extra=GPU_SLURM_EXTRA,
    params:
        job=gpu_job(
            workload=workload_params,
            int8_forced=int8_forced_anywhere,
            optimize=json.dumps(config["optimize"], sort_keys=True),
            device=DEVICE,
            # harness.threads (None: every usable CPU, resolved by the job where it runs); a params value, so
            # changing it measures again
            threads=HARNESS_THREADS,
        ),
        files=gpu_files,
    shell:
        gpu_shell("verify_variants")


rule optimize_report:
    input:
        unpack(optimize_report_inputs),
        advice="results/{workload}/advice.json",
        verification="results/{workload}/optimize/verification.json",
        lib=lib_inputs("optimize_report"),
    output:
        report="results/{workload}/optimize/report.html",
        compare="results/{workload}/optimize/compare.html",
    log:
        "logs/optimize_report/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/optimize_report.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/optimize_report.py"
