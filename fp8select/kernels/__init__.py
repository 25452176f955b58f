"""Compute kernels for block-wise FP8 linear layers.

``quant`` is pure torch and always importable; ``triton_search`` (launch-config schema and the
tuning search) is pure Python. ``triton_quant`` and ``triton_gemm`` import triton at module
top and are imported lazily by the Triton backend only when it runs, so ``import fp8select``
never pulls in triton or initialises CUDA.
"""
