# One small canonical JSON per layer class and one ncu replay plan per class: an unchanged class
# never re-runs its ncu replay (small inputs are compared by checksum). A compiled workload's kernels that
# no layer range claims (whole-model compile) take the layer of their FX nodes: the fusion map, and on an
# nsys timeline the torch.profiler run that places library kernels on their call sites.
checkpoint classify_layers:
    input:
        kernels="results/{workload}/timeline/kernels.parquet",
        ranges="results/{workload}/timeline/ranges.parquet",
        layers="results/{workload}/capture/layers.json",
        fusion_map=fusion_map_input,
        kineto=lambda w: kineto_input(w) if is_compiled(w.workload) else [],
        lib=lib_inputs("classify_layers"),
    output:
        instances="results/{workload}/layers/instances.parquet",
        kernel_layers="results/{workload}/layers/kernel_layers.parquet",
        summary="results/{workload}/layers/classes.json",
        classes_dir=directory("results/{workload}/layers/classes"),
        plans_dir=directory("results/{workload}/layers/replay"),
    log:
        "logs/classify_layers/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/classify_layers.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        verify=config["dedup"]["verify"],
    script:
        "../scripts/classify_layers.py"
