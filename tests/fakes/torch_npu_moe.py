"""The grouped GEMM of the fake ``torch_npu`` (part of tests/fakes/torch_npu.py): ``npu_grouped_matmul`` in its
FP8 per-block ("G-B") mode, M grouped, single tensors.

API followed (docs/vendor-apis.md, "Ascend grouped MoE"): the signature of op-plugin's 26.0.0 schema
(``op_plugin/config/op_plugin_functions.yaml``: ``npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]?
bias=None, Tensor[]? scale=None, Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]?
antiquant_offset=None, Tensor[]? per_token_scale=None, Tensor? group_list=None, Tensor[]? activation_input=None,
Tensor[]? activation_quant_scale=None, Tensor[]? activation_quant_offset=None, int? split_item=0, int?
group_type=None, int? group_list_type=0, int? act_type=0, int[]? tuning_config=None, int? output_dtype=None,
int? x_dtype=None, int? weight_dtype=None, int? scale_dtype=None, int? per_token_scale_dtype=None) -> Tensor[]``;
``output_dtype`` is taken as a torch dtype here, as engines pass it); the host checks of its binding
``GroupedMatmulKernelNpuOpApi.cpp`` (their messages: ``group_type`` required and in {-1, 0, 2}, x and weight
not empty, ``split_item`` in 0-3, the output ``[M, weight.size(-1)]``, a "transposed" weight meaning
``stride(-2) == 1 and stride(-1) == size(-2)``); and the G-B constraints of cann ops-transformer's
``aclnnGroupedMatmulV4.md`` for the Ascend 910_95 (raised as ``RuntimeError``, as the aclnn parameter check
reaches Python): x and weight FLOAT8_E4M3FN/E5M2 of one dtype; x, weight and out single tensors with M grouping
(``group_type`` 0, ``split_item`` 2/3, weight 3-D ``[g, K, N]``, x not transposed); ``scale`` FLOAT32
``(g, ceil(N/128), ceil(K/128))`` for a transposed weight, ``(g, ceil(K/128), ceil(N/128))`` otherwise;
``per_token_scale`` FLOAT32 ``(M, ceil(K/128))``; bias, offset, antiquant and activation inputs empty; ``act_type``
0; ``group_list`` int64 ``[g]`` with g <= 1024, ``group_list_type`` 0 (running sums) or 1 (counts; 2 is not on
910_95), summing to at most M; out BF16/FP16/FP32; FP8 only on an arch35 device.

Stricter than documented: both scales contiguous (the aclnn page gives their shapes only), ``output_dtype``
required (without it the output would take x's fp8 dtype, which no G-B row lists). Other modes (non-quantized,
int8, MX, HiF8/FP4, K grouping, multi-tensor lists) raise ``NotImplementedError`` (fake limitation).
Numerics: each group's rows times its weight, exact in float64, cast to ``output_dtype``; rows past the
groups' total are NaN (torch_npu allocates the output uninitialised and the kernel does not write them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import ceil_div, dequantize_blockwise

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.bfloat16, torch.float16, torch.float32)
MAX_GROUPS = 1024


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _transposed(t: torch.Tensor) -> bool:
    """op-plugin's ``is_weight_trans``: the last two dimensions are a transposed view."""
    return t.stride(-2) == 1 and t.stride(-1) == t.size(-2)


def _single(name: str, value: Sequence[torch.Tensor] | None) -> torch.Tensor:
    _check(value is not None and len(value) == 1, f"{name} must be a list of one tensor for the single-tensor G-B mode")
    assert value is not None
    return value[0]


class FakeTorchNpuMoe:
    """``torch_npu.npu_grouped_matmul`` of one installed fake ``torch_npu`` (its knobs decide arch35)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def npu_grouped_matmul(
        self,
        x: Sequence[torch.Tensor],
        weight: Sequence[torch.Tensor],
        *,
        bias: Sequence[torch.Tensor] | None = None,
        scale: Sequence[torch.Tensor] | None = None,
        offset: Sequence[torch.Tensor] | None = None,
        antiquant_scale: Sequence[torch.Tensor] | None = None,
        antiquant_offset: Sequence[torch.Tensor] | None = None,
        per_token_scale: Sequence[torch.Tensor] | None = None,
        group_list: torch.Tensor | None = None,
        activation_input: Sequence[torch.Tensor] | None = None,
        activation_quant_scale: Sequence[torch.Tensor] | None = None,
        activation_quant_offset: Sequence[torch.Tensor] | None = None,
        split_item: int = 0,
        group_type: int | None = None,
        group_list_type: int = 0,
        act_type: int = 0,
        tuning_config: Sequence[int] | None = None,
        output_dtype: torch.dtype | None = None,
        x_dtype: Any = None,
        weight_dtype: Any = None,
        scale_dtype: Any = None,
        per_token_scale_dtype: Any = None,
    ) -> list[torch.Tensor]:
        """Grouped GEMM; the fake implements the FP8 G-B, M-grouped, single-tensor form (module docstring)."""
        _check(group_type is not None, "Requires manual passing group_type, current is None.")
        _check(group_type in (-1, 0, 2), f"The group type must be -1, 0 or 2, but now is [{group_type}]")
        _check(len(x) > 0 and len(weight) > 0, "Invalid inputs: neither x nor weight could be empty.")
        _check(split_item in (0, 1, 2, 3), f"Invalid value of split_item [{split_item}], which should only be one of 0/1/2/3.")
        if x[0].dtype not in _FP8 or group_type != 0 or any(v is not None for v in (x_dtype, weight_dtype, scale_dtype,
                                                                                       per_token_scale_dtype)):
            raise NotImplementedError("the fake emulates the FP8 per-block (G-B) mode with M grouping only")
        _check(self.owner.is_arch35, f"FLOAT8 grouped matmul is only supported on Ascend 910_95 (arch35), device is "
               f"{self.owner.device_name}")
        _check(split_item in (2, 3), f"M grouping with single tensors needs split_item 2 or 3, got {split_item}")
        a, w = _single("x", x), _single("weight", weight)
        _check(a.dim() == 2 and a.is_contiguous(), f"x must be a contiguous 2-D [M, K] tensor (x cannot be transposed), "
               f"got {list(a.shape)} strides {tuple(a.stride())}")
        _check(w.dim() == 3 and w.dtype == a.dtype, f"weight must be one 3-D [g, K, N] tensor of x's dtype {a.dtype}, "
               f"got {w.dtype} {list(w.shape)}")
        trans = _transposed(w)
        _check(trans or w.is_contiguous(), f"weight must be contiguous [g, K, N] or the transposed view of a contiguous "
               f"[g, N, K] tensor, got strides {tuple(w.stride())}")
        m, k = a.shape
        groups, k_w, n = w.shape
        _check(k == k_w, f"x K ({k}) and weight K ({k_w}) differ")
        for name, value in (("bias", bias), ("offset", offset), ("antiquant_scale", antiquant_scale),
                            ("antiquant_offset", antiquant_offset), ("activation_input", activation_input),
                            ("activation_quant_scale", activation_quant_scale),
                            ("activation_quant_offset", activation_quant_offset)):
            _check(value is None or len(value) == 0, f"{name} must be empty in the G-B mode")
        _check(act_type == 0, f"act_type must be 0 on Ascend 910_95, got {act_type}")
        kb, nb = ceil_div(k, 128), ceil_div(n, 128)
        s = _single("scale", scale)
        expected = (groups, nb, kb) if trans else (groups, kb, nb)
        _check(s.dtype == torch.float32 and tuple(s.shape) == expected and s.is_contiguous(),
               f"scale must be a contiguous float32 {list(expected)} tensor for a {'transposed' if trans else 'plain'} "
               f"weight, got {s.dtype} {list(s.shape)} strides {tuple(s.stride())}")
        pts = _single("per_token_scale", per_token_scale)
        _check(pts.dtype == torch.float32 and tuple(pts.shape) == (m, kb) and pts.is_contiguous(),
               f"per_token_scale must be a contiguous float32 [M, ceil(K/128)] = {[m, kb]} tensor, got {pts.dtype} "
               f"{list(pts.shape)}")
        counts = self._counts(group_list, group_list_type, groups, m)
        _check(output_dtype in _OUT, f"output_dtype must be bfloat16/float16/float32 in the G-B mode, got {output_dtype}")
        assert output_dtype is not None
        out = torch.full((m, n), float("nan"), dtype=torch.float64)
        start = 0
        for g, rows in enumerate(counts):
            if rows:
                w_nk = w[g].t() if trans else w[g].t().contiguous()
                s_nk = s[g] if trans else s[g].t()
                out[start:start + rows] = (dequantize_blockwise(a[start:start + rows], pts[start:start + rows], 1, 128)
                                           @ dequantize_blockwise(w_nk, s_nk, 128, 128).T)
            start += rows
        return [out.to(output_dtype)]

    @staticmethod
    def _counts(group_list: torch.Tensor | None, group_list_type: int, groups: int, m: int) -> list[int]:
        """Rows per group from ``group_list`` (checked)."""
        _check(isinstance(group_list, torch.Tensor), "group_list must be an int64 tensor in the single-tensor G-B mode")
        assert isinstance(group_list, torch.Tensor)
        _check(group_list.dtype == torch.int64 and group_list.dim() == 1 and group_list.numel() == groups,
               f"group_list must be an int64 [g={groups}] tensor, got {group_list.dtype} {list(group_list.shape)}")
        _check(groups <= MAX_GROUPS, f"group_list supports at most {MAX_GROUPS} groups, got {groups}")
        _check(group_list_type in (0, 1), f"group_list_type must be 0 or 1 on Ascend 910_95, got {group_list_type}")
        values = group_list.tolist()
        counts = values if group_list_type == 1 else [b - a for a, b in zip([0, *values[:-1]], values, strict=True)]
        _check(all(c >= 0 for c in counts), f"group_list must describe non-negative group sizes, got {values}")
        _check(sum(counts) <= m, f"group_list's groups hold {sum(counts)} rows, more than x's M={m}")
        return [int(c) for c in counts]
