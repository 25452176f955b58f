"""``npu``: Ascend ``torch_npu.npu_quant_matmul`` with block scales on A5 (arch35, Ascend 950).

API followed (docs/vendor-apis.md, "Ascend torch_npu"; op-plugin 7.3.0
DynamicBlockQuantNpuOpApi.cpp / QuantMatmulKernelNpuOpApi.cpp, and MindSpeed's
``Float8BlockMatMul`` call form, since the official torch_npu 6.0 - 7.0 pages document only
the int8 modes):

* activations: ``x_q, x_scale = torch_npu.npu_dynamic_block_quant(x, dst_type=torch.float8_e4m3fn,
  row_block_size=1, col_block_size=128)``, the device's own fused quantizer (``x_scale`` fp32
  [M, K/128] row-major, ``amax / 448``);
* GEMM: ``torch_npu.npu_quant_matmul(x_q, W.t(), S_w.t(), pertoken_scale=x_scale, bias=bias,
  output_dtype=out_dtype, group_sizes=[1, 128, 128])`` (per-token x per-block "G-B" mode).

Layout (:meth:`NpuBackend.prepare`): the weight transposed to [K, N] and its scale to
[K/128, N/128], both as ``.t()`` views of the contiguous checkpoint tensors: op-plugin checks
that the weight's and the scale's transpositions agree (a third-party adapter's note;
unverified against the op-plugin source), and views keep the weight shared with the fallback.
The bias is passed to the kernel in fp32 (the dtype the int8 G-B mode documents).

Gates: an A5 device (name Ascend910_95/Ascend950 or SoC version >= 260, FACTS.md; the FP8
modes exist only there), ``torch_npu`` with both ops (checked when a layer is prepared: they
are registered at import, so the snapshot cannot list them), K % 128 == 0 and N % 128 == 0
(tails of the G-B mode unverified), bf16/fp16 output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fp8select.backends._vendor import EntryPoint, e4m3fn_gate, require
from fp8select.backends.base import Backend, BLOCK_128x128, PreparedWeight, block_pair
from fp8select.capabilities import Capabilities
from fp8select.probes import DeviceKind, Package, Probe
from fp8select.problem import Problem
from fp8select.verdict import Verdict

ARCH35_NAMES = ("Ascend910_95", "Ascend950")
ARCH35_MIN_SOC = 260
MODULE = "torch_npu"
QUANT = "npu_dynamic_block_quant"
MATMUL = "npu_quant_matmul"
GROUP_SIZES = (1, 128, 128)
WHY = "FP8 block mode, Ascend 950"


@dataclass(frozen=True)
class AscendArch35(Probe):
    """The Ascend device is an A5 (arch35): by device name, or SoC version >= 260."""

    @property
    def requirement(self) -> str:
        return f"Ascend A5/arch35 (device name {' or '.join(ARCH35_NAMES)}, or SoC version >= {ARCH35_MIN_SOC})"

    def __call__(self, caps: Capabilities) -> Verdict:
        name = caps.device_name or ""
        if any(tag in name for tag in ARCH35_NAMES):
            return self._verdict(True, name)
        if caps.npu_soc_version is not None and caps.npu_soc_version >= ARCH35_MIN_SOC:
            return self._verdict(True, f"SoC version {caps.npu_soc_version}")
        found = name or "an unknown device name (import torch_npu before resolving)"
        if caps.npu_soc_version is not None:
            found += f", SoC version {caps.npu_soc_version}"
        return self._verdict(False, found)


class NpuBackend(Backend):
    name = "npu"
    summary = "torch_npu npu_dynamic_block_quant + npu_quant_matmul on Ascend A5"
    requires: ClassVar[tuple[Probe, ...]] = (DeviceKind(("npu",)), Package(MODULE), AscendArch35())
    block_sizes = (BLOCK_128x128,)
    n_multiple = 128
    k_multiple = 128
    packages = (MODULE,)

    transpose_views: ClassVar[bool] = True  # W.t() and S_w.t() as views; a test may break the pairing

    def supports(self, problem: Problem, caps: Capabilities) -> Verdict:
        """The shared gate with e4m3fn operands; at load time, both torch_npu ops."""
        return e4m3fn_gate(super().supports(problem, caps), problem, caps, MODULE, (QUANT,), (MATMUL,), why=WHY)

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor, block_size: tuple[int, int],
                caps: Capabilities) -> PreparedWeight:
        """The weight as [K, N] and its scale as [K/128, N/128]: transposed views of the checkpoint."""
        quant = require(MODULE, (QUANT,), WHY)
        matmul = require(MODULE, (MATMUL,), WHY)
        n, k = weight.shape
        w, s = weight.contiguous(), weight_scale.contiguous()
        scale = s.t() if self.transpose_views else s.t().contiguous()
        return PreparedWeight(self.name, w.t(), scale, block_pair(block_size), n, k, w,
                              extra={"quant": quant, "matmul": matmul})

    def run(self, prepared: PreparedWeight, x: torch.Tensor, *, input_scale: torch.Tensor | None,
            bias: torch.Tensor | None, out_dtype: torch.dtype, caps: Capabilities) -> torch.Tensor:
        quant: EntryPoint = prepared.extra["quant"]
        matmul: EntryPoint = prepared.extra["matmul"]
        if input_scale is None:
            x_q, x_s = quant.fn(x, dst_type=torch.float8_e4m3fn, row_block_size=1, col_block_size=128)
        else:
            x_q, x_s = x, input_scale.contiguous()
        return matmul.fn(x_q, prepared.weight, prepared.scale, pertoken_scale=x_s,
                         bias=None if bias is None else bias.to(torch.float32),
                         output_dtype=out_dtype, group_sizes=list(GROUP_SIZES))
