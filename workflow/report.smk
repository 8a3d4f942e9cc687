rule report:
    input:
        run="results/{workload}/capture/run.json",
        clocks="results/{workload}/capture/clocks_applied.json",
        coverage="results/{workload}/coverage.json",
        operators="results/{workload}/operators.parquet",
        phases="results/{workload}/phases.parquet",
        modules="results/{workload}/modules.parquet",
        layer_classes="results/{workload}/layer_classes.parquet",
        diagnostics=diagnostics_input,
        matching=matching_input,
        replays=replay_records,
        advice="results/{workload}/advice.json",
        lib=lib_inputs("report"),
    output:
        report(
            "results/{workload}/report.md",
            caption="report/report_md.rst",
            category="{workload}",
            subcategory="Report",
            labels={"workload": "{workload}", "file": "report.md"},
        ),
    log:
        "logs/report/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/report.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        options=json.dumps(config["report"], sort_keys=True),
    script:
        "../scripts/report.py"


rule report_html:
    input:
        unpack(counters_time_inputs),
        run="results/{workload}/capture/run.json",
        clocks="results/{workload}/capture/clocks_applied.json",
        coverage="results/{workload}/coverage.json",
        operators="results/{workload}/operators.parquet",
        phases="results/{workload}/phases.parquet",
        modules="results/{workload}/modules.parquet",
        layer_classes="results/{workload}/layer_classes.parquet",
        diagnostics=diagnostics_input,
        matching=matching_input,
        replays=replay_records,
        lib=lib_inputs("report_html"),
    # Not in `snakemake --report`: report.html is a self-contained page of its own (~5 MB with plotly.js
    # inlined), and the Snakemake report embeds each file as a data: URL iframe, which Chromium blocks
    # over 2 MB (a blank pane). Open results/{workload}/report.html directly.
    output:
        "results/{workload}/report.html",
    log:
        "logs/report_html/{workload}.log",
    benchmark:
        "results/{workload}/benchmarks/report_html.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        options=json.dumps(config["report"], sort_keys=True),
    script:
        "../scripts/report_html.py"
