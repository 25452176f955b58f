"""The launch configuration of fp8select's Triton block-FP8 linear: one value type, every field explicit.

Pure Python (no torch, no triton), so tuning tables, tools and tests can read, validate and
write configurations without a GPU stack. A :class:`TritonConfig` names the kernel path and
every launch parameter; nothing is filled in later from another table. The paths:

``gemm``
    Triton activation quantization kernel, then the ``[BLOCK_M, BLOCK_N]`` tile GEMM kernel
    (two launches; three with a two-pass split-K).
``fused``
    The same tile GEMM kernel, quantizing each ``[BLOCK_M, 128]`` activation tile in its K loop.
``decode``
    Swap-AB GEMM for small M: each program computes a ``[BLOCK_N, BLOCK_M]`` tile of the
    transposed output as ``W_tile @ Xq_tile^T`` (weight rows on the MMA's wide side, the few
    tokens on its narrow side) and quantizes the activation inside its K loop. One launch.
``swap``
    Triton quantization kernel, then the swap-AB GEMM on the fp8 activation.
``wgmma``
    Triton quantization kernel, then the Hopper GEMM of :mod:`.gluon_gemm` (written in Gluon,
    Triton's explicit-layout language), whose per-block scaling runs under the next K block's
    MMA. TMA-fed, no split-K; tiles that fit three fp32 accumulators in registers. Where it
    cannot run (not a CUDA GPU of compute capability 9.x, a Triton outside 3.6-3.9, the interpreter,
    tensors no TMA descriptor can describe) the ``gemm`` path runs with the same tiles.

A caller that already quantized its activation (``w8a8_block_gemm``) cannot run an in-kernel
quantizing path: :meth:`TritonConfig.prequantized` maps ``fused -> gemm`` and ``decode -> swap``
(same kernel, same tiles), the one rule for that case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = [
    "FIXUP_MAX_SPLIT",
    "LAUNCH_KEYS",
    "MAX_PERSISTENT",
    "OPTIONAL_KEYS",
    "PATHS",
    "PREQUANT_PATHS",
    "QUANT_FUSED_PATHS",
    "SCALE_GROUP_K",
    "SWAP_PATHS",
    "TritonConfig",
    "WGMMA_ACC_REGISTERS",
    "default_fixup",
]

SCALE_GROUP_K = 128
"""K elements per activation and weight scale; also every kernel's BLOCK_K."""

PATHS = ("gemm", "fused", "decode", "swap", "wgmma")
"""Ways to run a linear on an unquantized activation (see the module docstring)."""

SWAP_PATHS = ("decode", "swap")
"""Paths that run the swap-AB kernel."""

QUANT_FUSED_PATHS = ("fused", "decode")
"""Paths that quantize the activation inside the GEMM (one kernel, no fp8 activation in memory)."""

PREQUANT_PATHS = ("gemm", "swap", "wgmma")
"""Paths that run on an already-quantized activation (after the quantization kernel)."""

LAUNCH_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")
"""Keys every configuration must give (positive ints)."""

OPTIONAL_KEYS = ("path", "FIXUP", "TMA", "PERSISTENT")
"""Keys :meth:`TritonConfig.from_dict` fills when absent, always with the same defaults: ``path``
``"gemm"``; ``FIXUP`` :func:`default_fixup`'s; ``TMA`` 0; ``PERSISTENT`` 0."""

FIXUP_MAX_SPLIT = 4
"""Most splits a swap-AB configuration sums in its last-arriving program by default (:func:`default_fixup`)."""


def default_fixup(path: str, split: int) -> int:
    """The split-K summation of a configuration that names none: in the last-arriving program (1) on
    the swap-AB paths (``decode``, ``swap``) up to :data:`FIXUP_MAX_SPLIT` splits, else in a second
    kernel (0). From split-K 8 the second kernel (PDL-launched at decode) is the faster one: 14 of the 16
    such swap-AB rows of the shipped H200 table, and 3-10% on the decode path at M 8-16 on the 7168 x
    16384 and 7168 x 18432 weights (H200 run 42)."""
    return 1 if path in SWAP_PATHS and split <= FIXUP_MAX_SPLIT else 0


MAX_PERSISTENT = 4
"""Most programs per SM a persistent launch asks for."""

_PREQUANT_OF = {"gemm": "gemm", "fused": "gemm", "decode": "swap", "swap": "swap", "wgmma": "wgmma"}

WGMMA_ACC_REGISTERS = 64
"""fp32 registers per thread of one ``wgmma`` path accumulator at most: the kernel keeps three
(the sum and two K blocks' MMA results) within the 255 a thread can have."""


def _check_int(key: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"TritonConfig {key!r} must be a positive int, got {value!r}")
    return value


def _check_flag(key: str, value: object) -> int:
    if isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"TritonConfig {key!r} must be 0 or 1, got {value!r}")
    return 1 if value else 0


@dataclass(frozen=True)
class TritonConfig:
    """One launch of the Triton block-FP8 linear. Validated on construction (``ValueError``
    naming the field); field names are the kernels' own (and the keys of :meth:`to_dict`).

    Attributes:
        BLOCK_M: output rows per program (tokens; the narrow MMA side on the swap-AB paths),
            a power of two >= 16.
        BLOCK_N: output columns per program (weight rows), a power of two >= 16.
        BLOCK_K: K per step; always 128, the scale group.
        GROUP_M: row tiles that share each weight column tile in the tile kernel's launch order.
        SPLIT_K: K splits (programs per output tile); the launch uses at most the K-block count.
        num_warps: warps per program, a power of two.
        num_stages: software-pipeline depth.
        path: ``gemm``, ``fused``, ``decode``, ``swap`` or ``wgmma`` (see the module docstring).
        FIXUP: with ``SPLIT_K > 1``, 1 sums the partials in the last-arriving program (one
            launch), 0 in a second kernel; bitwise equal results either way.
        TMA: 1 loads the weight (and, in the tile kernel, the fp8 activation) tiles through
            Hopper TMA descriptors where one can be built (pointer loads otherwise); 0 never.
        PERSISTENT: 0 launches one program per output tile; n (1..4, ``gemm`` path with TMA and
            no split-K only) launches n programs per SM that loop over the tiles, their tile and
            K loops flattened into one pipeline (the tile kernel with the same tiles runs where
            TMA descriptors cannot be built, or off CUDA).
    """

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    SPLIT_K: int
    num_warps: int
    num_stages: int
    path: str
    FIXUP: int
    TMA: int
    PERSISTENT: int = 0

    def __post_init__(self) -> None:
        for key in LAUNCH_KEYS:
            _check_int(key, getattr(self, key))
        if self.BLOCK_K != SCALE_GROUP_K:
            raise ValueError(f"TritonConfig 'BLOCK_K' must be {SCALE_GROUP_K} (the scale group), got {self.BLOCK_K}")
        for key in ("BLOCK_M", "BLOCK_N", "num_warps"):
            value = getattr(self, key)
            if value & (value - 1):
                raise ValueError(f"TritonConfig {key!r} must be a power of two, got {value}")
        for key in ("BLOCK_M", "BLOCK_N"):
            if getattr(self, key) < 16:
                raise ValueError(f"TritonConfig {key!r} must be >= 16 (the tl.dot minimum), got {getattr(self, key)}")
        if self.path not in PATHS:
            raise ValueError(f"TritonConfig 'path' must be one of {PATHS}, got {self.path!r}")
        for key in ("FIXUP", "TMA"):
            _check_flag(key, getattr(self, key))
        if isinstance(self.PERSISTENT, bool) or self.PERSISTENT not in range(MAX_PERSISTENT + 1):
            raise ValueError(f"TritonConfig 'PERSISTENT' must be an int 0..{MAX_PERSISTENT}, got {self.PERSISTENT!r}")
        if self.PERSISTENT and not self.can_run_persistent:
            raise ValueError("TritonConfig 'PERSISTENT' needs path 'gemm', SPLIT_K 1 and TMA 1, got "
                             f"path {self.path!r}, SPLIT_K {self.SPLIT_K}, TMA {self.TMA}")
        if self.path == "wgmma":
            self._check_wgmma()

    def _check_wgmma(self) -> None:
        """The ``wgmma`` path's limits: one warpgroup per 64 rows (4 or 8 warps, BLOCK_M at least
        16 rows per warp), BLOCK_N at most 256 (one MMA), three accumulators in registers,
        TMA loads, no split-K."""
        problems = []
        if self.num_warps not in (4, 8) or self.BLOCK_M < 16 * self.num_warps:
            problems.append(f"4 or 8 warps and BLOCK_M >= 16 per warp, got {self.num_warps} warps, "
                            f"BLOCK_M {self.BLOCK_M}")
        if self.BLOCK_N > 256:
            problems.append(f"BLOCK_N <= 256, got {self.BLOCK_N}")
        if self.BLOCK_M * self.BLOCK_N > WGMMA_ACC_REGISTERS * 32 * self.num_warps:
            problems.append(f"BLOCK_M * BLOCK_N <= {WGMMA_ACC_REGISTERS * 32} per warp, got "
                            f"{self.BLOCK_M}x{self.BLOCK_N} on {self.num_warps} warps")
        if self.SPLIT_K != 1 or not self.TMA or self.PERSISTENT:
            problems.append(f"SPLIT_K 1, TMA 1, PERSISTENT 0, got {self.SPLIT_K}, {self.TMA}, {self.PERSISTENT}")
        if problems:
            raise ValueError("TritonConfig path 'wgmma' needs " + "; ".join(problems))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TritonConfig:
        """Validate a mapping (a tuning-table row, a JSON object) into a configuration.

        Every key of :data:`LAUNCH_KEYS` is required; :data:`OPTIONAL_KEYS` get their fixed
        defaults when absent. Unknown keys, missing keys and bad values raise ``ValueError``
        naming the key.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a TritonConfig must come from a mapping, got {type(data).__name__}")
        missing = [key for key in LAUNCH_KEYS if key not in data]
        unknown = sorted(str(key) for key in data if key not in LAUNCH_KEYS and key not in OPTIONAL_KEYS)
        if missing or unknown:
            raise ValueError(f"TritonConfig keys must be {LAUNCH_KEYS} (optionally {OPTIONAL_KEYS}): "
                             f"missing {missing}, unknown {unknown}")
        path = data.get("path", "gemm")
        if path not in PATHS:
            raise ValueError(f"TritonConfig 'path' must be one of {PATHS}, got {path!r}")
        fixup = data.get("FIXUP", default_fixup(path, _check_int("SPLIT_K", data["SPLIT_K"])))
        return cls(**{key: data[key] for key in LAUNCH_KEYS}, path=path, FIXUP=_check_flag("FIXUP", fixup),
                   TMA=_check_flag("TMA", data.get("TMA", 0)), PERSISTENT=data.get("PERSISTENT", 0))

    def to_dict(self) -> dict[str, Any]:
        """Every field, launch keys first (what tables store; :meth:`from_dict` reads it back);
        ``PERSISTENT`` only when set, so that a table without persistent launches stays readable
        by fp8select releases that predate the key."""
        data = asdict(self)
        if not data["PERSISTENT"]:
            del data["PERSISTENT"]
        return data

    @property
    def swap(self) -> bool:
        """Whether this path runs the swap-AB kernel."""
        return self.path in SWAP_PATHS

    @property
    def can_run_persistent(self) -> bool:
        """Whether a launch of these tiles may be persistent (``PERSISTENT`` > 0): the ``gemm``
        path with TMA and no split-K."""
        return self.path == "gemm" and self.SPLIT_K == 1 and bool(self.TMA)

    @property
    def quantizes_in_kernel(self) -> bool:
        """Whether this path quantizes the activation inside the GEMM."""
        return self.path in QUANT_FUSED_PATHS

    def prequantized(self) -> TritonConfig:
        """The configuration for an activation quantized already: ``fused -> gemm``,
        ``decode -> swap`` (the same kernel and tiles, reading fp8 and its scales); other
        paths unchanged."""
        target = _PREQUANT_OF[self.path]
        return self if target == self.path else replace(self, path=target)

    def split_for(self, k: int) -> int:
        """SPLIT_K as launched for reduction length ``k``: at most its K blocks, re-balanced so
        that no split is empty."""
        k_blocks = -(-k // SCALE_GROUP_K)
        split = min(self.SPLIT_K, k_blocks)
        if split > 1:
            split = -(-k_blocks // -(-k_blocks // split))
        return split

    def describe(self) -> str:
        """Short human form, e.g. ``decode 16x128 sk4f w4 s4 tma`` (``p2``: two persistent programs per SM)."""
        fixup = "f" if self.FIXUP and self.SPLIT_K > 1 else ""
        group = f" g{self.GROUP_M}" if self.GROUP_M != 8 else ""
        tma = " tma" if self.TMA else ""
        persistent = f" p{self.PERSISTENT}" if self.PERSISTENT else ""
        return (f"{self.path} {self.BLOCK_M}x{self.BLOCK_N} sk{self.SPLIT_K}{fixup} "
                f"w{self.num_warps} s{self.num_stages}{group}{tma}{persistent}")
