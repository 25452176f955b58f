"""fp8select's Triton linear bound to one weight: :class:`BoundGemm` (the GEMM of one launch
configuration, its variants bound to compiled kernels at first use) and :class:`BoundLinear` (the
quantizer and GEMM of a layer's route, its calls replayed per M once recorded,
:class:`~fp8select.kernels.triton_launch.Replay`). The checks of a weight, block size and
configuration they bind to live here too; the per-call entry points are :mod:`.triton_gemm`'s."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import triton

from .quant import DEFAULT_EPS, M_MAJOR, ROW_MAJOR, fp8_format
from .stream_scratch import run_with_workspace
from .triton_config import SCALE_GROUP_K, TritonConfig
from .triton_device import TensorDescriptor, _fixup_counters, _persistent_programs, _tma_ok, wgmma_runs
from .triton_gemm_kernels import _splitk_reduce_kernel, _w8a8_block_kernel, _w8a8_persistent_kernel, _w8a8_swap_kernel
from .triton_launch import BoundKernel, Recorded, Replay, Replays, int_class, tensor_class
from .triton_pdl import PDL_MAX_M, pdl_possible
from .triton_quant import TritonQuantizer, fp8_constexprs, hw_rne
from .triton_search import heuristic_config

__all__ = ["SUPPORTED_BLOCK_SIZES", "BoundGemm", "BoundLinear"]

SUPPORTED_BLOCK_SIZES = ((128, 128), (1, 128))
"""Weight scale blocks ``(bn, bk)`` the kernels handle."""

_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_weight(b: torch.Tensor, b_scale: torch.Tensor, block_size: tuple[int, int], k: int) -> int:
    """Validate weight, weight scale and block size against K; return the scale's row block."""
    block = tuple(block_size)
    if block not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {block}")
    if b.dim() != 2 or b.shape[1] != k:
        raise ValueError(f"b must be [N, K] with K={k}, got shape {tuple(b.shape)}")
    fp8_format(b.dtype)
    scale_bn = block[0]
    want = (triton.cdiv(b.shape[0], scale_bn), triton.cdiv(k, SCALE_GROUP_K))
    if tuple(b_scale.shape) != want or b_scale.dtype != torch.float32:
        raise ValueError(
            f"b_scale must be float32 of shape {want} for block {block}, "
            f"got {b_scale.dtype} {tuple(b_scale.shape)}"
        )
    return scale_bn


def _check_config(config: object) -> None:
    if config is not None and not isinstance(config, TritonConfig):
        raise ValueError(f"config must be a TritonConfig or None, got {type(config).__name__} "
                         "(TritonConfig.from_dict reads a mapping)")


class BoundGemm:
    """The GEMM of one weight under one launch configuration, bound once: ``gemm(a, a_scale, bias, out)``.

    What does not depend on a call is worked out here, once: the split count, the weight's TMA
    descriptor, the constexprs, whether PDL can apply; each variant of the kernels a call can need
    (bias or not, PDL or not, the swap kernel's quantized rows) is bound to a :class:`BoundKernel`
    at its first use. A call computes the grid, allocates the split-K workspace and launches.
    ``quant``: the path quantizes ``a`` in the kernel (``a_scale`` is then None). ``counters``:
    the caller's split-K counters (:func:`fixup_counters`); too few of them for a launch, and its
    partials are summed by the second kernel instead of allocating more.
    """

    def __init__(self, b: torch.Tensor, b_scale: torch.Tensor, scale_bn: int, cfg: TritonConfig, *, quant: bool,
                 device: torch.device, counters: torch.Tensor | None = None) -> None:
        self.n, self.k = n, k = b.shape
        self.b, self.b_scale, self.scale_bn, self.quant, self.device = b, b_scale, scale_bn, quant, device
        self.wgmma = cfg.path == "wgmma" and not quant and wgmma_runs(device) and _tma_ok(b)
        if cfg.path == "wgmma" and not self.wgmma:
            cfg = replace(cfg, path="gemm")  # the tile kernel with the same tiles where the Gluon one does not run
        self.cfg = cfg
        self.counters = counters
        self.split = cfg.split_for(k)
        self.fixup = bool(cfg.FIXUP) and self.split > 1
        self.n_tiles = triton.cdiv(n, cfg.BLOCK_N)
        self.use_tma = bool(cfg.TMA) and _tma_ok(b)
        self.b_desc = TensorDescriptor(b, list(b.shape), [b.stride(0), 1], [cfg.BLOCK_N, SCALE_GROUP_K]) if self.use_tma else None
        self.b_strides = (*b.stride(), *b_scale.stride())
        kernel = _w8a8_swap_kernel if cfg.swap else _w8a8_block_kernel
        # PDL for launches of up to PDL_MAX_M rows; a GEMM behind the quantizer only for weights up to its limit.
        self.pdl = pdl_possible(kernel, device, 0 if quant else n * k)
        self.constexprs = dict(
            SCALE_BN=scale_bn, B_SCALE_SCALAR=scale_bn % cfg.BLOCK_N == 0, HW_RNE=hw_rne(kernel, device, b.dtype),
            IS_SPLIT=self.split > 1, EVEN_K=k % SCALE_GROUP_K == 0, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
            BLOCK_K=SCALE_GROUP_K, **fp8_constexprs(b.dtype))
        self._kernels: dict[tuple[Any, ...], BoundKernel] = {}
        self._tile_gemm: BoundGemm | None = None  # the wgmma configuration's tiles on the tile kernel
        self.repeat_rows_ok = True  # False once the swap kernel's row repetition failed to compile (see __call__)

    def statics(self) -> tuple[Any, ...]:
        """What every launch reads besides a call's own tensors: the weight, its scales and TMA
        descriptor, the split-K counters (for :class:`~fp8select.kernels.triton_launch.Replay`)."""
        return tuple(t for t in (self.b, self.b_scale, self.b_desc, self.counters) if t is not None)

    def workspace(self, m: int) -> tuple[int, int, int] | None:
        """The shape of the fp32 split-K partials a call of ``m`` rows writes (None: it writes none)."""
        return (self.split, m, self.n) if self.split > 1 and not self.wgmma else None

    def __call__(self, a: torch.Tensor, a_scale: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor,
                 ws: torch.Tensor | None = None, record: list[Recorded] | None = None) -> None:
        """Write ``out``, a contiguous [M, N], from ``a`` [M, K] (fp8 with ``a_scale``, or unquantized when the
        path quantizes). ``ws``: the split-K partials, shaped as :meth:`workspace` says (None: allocated
        here). ``record``: append each launch (:class:`~fp8select.kernels.triton_launch.Replay`)."""
        cfg = self.cfg
        if self.wgmma:
            if a_scale is not None and _tma_ok(a) and _tma_ok(out):  # (wgmma reads a quantized activation)
                from . import gluon_gemm

                gluon_gemm.launch(a, a_scale, self.b, self.b_scale, self.scale_bn, bias, out, cfg)
                if record is not None:
                    record.append((None, None, ()))  # launched by Gluon's own launcher: not replayable
                return
            if self._tile_gemm is None:
                self._tile_gemm = BoundGemm(self.b, self.b_scale, self.scale_bn, replace(cfg, path="gemm"),
                                            quant=self.quant, device=self.device, counters=self.counters)
            self._tile_gemm(a, a_scale, bias, out, ws, record)
            return
        m = a.shape[0]
        n, split = self.n, self.split
        grid0 = -(-m // cfg.BLOCK_M) * self.n_tiles
        counters = self.counters
        fixup = self.fixup and (counters is None or counters.numel() >= grid0)
        if split == 1:
            ws = out
        elif ws is None:
            ws = torch.empty((split, m, n), dtype=torch.float32, device=out.device)
        if not fixup:
            counters = out
        elif counters is None:
            counters = _fixup_counters(out.device, grid0)
        swap = cfg.swap
        use_tma = self.use_tma and (swap or (not self.quant and _tma_ok(a)))
        pdl = self.pdl and m <= PDL_MAX_M
        has_bias = bias is not None
        stride_bias = bias.stride(0) if bias is not None else 0
        if cfg.PERSISTENT and use_tma and not self.quant:
            programs = _persistent_programs(cfg, out.device, grid0)
            if programs:
                self._persistent(a, a_scale, bias, stride_bias, out, m, programs, record)
                return
        a_arg: Any = TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [cfg.BLOCK_M, SCALE_GROUP_K]) \
            if use_tma and not swap else a
        stride_am, stride_ak = a.stride()
        if a_scale is None:  # the kernel quantizes: the weight scale stands in for the unused pointer
            scale, stride_asm, stride_ask = self.b_scale, 0, 0
        else:
            scale = a_scale
            stride_asm, stride_ask = a_scale.stride()
        args = (a_arg, scale, self.b_desc if use_tma else self.b, self.b_scale, bias if has_bias else self.b_scale, out,
                ws, counters, m, n, self.k, split, stride_am, stride_ak, stride_asm, stride_ask, *self.b_strides,
                stride_bias, n, 1, DEFAULT_EPS)  # out: a contiguous [M, N]
        # What Triton could specialize differently from call to call (triton_launch.py says why only these).
        key = (a.dtype, a.data_ptr() % 16 == 0, int_class(stride_am), int_class(stride_ak),
               a_scale is None or a_scale.data_ptr() % 16 == 0, bias is not None and (bias.dtype, bias.data_ptr() % 16 == 0))
        if swap:
            # Activation rows the kernel loads per tile: all of M, rounded up to a power of two,
            # when M fits one tile (decode), else the whole tile.
            quant_rows = min(1 << (m - 1).bit_length(), cfg.BLOCK_M)
            if quant_rows not in (1, cfg.BLOCK_M) and not self.repeat_rows_ok:
                quant_rows = cfg.BLOCK_M
            try:
                self._kernel("swap", use_tma, has_bias, fixup, pdl, quant_rows)((grid0, split, 1), args, key, record)
            except Exception:
                # 1 < QUANT_ROWS < BLOCK_M repeats rows with a 3-D broadcast + reshape; should a
                # Triton version fail to compile that, quantize the whole (wrapped) tile instead:
                # same results, more quantization work. Compilation fails before any launch.
                if quant_rows in (1, cfg.BLOCK_M):
                    raise
                self.repeat_rows_ok = False
                self._kernel("swap", use_tma, has_bias, fixup, pdl, cfg.BLOCK_M)((grid0, split, 1), args, key, record)
        else:
            self._kernel("tile", use_tma, has_bias, fixup, pdl, 0)((grid0, split, 1), args, key, record)
        if split > 1 and not fixup:
            block = 1024
            self._kernel("reduce", False, has_bias, False, pdl, 0)(
                (-(-m * n // block), 1, 1), (ws, bias if has_bias else ws, out, m * n, n, stride_bias),
                (int_class(m * n), int_class(stride_bias), key[-1]), record)

    def _persistent(self, a: torch.Tensor, a_scale: torch.Tensor | None, bias: torch.Tensor | None, stride_bias: int,
                    out: torch.Tensor, m: int, programs: int, record: list[Recorded] | None) -> None:
        cfg, b_scale = self.cfg, self.b_scale
        assert a_scale is not None  # persistent launches read a quantized activation
        a_desc = TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [cfg.BLOCK_M, SCALE_GROUP_K])
        args = (a_desc, a_scale, self.b_desc, b_scale, bias if bias is not None else b_scale, out, m, self.n, self.k,
                programs, a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1), stride_bias,
                self.n, 1)
        key = (tensor_class(a_scale), tensor_class(bias), int_class(programs))
        self._kernel("persistent", True, bias is not None, False, False, 0)((programs, 1, 1), args, key, record)

    def _kernel(self, kind: str, use_tma: bool, has_bias: bool, fixup: bool, pdl: bool, quant_rows: int) -> BoundKernel:
        variant = (kind, use_tma, has_bias, fixup, pdl, quant_rows)
        kernel = self._kernels.get(variant)
        if kernel is None:
            kernel = self._kernels[variant] = self._bind(*variant)
        return kernel

    def _bind(self, kind: str, use_tma: bool, has_bias: bool, fixup: bool, pdl: bool, quant_rows: int) -> BoundKernel:
        cfg, c = self.cfg, self.constexprs
        if kind == "reduce":
            return BoundKernel(_splitk_reduce_kernel, {"SPLIT_K": self.split, "HAS_BIAS": has_bias, "BLOCK": 1024,
                                                       **({"PDL": True} if pdl else {})},
                               {"num_warps": 4, **({"launch_pdl": True} if pdl else {})})
        if kind == "persistent":
            return BoundKernel(_w8a8_persistent_kernel, {
                "SCALE_BN": c["SCALE_BN"], "B_SCALE_SCALAR": c["B_SCALE_SCALAR"], "HAS_BIAS": has_bias,
                "BLOCK_M": cfg.BLOCK_M, "BLOCK_N": cfg.BLOCK_N, "BLOCK_K": SCALE_GROUP_K, "GROUP_M": cfg.GROUP_M,
                "STAGES": cfg.num_stages}, {"num_warps": cfg.num_warps})
        constexprs = {**c, "USE_TMA": use_tma, "FIXUP": fixup, "HAS_BIAS": has_bias,
                      **({"PDL": True} if pdl else {})}
        options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, **({"launch_pdl": True} if pdl else {})}
        if kind == "swap":
            return BoundKernel(_w8a8_swap_kernel, {**constexprs, "QUANT": self.quant, "QUANT_ROWS": quant_rows}, options)
        return BoundKernel(_w8a8_block_kernel, {**constexprs, "FUSED_QUANT": self.quant, "GROUP_M": cfg.GROUP_M}, options)


class BoundLinear:
    """fp8select's Triton linear of one weight, bound once: ``linear(x, bias) -> out`` [M, N].

    The quantizer and GEMM of one launch configuration (``config``; None: the gemm path's
    heuristic for each call's M, as :func:`linear` runs it), bound to their kernels for
    unquantized activations of width K on ``device``. ``x`` is [M >= 1, K] in an activation
    dtype on the weight's device (the caller checked it).

    The first call at an M (per activation dtype) launches through the bound kernels and records
    its launches; later calls at that M, without bias, on a contiguous 16-byte-aligned ``x``,
    replay them (:class:`~fp8select.kernels.triton_launch.Replay`): one allocation (the output),
    the stream's scratch buffer (:mod:`.stream_scratch`) for the quantized activation, its scales
    and any split-K partials, and the compiled kernels launched with addresses. Any other call
    launches as the first one did.
    """

    __slots__ = ("_b", "_b_scale", "_bound", "_counters", "_device", "_fixed", "_k", "_n", "_out_dtype", "_replays",
                 "_scale_bn")

    def __init__(self, b: torch.Tensor, b_scale: torch.Tensor, block_size: tuple[int, int], config: TritonConfig | None,
                 *, out_dtype: torch.dtype, counters: torch.Tensor | None = None) -> None:
        self._n, self._k = b.shape
        self._scale_bn = _check_weight(b, b_scale, block_size, self._k)
        _check_config(config)
        if out_dtype not in _OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
        self._b, self._b_scale, self._out_dtype, self._counters, self._device = b, b_scale, out_dtype, counters, b.device
        self._bound: dict[TritonConfig, tuple[BoundGemm, TritonQuantizer | None]] = {}
        self._fixed = self._bind(config) if config is not None else None
        self._replays: Replays[Replay] = Replays(b.device)

    def _bind(self, cfg: TritonConfig) -> tuple[BoundGemm, TritonQuantizer | None]:
        bound = self._bound.get(cfg)
        if bound is None:
            quant = None
            if not cfg.quantizes_in_kernel:
                # M-major scales: the tile kernels read one K block's scales of consecutive tokens as one
                # contiguous run instead of BLOCK_M scattered words. The wgmma kernel reads row-major ones
                # (gluon_gemm.launch says why, and copies any other layout).
                layout = ROW_MAJOR if cfg.path == "wgmma" else M_MAJOR
                quant = TritonQuantizer(self._k, dtype=self._b.dtype, layout=layout, device=self._device)
            gemm = BoundGemm(self._b, self._b_scale, self._scale_bn, cfg, quant=quant is None, device=self._device,
                             counters=self._counters)
            bound = self._bound[cfg] = (gemm, quant)
        return bound

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        m = x.shape[0]
        replays = self._replays
        replayable = bias is None and replays.takes(x)
        if replayable:
            replay = replays.get((m, x.dtype))
            if replay is not None:
                out = torch.empty(m, self._n, dtype=self._out_dtype, device=self._device)  # (sizes as arguments: parsed faster)
                run_with_workspace(replay.run, (x.data_ptr(), out.data_ptr()), replay.nbytes, self._device,
                                   replays.stream(replay.device))
                return out
        gemm, quant = self._fixed or self._bind(heuristic_config(self._n, self._k, m, "gemm"))
        out = torch.empty((m, self._n), dtype=self._out_dtype, device=self._device)
        shape = gemm.workspace(m)
        ws = None if shape is None else torch.empty(shape, dtype=torch.float32, device=self._device)
        record = replays.recording() if replayable else None
        if quant is None:
            scratch: tuple[torch.Tensor, ...] = ()
            gemm(x, None, bias, out, ws, record)
        else:
            x_q, x_s = quant(x, record=record)
            scratch = (x_q, x_s)
            gemm(x_q, x_s, bias, out, ws, record)
        if record is not None:
            replays.keep((m, x.dtype), record, per_call=(x, out), scratch=(*scratch, *(() if ws is None else (ws,))),
                         static=gemm.statics())
        return out
