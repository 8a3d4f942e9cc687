# One ncu run per layer class (per contiguous segment of its replay window; operator_profiler.ncu.replay).
# Inputs are the class JSON and its replay plan, both written by the classify_layers checkpoint and
# byte-identical while the class is unchanged (small inputs are compared by checksum), so an unchanged
# class never re-runs its replay; params are the config slices only (no run-dependent values).
rule replay_ncu:
    input:
        cls="results/{workload}/layers/classes/{cls}.json",
        plan="results/{workload}/layers/replay/{cls}.json",
        clocks="results/{workload}/clocks/target.json",
        lib=lib_inputs("replay_ncu"),
        model=custom_model_source,
    output:
        csv="results/{workload}/ncu/{cls}.csv",
        replay="results/{workload}/ncu/{cls}.replay.json",
        clocks="results/{workload}/ncu/{cls}.clocks_applied.json",
    log:
        "logs/replay_ncu/{workload}/{cls}.log",
    benchmark:
        "results/{workload}/benchmarks/replay_ncu/{cls}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: HARNESS_THREADS or 1
    resources:
        gpu=GPU,
        slurm_extra=GPU_SLURM_EXTRA,
        # minutes (a cluster job's time limit): one replay per layer class, many kernel replays each
        runtime=240,
    params:
        job=gpu_job(
            workload=workload_params,
            int8_forced=int8_forced,
            harness=json.dumps(config["harness"], sort_keys=True),
            device=DEVICE,
            ncu=config["ncu"],
            # ncu --query-metrics per chip and ncu version, shared by every replay (written by the first)
            metrics_cache="results/ncu_metrics",
        ),
        files=gpu_files,
    shell:
        gpu_shell("replay_ncu")


rule parse_ncu:
    input:
        csv="results/{workload}/ncu/{cls}.csv",
        lib=lib_inputs("parse_ncu"),
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
