"""Model transforms: the change vocabulary (what each change is, its preconditions), how a change is applied to a
model (settings, compiler options, FX passes) and variant naming. The profiling harness (capture/) applies them to
profile a variant; the optimizer (optimize/) advises and measures them. Nothing here imports either."""
