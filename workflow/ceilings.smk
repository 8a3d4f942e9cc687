# The machine's measured ceilings (GEMM peak per dtype, STREAM copy/triad bandwidth): one job per device, run
# where the captures run and with their thread count, measured again only when the machine changes (or on
# `--forcerun measure_ceilings`, or a `ceilings:` edit). DESIGN.md, "Machine ceilings".
CEILINGS_THREADS = capture_threads()
# What identifies the machine (CPU model and count, GPUs from nvidia-smi -L on CUDA, the torch version, the
# threads), read now without importing torch: a params value, so a change re-runs the measurement.
MACHINE = machine_identity(DEVICE, CEILINGS_THREADS)


rule measure_ceilings:
    input:
        lib=lib_inputs("measure_ceilings"),
    output:
        ceilings=f"results/ceilings/{DEVICE}.json",
        clocks=f"results/ceilings/{DEVICE}.clocks_applied.json",
    log:
        f"logs/measure_ceilings/{DEVICE}.log",
    benchmark:
        f"results/ceilings/benchmarks/measure_ceilings.{DEVICE}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: CEILINGS_THREADS
    resources:
        gpu=GPU,
        slurm_extra=GPU_SLURM_EXTRA,
    params:
        job=gpu_job(
            device=DEVICE,
            ceilings=config["ceilings"],
            # CUDA: the GPU's clocks are locked as the captures lock them; on CPU they do not matter
            clocks=config["clocks"] if GPU else None,
            machine=MACHINE,
        ),
        files=gpu_files,
    shell:
        gpu_shell("measure_ceilings")
