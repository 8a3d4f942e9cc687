# The machine's measured ceilings (GEMM peak per dtype, STREAM copy/triad bandwidth): one job per device, run
# where the captures run and with their thread count, measured again only when the machine changes (or on
# `--forcerun measure_ceilings`, or a `ceilings:` edit). DESIGN.md, "Machine ceilings".
# (Snakemake caps a job's threads at --cores: a capture given more threads than the run's cores runs with the cores.)
CEILINGS_THREADS = capture_threads()
if not HARNESS_THREADS and isinstance(run_cores(), int) and run_cores() >= 1:
    CEILINGS_THREADS = min(CEILINGS_THREADS, run_cores())
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
    # Alone on the machine: a capture beside it took CPU time from the GEMMs (on 2 cores an fp32 peak of 55 GFLOP/s
    # instead of 90, and operators "above" it). The job claims every core, so no other job runs meanwhile; the
    # measurement itself runs torch with the captures' threads (params threads, not Snakemake's OMP_NUM_THREADS).
    threads: all_cores
    resources:
        gpu=GPU,
        slurm_extra=GPU_SLURM_EXTRA,
        # a SLURM job asks for the captures' CPUs (the plugin's cpus_per_task, else it would ask for the threads:
        # every core of --cores); on CUDA the job has the whole node anyway (slurm_extra --exclusive)
        cpus_per_task=CEILINGS_THREADS,
    params:
        job=gpu_job(
            device=DEVICE,
            threads=CEILINGS_THREADS,
            ceilings=config["ceilings"],
            # CUDA: the GPU's clocks are locked as the captures lock them; on CPU they do not matter
            clocks=config["clocks"] if GPU else None,
            machine=MACHINE,
        ),
        files=gpu_files,
    shell:
        gpu_shell("measure_ceilings")
