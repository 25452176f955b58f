"""The MoE entry points of the fake ``sgl_kernel`` (sglang-kernel 0.4.4; part of tests/fakes/sgl_kernel.py).

Checked against sglang-kernel 0.4.4: ``sgl_kernel/moe.py`` defines both Python wrappers (argument
orders below), ``sm90/common_ops.abi3.so`` registers the schemas ``fp8_blockwise_scaled_grouped_mm(Tensor
output, Tensor a_ptrs, Tensor b_ptrs, Tensor out_ptrs, Tensor a_scales_ptrs, Tensor b_scales_ptrs, Tensor a,
Tensor b, Tensor scales_a, Tensor scales_b, Tensor stride_a, Tensor stride_b, Tensor stride_c, Tensor
layout_sfa, Tensor layout_sfb, Tensor problem_sizes, Tensor expert_offsets, Tensor workspace) -> ()`` and
``prepare_moe_input(Tensor topk_ids, Tensor expert_offsets, Tensor? blockscale_offsets, Tensor
problem_sizes1, Tensor problem_sizes2, Tensor input_permutation, Tensor output_permutation, int num_experts,
int n, int k) -> ()``, and holds every check message raised here. The package has no C++ source; the
checks' order and what the device code reads and writes are from sgl-project/sglang ``sgl-kernel/csrc/moe/``:

* ``fp8_blockwise_moe_kernel.cu``, ``fp8_blockwise_scaled_grouped_mm``: the ``TORCH_CHECK``s on
  ``problem_sizes`` (2-D, ``[E, 3]``, E == ``expert_offsets.size(0)``, int32), dtypes (``a``/``b`` e4m3fn,
  ``output`` bf16/fp16, scales fp32, strides int64, layouts and offsets int32) and ranks (``layout_sf*``
  2-D, the rest 1-D), in that order, then the SM dispatch (90 and 100 in this build; others
  ``TORCH_CHECK_NOT_IMPLEMENTED``). ``sm90_fp8_blockwise_group_mm_dispatch_shape``: ``a.size(0) <= 2048``
  swaps A and B (``b.transpose(1, 2)``, ``a.t()``, ``output.t()``, scales likewise), larger ``a`` does not.
* ``cutlass_moe_helper.cu``, ``run_get_group_gemm_starts``: dtype checks, then ``out.size(1) % 128 == 0
  or out.size(0) % 128 == 0`` and the same for its "a" (the swapped tensors on the small path: ``output.t()``
  and ``b.transpose(1, 2)``), then ``get_group_gemm_starts`` (one block of E threads) writes per expert
  ``a + off_e * K``, ``b + e * K * N``, ``out + off_e * N``, ``scales_a + off_e * K / 128`` and ``scales_b
  + e * K * N / 128 / 128`` into the pointer arrays and a scale layout into ``layout_sf*`` (64-bit
  offsets since sgl-project/sglang#8564). ``launch_sm90_fp8_blockwise_scaled_group_mm``: A row-major, B
  column-major, per-expert leading dimensions read from ``stride_a`` / ``stride_b`` / ``stride_c``, scales
  K-major (``Sm90BlockwiseScaleConfig<..., Major::K, Major::K>``); ``can_implement`` fails ("Failed to
  implement GEMM") unless K is a multiple of 16 and N of 8 (16-byte TMA alignment of fp8 / bf16 rows).
* ``prepare_moe_input.cu``: ``TORCH_CHECK(topk_ids.dtype() == torch::kInt32)``, then ``compute_problem_sizes``
  (``problem_sizes1[e] = (count_e, 2n, k)``, ``problem_sizes2[e] = (count_e, k, n)``), ``compute_expert_offsets``
  (``[E + 1]`` running sums) and ``compute_arg_sorts`` (``input_permutation[row] = slot / topk``,
  ``output_permutation[slot] = row``, rows taken by ``atomicAdd``: in no fixed order within an expert).
  Slots whose id is outside ``[0, E)`` are counted nowhere; their entries, and the tail of
  ``input_permutation``, are left unwritten.

What the device code assumes but no host check catches is enforced here too, as errors: the pointer
arrays int64 with E entries, ``layout_sf*`` ``[E, 5]`` int32 (SGLang's allocation), the stride arrays'
values (K, K, N), ``a``/``scales_a``/``output`` packed row-major, ``b`` and ``scales_b`` per expert
row-major ``[N, K]`` / ``[N/128, K/128]`` at ``e * N * K`` (the checkpoint, or its ``transpose(1, 2)``
view as SGLang passes it), every expert's rows inside ``a``, ``scales_a`` and ``output``, ``topk_ids``
contiguous and not empty (``min(512, numel)`` threads), ``E <= 1024``, a workspace of at least SGLang's
90,000 bytes (the real minimum, CUTLASS's ``get_workspace_size``, is not checked by the kernel).

Stricter than the library, on purpose: K and N must be multiples of 128 (the scale offsets use
``K / 128`` and ``K * N / 128 / 128``; tails would be read from the wrong expert). The product is
computed in float64 per expert; rows of ``output`` outside every expert are written NaN (the kernel
leaves them unwritten: an adapter must never read them), and ``prepare_moe_input`` shuffles each
expert's rows with a fixed seed (the atomics give no order).
"""

from __future__ import annotations

import torch

from . import ceil_div

SM_DISPATCHED = (90, 100)
SWAP_AB_MAX_ROWS = 2048
MAX_EXPERTS = 1024
MIN_WORKSPACE = 90000
LAYOUT_INTS = 5


def _torch_check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _expected(condition: str) -> str:
    return f"Expected {condition} to be true, but got false.  (Could this error message be improved?  If so, please " \
           "report an enhancement request to PyTorch.)"


def _device(ok: bool, what: str) -> None:
    """A contract of the device code no host check catches (fake: an error)."""
    if not ok:
        raise RuntimeError(f"sgl_kernel fake: {what}")


def _expert_view(t: torch.Tensor, experts: int, rows: int, cols: int, what: str) -> torch.Tensor:
    """``t``'s memory read as the kernel does: ``[experts, rows, cols]`` row-major per expert at ``e * rows * cols``,
    given as that tensor or as its ``transpose(1, 2)`` view."""
    _device(t.dim() == 3 and t.shape[0] >= experts and t.stride(0) == rows * cols and (
        (tuple(t.shape[1:]) == (rows, cols) and t.stride()[1:] == (cols, 1))
        or (tuple(t.shape[1:]) == (cols, rows) and t.stride()[1:] == (1, cols))),
        f"{what} is [E, {rows}, {cols}] row-major per expert (or its transpose(1, 2) view), got shape "
        f"{tuple(t.shape)} strides {tuple(t.stride())}")
    return torch.as_strided(t, (experts, rows, cols), (rows * cols, cols, 1))


def _dequant(q: torch.Tensor, scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    rows, k = q.shape
    expanded = scale.to(torch.float64).repeat_interleave(block_rows, 0)[:rows].repeat_interleave(128, 1)[:, :k]
    return q.to(torch.float64) * expanded


class FakeSglKernelMoe:
    """The grouped GEMM and its routing, sharing the dense fake's SM knob (``dense.sm_version``)."""

    def __init__(self, dense: object) -> None:
        self.dense = dense
        self.shuffle = torch.Generator().manual_seed(1234)

    def fp8_blockwise_scaled_grouped_mm(
        self, output: torch.Tensor, a_ptrs: torch.Tensor, b_ptrs: torch.Tensor, out_ptrs: torch.Tensor,
        a_scales_ptrs: torch.Tensor, b_scales_ptrs: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
        scales_a: torch.Tensor, scales_b: torch.Tensor, stride_a: torch.Tensor, stride_b: torch.Tensor,
        stride_c: torch.Tensor, layout_sfa: torch.Tensor, layout_sfb: torch.Tensor, problem_sizes: torch.Tensor,
        expert_offsets: torch.Tensor, workspace: torch.Tensor,
    ) -> None:
        """``output[off_e : off_e + m_e] = dequant(a[...]) @ dequant(b_e)`` per expert (module docstring)."""
        _torch_check(problem_sizes.dim() == 2, "problem_sizes must be 2D tensor")
        _torch_check(problem_sizes.size(1) == 3, "problem_sizes must have shape (num_experts, 3)")
        _torch_check(problem_sizes.size(0) == expert_offsets.size(0), "Number of experts in problem_sizes must match expert_offsets")
        _torch_check(problem_sizes.dtype == torch.int32, "problem_sizes must be int32")
        _torch_check(a.dtype == torch.float8_e4m3fn, "a must be kFloat8_e4m3fn")
        _torch_check(b.dtype == torch.float8_e4m3fn, "b must be kFloat8_e4m3fn")
        _torch_check(output.dtype in (torch.bfloat16, torch.float16), "output must be bfloat16 or half")
        _torch_check(scales_a.dtype == torch.float32, "scales_a must be float32")
        _torch_check(scales_b.dtype == torch.float32, "scales_b must be float32")
        for name, t in (("stride_a", stride_a), ("stride_b", stride_b), ("stride_c", stride_c)):
            _torch_check(t.dtype == torch.int64, f"{name} must be int64")
        _torch_check(layout_sfa.dtype == torch.int32, "layout_sfa must be int32")
        _torch_check(layout_sfb.dtype == torch.int32, "layout_sfb must be int32")
        _torch_check(expert_offsets.dtype == torch.int32, "expert_offsets must be int32")
        for name, t, dim in (("output", output, 2), ("a", a, 2), ("b", b, 3), ("scales_a", scales_a, 2),
                             ("scales_b", scales_b, 3)):
            _torch_check(t.dim() == dim, f"{name} must be {dim}D tensor")
        for name, t in (("stride_a", stride_a), ("stride_b", stride_b), ("stride_c", stride_c)):
            _torch_check(t.dim() == 1, f"{name} must be 1D tensor")
        _torch_check(layout_sfa.dim() == 2, "layout_sfa must be 1D tensor")  # sic: the check is dim() == 2
        _torch_check(layout_sfb.dim() == 2, "layout_sfb must be 1D tensor")
        for name, t in (("a_ptrs", a_ptrs), ("b_ptrs", b_ptrs), ("out_ptrs", out_ptrs), ("a_scales_ptrs", a_scales_ptrs),
                        ("b_scales_ptrs", b_scales_ptrs), ("expert_offsets", expert_offsets), ("workspace", workspace)):
            _torch_check(t.dim() == 1, f"{name} must be 1D tensor")
        sm = getattr(self.dense, "sm_version", 90)
        if sm not in SM_DISPATCHED:
            raise NotImplementedError(f"No implemented fp8_blockwise_scaled_grouped_mm for current compute capability: {sm}")
        _device(sm == 90, "only the sm90 path is emulated (sm100 uses other scale layouts)")
        rows, k = a.shape
        n = output.shape[1]
        swapped = rows <= SWAP_AB_MAX_ROWS
        c_t, a_t = (output.t(), b.transpose(1, 2)) if swapped else (output, a)
        # run_get_group_gemm_starts (cutlass_moe_helper.cu)
        _torch_check(c_t.size(1) % 128 == 0 or c_t.size(0) % 128 == 0,
                     _expected("out_tensors.size(1) % 128 == 0 or out_tensors.size(0) % 128 == 0"))
        _torch_check(a_t.size(1) % 128 == 0 or a_t.size(0) % 128 == 0,
                     _expected("a_tensors.size(1) % 128 == 0 or a_tensors.size(0) % 128 == 0"))
        experts = expert_offsets.size(0)
        _device(experts <= MAX_EXPERTS, f"E <= {MAX_EXPERTS} (get_group_gemm_starts runs one block of E threads), got {experts}")
        _torch_check(k % 16 == 0 and n % 8 == 0, "Failed to implement GEMM")
        _device(k % 128 == 0 and n % 128 == 0, f"K and N multiples of 128 (fake: the scale offsets use K/128, K*N/128/128), "
                                               f"got K={k}, N={n}")
        for name, t in (("a_ptrs", a_ptrs), ("b_ptrs", b_ptrs), ("out_ptrs", out_ptrs), ("a_scales_ptrs", a_scales_ptrs),
                        ("b_scales_ptrs", b_scales_ptrs)):
            _device(t.dtype == torch.int64 and t.numel() >= experts and t.is_contiguous(), f"{name} is int64 [E] contiguous")
        for name, t in (("layout_sfa", layout_sfa), ("layout_sfb", layout_sfb)):
            _device(t.shape[0] >= experts and t.shape[1] == LAYOUT_INTS and t.is_contiguous(),
                    f"{name} is int32 [E, {LAYOUT_INTS}] contiguous, got {tuple(t.shape)}")
        for name, t, value in (("stride_a", stride_a, k), ("stride_b", stride_b, k), ("stride_c", stride_c, n)):
            _device(t.numel() >= experts and bool((t[:experts] == value).all()),
                    f"{name}[:E] == {value} (the leading dimension the kernel reads), got {t[:experts].tolist()}")
        _device(problem_sizes.is_contiguous() and expert_offsets.is_contiguous(), "problem_sizes, expert_offsets contiguous")
        _device(workspace.dtype == torch.uint8 and workspace.numel() >= MIN_WORKSPACE,
                f"a uint8 workspace of at least {MIN_WORKSPACE} bytes (SGLang's), got {workspace.numel()} {workspace.dtype}")
        _device(a.stride() == (k, 1) and output.stride() == (n, 1), "a and output packed row-major")
        _device(tuple(scales_a.shape) == (rows, k // 128) and scales_a.is_contiguous(),
                f"scales_a is [R, K/128] row-major (K-major), got {tuple(scales_a.shape)} strides {tuple(scales_a.stride())}")
        _device(output.shape[0] == rows, "output has a's rows")
        for t in (a, b, output):
            _device(t.data_ptr() % 16 == 0, "a, b and output 16-byte aligned (TMA)")
        weights = _expert_view(b, experts, n, k, "b")
        wscales = _expert_view(scales_b, experts, ceil_div(n, 128), ceil_div(k, 128), "scales_b")
        sizes, offs = problem_sizes.tolist(), expert_offsets.tolist()
        out = torch.full((rows, n), float("nan"), dtype=torch.float64)
        for e, ((m_e, n_e, k_e), off) in enumerate(zip(sizes, offs, strict=True)):
            _device((n_e, k_e) == (n, k), f"problem_sizes[{e}] is (m, N={n}, K={k}), got {(m_e, n_e, k_e)}")
            _device(m_e >= 0 and 0 <= off and off + m_e <= rows, f"expert {e}'s rows [{off}, {off + m_e}) inside R={rows}")
            if m_e:
                a64 = _dequant(a[off:off + m_e], scales_a[off:off + m_e], 1)
                out[off:off + m_e] = a64 @ _dequant(weights[e], wscales[e], 128).T
        a_ptrs[:experts] = torch.tensor([a.data_ptr() + off * k for off in offs])
        b_ptrs[:experts] = torch.tensor([b.data_ptr() + e * k * n for e in range(experts)])
        out_ptrs[:experts] = torch.tensor([output.data_ptr() + off * n * output.element_size() for off in offs])
        a_scales_ptrs[:experts] = torch.tensor([scales_a.data_ptr() + off * (k // 128) * 4 for off in offs])
        b_scales_ptrs[:experts] = torch.tensor([scales_b.data_ptr() + e * (k // 128) * (n // 128) * 4 for e in range(experts)])
        output.copy_(out.to(output.dtype))

    def prepare_moe_input(
        self, topk_ids: torch.Tensor, expert_offsets: torch.Tensor, problem_sizes1: torch.Tensor,
        problem_sizes2: torch.Tensor, input_permutation: torch.Tensor, output_permutation: torch.Tensor,
        num_experts: int, n: int, k: int, blockscale_offsets: torch.Tensor | None = None,
    ) -> None:
        """Counts, offsets and the two permutations (module docstring); unrouted entries left unwritten."""
        _torch_check(topk_ids.dtype == torch.int32, _expected("topk_ids.dtype() == torch::kInt32"))
        _device(blockscale_offsets is None, "blockscale_offsets is None (the FP4 form is not emulated)")
        _device(topk_ids.dim() == 2 and topk_ids.is_contiguous(), "topk_ids is [M, topk] contiguous (read as a flat array)")
        _device(topk_ids.numel() > 0, "topk_ids not empty (the kernels launch min(512, numel) threads)")
        slots, topk = topk_ids.numel(), topk_ids.shape[1]
        for name, t, size in (("expert_offsets", expert_offsets, num_experts + 1), ("input_permutation", input_permutation, slots),
                              ("output_permutation", output_permutation, slots)):
            _device(t.dtype == torch.int32 and t.is_contiguous() and t.numel() >= size, f"{name} is int32 with >= {size} entries")
        for name, t in (("problem_sizes1", problem_sizes1), ("problem_sizes2", problem_sizes2)):
            _device(t.dtype == torch.int32 and t.is_contiguous() and t.numel() >= 3 * num_experts, f"{name} is int32 [E, 3]")
        ids = topk_ids.reshape(-1).to(torch.int64)
        start = 0
        expert_offsets.view(-1)[0] = 0
        for e in range(num_experts):
            where = torch.nonzero(ids == e).flatten()
            where = where[torch.randperm(where.numel(), generator=self.shuffle)]
            count = where.numel()
            problem_sizes1.view(-1)[3 * e: 3 * e + 3] = torch.tensor([count, 2 * n, k], dtype=torch.int32)
            problem_sizes2.view(-1)[3 * e: 3 * e + 3] = torch.tensor([count, k, n], dtype=torch.int32)
            dest = torch.arange(start, start + count)
            input_permutation.view(-1)[dest] = (where // topk).to(torch.int32)
            output_permutation.view(-1)[where] = dest.to(torch.int32)
            start += count
            expert_offsets.view(-1)[e + 1] = start
