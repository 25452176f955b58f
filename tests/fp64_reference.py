"""An fp64 dequantized reference written independently of the library, for numerics tests.

It quantizes activations per token per 1x128 group (scale = amax / fp8_max, the same recipe
every backend uses), then dequantizes both operands in float64 and multiplies. Backends are
compared to it by the relative Frobenius error.

A NaN or +-inf in an activation makes that token's output row NaN here (a NaN or infinite
group amax makes every dequantized value of the group NaN), the semantics every backend must
have (tests/test_nonfinite.py).
"""

from __future__ import annotations

import torch


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def quantize_groups(x: torch.Tensor, group: int = 128, dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token 1 x ``group`` quantization: (fp8 values [M, K], float64 scales [M, ceil(K/group)])."""
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.zeros((m, groups * group), dtype=torch.float64, device=x.device)
    padded[:, :k] = x.detach().to(torch.float64)
    blocks = padded.view(m, groups, group)
    scale = blocks.abs().amax(dim=2).clamp_min(1e-10) / fp8_max(dtype)
    q = (blocks / scale[:, :, None]).clamp(-fp8_max(dtype), fp8_max(dtype)).to(torch.float32).to(dtype)
    return q.view(m, groups * group)[:, :k], scale


def dequant_weight(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    n, k = weight.shape
    bn, bk = block
    s = scale.detach().to(torch.float64)
    rows = torch.arange(n, device=weight.device) // bn
    cols = torch.arange(k, device=weight.device) // bk
    return weight.detach().to(torch.float64) * s[rows][:, cols]


def expected(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
             bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """float64 [..., N]: the product every backend should compute (activation quantized as they do)."""
    k = weight.shape[1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if input_scale is None:
        q, s = quantize_groups(x2, block[1], weight.dtype)
    else:
        q, s = x2.detach(), input_scale.reshape(-1, input_scale.shape[-1]).detach().to(torch.float64)
    cols = torch.arange(k, device=x.device) // block[1]
    a = q.to(torch.float64) * s[:, cols]
    out = a @ dequant_weight(weight, scale, block).t()
    if bias is not None:
        out = out + bias.detach().to(torch.float64)
    return out.reshape(*lead, weight.shape[0])


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; NaN anywhere counts as failure (inf)."""
    diff = out.detach().to(ref.device, torch.float64) - ref
    if not torch.isfinite(diff).all():
        return float("inf")
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def random_problem(n: int, k: int, block: tuple[int, int] = (128, 128), *, seed: int = 0,
                   device: str = "cpu", dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """A random fp8 weight [N, K] and positive block scales, never zero."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-440, 440)
    w = torch.where(w.abs() < 1e-3, torch.full_like(w, 0.5), w).to(dtype)
    s = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=g) * 1e-3 + 1e-4
    return w.to(device), s.to(device)
