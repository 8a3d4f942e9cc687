"""The capture side: build the workload (:mod:`.workloads`, :mod:`.training`), run it under a profiler
(:mod:`.harness`), record compiled FX nodes' modules (:mod:`.fx_module_paths`), lock GPU clocks (:mod:`.clocks`),
and the capture jobs that tie them together (:mod:`.jobs`). Imports no pandas: GPU jobs start fast."""
