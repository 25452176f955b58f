"""Maintained measurement tools of fp8select, run from the repository root as ``python -m benchmarks.NAME``.

They import the installed ``fp8select`` (``pip install -e .``) and nothing by path. Those that time kernels need
a CUDA GPU and say so in one line, exit status 2, without one. docs/measurements.md says what each one is for;
their distilled results, the figures docs/performance.md quotes, are the JSON files in ``benchmarks/results/``.
"""
