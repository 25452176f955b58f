"""Compute kernels for block-wise FP8 linear layers (no policy: callers choose what runs).

Pure torch, always importable: ``quant`` (per-token-group activation quantization),
``weight_quant`` (block quantization of a weight), ``nonfinite`` (NaN rows for kernels that
quantize inside a vendor library), ``vendor_layouts``. Pure Python: ``triton_config`` (the
launch-configuration type) and ``triton_search`` (heuristic defaults, tuning search).
``triton_quant``, ``triton_gemm_kernels``, ``triton_gemm`` and ``triton_nonfinite`` import
triton at module top and are imported lazily, only when a Triton kernel runs, so
``import fp8select`` never pulls in triton or initialises CUDA.
"""
