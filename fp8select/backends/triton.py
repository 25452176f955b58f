"""``triton``: fp8select's own Triton block-FP8 GEMM (``fp8select.kernels.triton_gemm``).

Runs where fp8 ``tl.dot`` works: CUDA capability >= 8.9 (Triton errors below), ROCm
gfx942 (e4m3fnuz: Triton's e4m3fn dot fails there, triton#6542) and gfx950, XPU with
Triton's Intel backend, and on CPU under ``TRITON_INTERPRET=1`` (the interpreter: correct
but slow, for tests). Weights stay in the checkpoint layout.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from fp8select.backends.base import Backend, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.probes import AllOf, AnyOf, ComputeCapability, DeviceKind, EnvFlag, GfxArch, Package, Probe, TritonTarget

# The fused-quantization kernel (activation quantized inside the GEMM's K loop) is used only
# where a tuning table says it is faster: on the H200 it was slower than quantize + GEMM at
# every DeepSeek-V3 shape and M measured (benchmarks/results/h200-run1/sweep.log).

TRITON_DEVICES = AnyOf((
    AllOf((DeviceKind(("cuda",)), ComputeCapability(minimum=(8, 9)), TritonTarget("nvidia"))),
    AllOf((DeviceKind(("rocm",)), GfxArch(("gfx942", "gfx950")), TritonTarget("amd"))),
    AllOf((DeviceKind(("xpu",)), TritonTarget("intel"))),
    AllOf((DeviceKind(("cpu",)), EnvFlag("TRITON_INTERPRET"))),
))


class TritonBackend(Backend):
    name = "triton"
    summary = "fp8select's Triton block-FP8 GEMM, fused activation quantization for small M"
    requires: ClassVar[tuple[Probe, ...]] = (Package("triton"), TRITON_DEVICES)
    out_dtypes = (torch.bfloat16, torch.float16, torch.float32)

    def weight_dtype(self, caps: Capabilities) -> torch.dtype:
        return torch.float8_e4m3fnuz if caps.gfx_arch == "gfx942" else torch.float8_e4m3fn

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """The checkpoint layout; on gfx942 an e4m3fn weight becomes e4m3fnuz (Triton's e4m3fn dot
        fails there), same bits but 0x80, scales doubled, once at load time."""
        if self.weight_dtype(caps) == torch.float8_e4m3fnuz and weight.dtype == torch.float8_e4m3fn:
            from fp8select.kernels.vendor_layouts import e4m3fn_to_e4m3fnuz

            w, s = e4m3fn_to_e4m3fnuz(weight, weight_scale)
            n, k = w.shape
            prepared = PreparedWeight(self.name, w, s, block_pair(block_size), n, k, w, scale_nk=s)
        else:
            prepared = super().prepare(weight, weight_scale, block_size, caps)
        # Decided once per layer, not per call: the device does not change.
        prepared.extra["packaged_configs"] = _packaged_table_applies(caps)
        return prepared

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        from fp8select.kernels import triton_gemm

        m = x.shape[0]
        # A measured config (with its "path") from the tuning table, when there is one;
        # otherwise the kernels' own table/heuristic choice.
        config = (prepared.extra.get("tuned", {}).get(triton_gemm.m_bucket(m)) or {}).get("config")
        packaged = prepared.extra.get("packaged_configs")
        if config is None and not (packaged if packaged is not None else _packaged_table_applies(caps)):
            # The packaged configurations were measured on another GPU (and may ask for more
            # shared memory than this one has): use the heuristic defaults instead.
            config = (triton_gemm.linear_config(prepared.n, prepared.k, m, table={}) if input_scale is None
                      else triton_gemm.get_config(prepared.n, prepared.k, m, fused=False, table={}))
        if input_scale is None:
            return triton_gemm.linear(x, prepared.weight, prepared.scale, prepared.block_size,
                                      out_dtype=out_dtype, bias=bias, config=config)
        return triton_gemm.w8a8_block_gemm(x, input_scale, prepared.weight, prepared.scale, prepared.block_size,
                                           out_dtype=out_dtype, bias=bias, config=config)


def _packaged_table_applies(caps: Capabilities) -> bool:
    """Whether the packaged Triton configurations were measured on this GPU model."""
    from fp8select.kernels import triton_gemm

    source = triton_gemm.load_config_table().get("source", {})
    return isinstance(source, dict) and source.get("device") is not None and source.get("device") == caps.device_name
