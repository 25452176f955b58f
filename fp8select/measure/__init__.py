"""Measurement, at the top of the package: CUDA-graph timing (``timing``), ``bench``, ``tune`` (the
tables :mod:`fp8select.measured` holds) and load-time measurement (``loadtime``). Nothing below
imports it; it needs a GPU, except what tests drive on the CPU."""
