"""The launch configuration of fp8select's Triton MoE kernels: one value type, every field explicit.

Pure Python (no torch, no triton). One :class:`MoeTritonConfig` serves the three launches of one
experts call (:mod:`.moe_triton`): the gate-up GEMM, the down GEMM and the weighted reduction.
``BLOCK_M`` is also the padding of each expert's rows in the sorted layout, so one routing serves
both GEMMs. ``FUSED_ACT`` picks the gate-up structure:

* 0 (plain; the rule's below 8, at 16-63 and from 256 tokens per expert, :func:`default_config`): the gate-up
  runs the down projection's grouped GEMM kernel over all ``2I`` columns (``BLOCK_N`` per program, one
  accumulator), writing fp32 ``[rows, 2I]``; a second kernel quantizes ``silu(gate) * up`` per 1x128
  group. One launch and an fp32 round trip more than fused, and at ``BLOCK_N`` 128 twice the programs,
  each holding one accumulator: on the normal ``tl.dot`` tiles faster at every point measured on the H200;
* 1 (fused; what a measured row or record without the key means: the only structure before plain;
  the rule's at 8-15 tokens per expert on the transposed tile and at 64-255 on the ``wgmma`` kernels):
  each gate-up program computes 128 columns of gate and the same 128 of up, one 1x128 scale group, so
  that its epilogue quantizes ``silu(gate) * up`` and writes the fp8 intermediate.

Both compute ``silu(gate) * up`` in fp32 from the same fp32 sums and quantize it per 1x128 group.

:func:`default_config` is the rule for shapes and sizes nothing measured (on Hopper, 132 SMs): at
decode every expert holds a handful of tokens and each GEMM streams its experts' weights once, so the
tiles are narrow in M (16 and 32 rows, on the MMA's narrow side) and the grid wide in N; from 16 tokens
per expert the tiles grow to 64 rows, where the weights are re-read ``tokens / BLOCK_M`` times and the
MMAs, not HBM, set the pace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["MoeTritonConfig", "default_config", "tuning_configs", "without_wgmma"]

_KEYS = ("BLOCK_M", "BLOCK_N", "GROUP_M", "num_warps", "num_stages", "QUANT_IN_KERNEL")
_OPTIONAL = {"FUSED_ACT": 1, "WGMMA": 0, "SWAP_AB": 0, "PERSISTENT": 0}
"""Keys a mapping may leave out (measured rows and records written before the key existed), with the
value they then mean; :meth:`MoeTritonConfig.to_dict` leaves them out at that value, so those rows
round-trip unchanged."""
_FLAGS = ("QUANT_IN_KERNEL", "FUSED_ACT", "WGMMA", "SWAP_AB", "PERSISTENT")


@dataclass(frozen=True)
class MoeTritonConfig:
    """One experts call's launches. Validated on construction (``ValueError`` naming the field).

    Attributes:
        BLOCK_M: sorted rows per program and the per-expert padding, a power of two >= 16.
        BLOCK_N: output columns per program of the down GEMM (and of the plain gate-up), a power of
            two >= 16.
        GROUP_M: row blocks that share each weight column tile in launch order (prefill: an expert's
            blocks are neighbours, so its weight tile stays in L2 across them).
        num_warps: warps per GEMM program, a power of two.
        num_stages: software-pipeline depth of the GEMMs' K loops.
        QUANT_IN_KERNEL: 1 quantizes each token's 1x128 groups inside the gate-up GEMM's K loop (no
            fp8 copy of the activation in memory, one launch fewer; on the H200 slower at every M
            measured, :func:`default_config`), 0 runs the quantization kernel first (each token
            quantized once however many column tiles read it). The plain gate-up takes 0 only.
        FUSED_ACT: 1, the fused gate-up (the default); 0, the plain one (the module docstring).
        WGMMA: 1 runs both GEMMs on the Hopper ``wgmma`` kernels (:mod:`.gluon_moe`, the tiles' rows one
            warpgroup's 64 per 4 warps, ``BLOCK_N`` 64 or 128, or 256 on 64 rows: twice the warps, a
            warpgroup to each 128 columns), the activation gathered into the sorted rows first; with
            ``FUSED_ACT`` 1 (64-row tiles) the gate-up is the fused one, its two halves of 8 warps computing
            the gate's and the up's 128 columns (where ``I`` is a multiple of 128; else the plain one).
            Where those kernels do not run (not Hopper, operands TMA cannot read), the plain structure with
            the same tiles on the ``tl.dot`` kernels (faster there than their fused gate-up).
        SWAP_AB: 1 runs the ``tl.dot`` GEMMs (of either structure) on the transposed tile (the weight's
            rows on the MMA's wide side, the row block's tokens on its narrow one), as the dense decode
            kernel does: the rule's below 16 tokens per expert (:func:`default_config`), 16 rows below 8, 32 from 8.
        PERSISTENT: 1 (with ``WGMMA`` 1) runs both ``wgmma`` GEMMs in one program per SM taking tile after tile,
            the next tile's first K blocks loading while a tile's result is stored
            (:func:`.gluon_moe.launch_grouped`); with ``FUSED_ACT`` 1 at most 3 stages (the fused gate-up's
            ring, its gate-and-up exchange and its output tile live at once). Where the ``wgmma`` kernels do
            not run, :func:`without_wgmma`.
    """

    BLOCK_M: int
    BLOCK_N: int
    GROUP_M: int
    num_warps: int
    num_stages: int
    QUANT_IN_KERNEL: int
    FUSED_ACT: int = 1
    WGMMA: int = 0
    SWAP_AB: int = 0
    PERSISTENT: int = 0

    def __post_init__(self) -> None:
        for key in (*_KEYS, *_OPTIONAL):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key in _FLAGS else 1):
                raise ValueError(f"MoeTritonConfig {key!r} must be a positive int, got {value!r}")
        for key in ("BLOCK_M", "BLOCK_N", "num_warps"):
            value = getattr(self, key)
            if value & (value - 1):
                raise ValueError(f"MoeTritonConfig {key!r} must be a power of two, got {value}")
        for key in ("BLOCK_M", "BLOCK_N"):
            if getattr(self, key) < 16:
                raise ValueError(f"MoeTritonConfig {key!r} must be >= 16 (the tl.dot minimum), got {getattr(self, key)}")
        for key in _FLAGS:
            if getattr(self, key) not in (0, 1):
                raise ValueError(f"MoeTritonConfig {key!r} must be 0 or 1, got {getattr(self, key)!r}")
        if not self.FUSED_ACT and self.QUANT_IN_KERNEL:
            raise ValueError("MoeTritonConfig 'QUANT_IN_KERNEL' must be 0 with FUSED_ACT 0 (the plain gate-up "
                             "reads the quantized activation)")
        if self.WGMMA and (self.BLOCK_M != 16 * self.num_warps or self.BLOCK_N not in (64, 128, 256)
                           or (self.BLOCK_N == 256 and self.BLOCK_M != 64)
                           or (self.FUSED_ACT and (self.BLOCK_M != 64 or self.QUANT_IN_KERNEL))):
            raise ValueError("MoeTritonConfig 'WGMMA' 1 needs BLOCK_M 16 * num_warps (a warpgroup's 64 rows per 4 "
                             "warps), BLOCK_N 64 or 128 (256 with BLOCK_M 64), and with FUSED_ACT 1 BLOCK_M 64 and "
                             f"QUANT_IN_KERNEL 0, got {self.describe()}")
        if self.SWAP_AB and self.WGMMA:
            raise ValueError(f"MoeTritonConfig 'SWAP_AB' 1 needs WGMMA 0, got {self.describe()}")
        if self.PERSISTENT and (not self.WGMMA or (self.FUSED_ACT and self.num_stages > 3)):
            raise ValueError("MoeTritonConfig 'PERSISTENT' 1 needs WGMMA 1, and with FUSED_ACT 1 num_stages <= 3 "
                             f"(shared memory), got {self.describe()}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MoeTritonConfig:
        """Validate a mapping (a measured row's ``config``): every key of ``_KEYS`` required, ``FUSED_ACT``
        optional (1 when absent), none unknown."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a MoeTritonConfig must come from a mapping, got {type(data).__name__}")
        missing = [key for key in _KEYS if key not in data]
        unknown = sorted(str(key) for key in data if key not in _KEYS and key not in _OPTIONAL)
        if missing or unknown:
            raise ValueError(f"MoeTritonConfig keys must be {_KEYS} (optional: {tuple(_OPTIONAL)}): "
                             f"missing {missing}, unknown {unknown}")
        return cls(**{key: data[key] for key in (*_KEYS, *(k for k in _OPTIONAL if k in data))})

    def to_dict(self) -> dict[str, Any]:
        """Every field, except an optional one at its default (so the rows written before it existed
        read back equal)."""
        return {key: value for key, value in asdict(self).items() if _OPTIONAL.get(key) != value}

    def describe(self) -> str:
        """Short human form, e.g. ``moe 16x128 w4 s4 qk`` (``qk``: quantized in the kernel; ``plain``:
        the plain gate-up)."""
        quant = " qk" if self.QUANT_IN_KERNEL else ""
        group = f" g{self.GROUP_M}" if self.GROUP_M != 1 else ""
        plain = "" if self.FUSED_ACT else " plain"
        kernel = " wgmma" if self.WGMMA else " swap" if self.SWAP_AB else ""
        persistent = " persistent" if self.PERSISTENT else ""
        return (f"moe {self.BLOCK_M}x{self.BLOCK_N} w{self.num_warps} s{self.num_stages}{group}{quant}{plain}{kernel}"
                f"{persistent}")


def _tokens_per_expert(m: int, top_k: int, experts: int) -> int:
    return -(-m * top_k // max(experts, 1))


def default_config(m: int, top_k: int, experts: int) -> MoeTritonConfig:
    """The rule for ``m`` tokens routed to ``top_k`` of ``experts`` experts (see the module docstring).

    ``tokens per expert = m * top_k / experts`` (uniform routing) picks the tile; the activation is
    quantized by its own kernel first, ``BLOCK_N`` 128 (256 at 256-1023), ``GROUP_M`` 8 (an expert's row
    blocks take each weight tile together, once from HBM into L2: under skew a busy expert has several even
    at decode):

    * below 8: the plain gate-up on the ``tl.dot`` kernels' 16-row tile transposed (``SWAP_AB`` 1: the
      weight tile on the MMA's 128-row side, which compiles to ``wgmma``), 4 stages;
    * 8 to 15: the fused gate-up on the transposed 32-row tile, 3 stages (a busy expert's tokens in one
      row block where the 16-row tile re-reads its weights once per 16);
    * 16 to 63: the plain gate-up on the ``tl.dot`` kernels' 64 x 128 tile, 3 stages;
    * 64 to 255: the fused gate-up on the ``wgmma`` kernels' 64 x 128 tile (silu*up quantized in its
      epilogue: no fp32 ``[rows, 2I]`` written and read again; off Hopper the plain structure on the
      ``tl.dot`` kernels);
    * 256 to 1023: the plain gate-up on the ``wgmma`` kernels' 64 x 256 tile (two warpgroups side by side) in
      persistent programs (``PERSISTENT`` 1: the next tile's first K blocks load while a tile's result is
      stored; off Hopper, :func:`without_wgmma`);
    * from 1024: the same on the 128 x 128 tile of 8 warps (two warpgroups one above the other).

    Chosen from every candidate of :func:`tuning_configs` timed together (interleaved CUDA-graph
    replays, uniform and skewed routing) on an H100 SXM at 16 points of the five shipped shapes, 8-64
    tokens per expert (``benchmarks/results/moe_rule_h100.json``). A plan runs the rule of its M bucket's
    top M; scored so on the timings it was chosen on: 1.030x the fastest candidate's time uniform and
    1.017x skewed (geomean), worst 1.10x (DeepSeek-V3 with 8 experts at M 48, which runs the fused
    ``wgmma`` tile of 64 tokens), where the rule before (the 16-row tile below 16 tokens, the fused
    ``wgmma`` tile from 16) took 1.069x and 1.067x, worst 1.193x (256 experts at 8 tokens, skewed: the
    16-row tile reads a busy expert's weights once per 16 of its tokens). Checked afterwards at 12 points
    inside the buckets (M 24-1536): 1.029x and 1.024x, worst 1.073x, where the rule before took 1.066x and
    1.068x, worst 1.214x. The H200 table's measured rows at 16-32 tokens hold the same ``tl.dot`` tile at
    six of eight points. From 64 tokens: ``benchmarks/results/moe_gate_up.json`` (H100 SXM, 18 points of four
    shapes at 64-8192 tokens per expert, every structure timed together): the rule 1.002x the fastest Triton
    structure's time in geomean, 1.023x at worst (the rule before, the fused 64-row tile throughout: 1.042x and
    1.099x), and at least 0.8 of DeepGEMM contiguous's speed at 15 of the 16 points from M 1024 (before: 11).
    The thresholds were chosen on those points and agree with a second run's nine (one-off, the same day).
    Checked afterwards on an H200 (``moe_gate_up_h200.json``, the same points): 1.011x and 1.066x (before
    1.056x and 1.136x), 15 of 16 (before 12); its worst points, at 128 tokens per expert, ran fastest on the
    persistent 64 x 256 tiles, which ``tune --moe`` tries second there.
    Why each kernel: docs/moe.md.
    """
    per_expert = _tokens_per_expert(m, top_k, experts)
    if per_expert < 8:
        return _DECODE
    if per_expert < 16:
        return _DECODE_BUSY
    if per_expert < 64:
        return _NEAR_DECODE
    if per_expert < 256:
        return _PREFILL
    return _PREFILL_WIDE if per_expert < 1024 else _PREFILL_LARGE


_DECODE = MoeTritonConfig(BLOCK_M=16, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                          FUSED_ACT=0, SWAP_AB=1)
_DECODE_BUSY = MoeTritonConfig(BLOCK_M=32, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=3, QUANT_IN_KERNEL=0,
                               FUSED_ACT=1, SWAP_AB=1)
_NEAR_DECODE = MoeTritonConfig(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=3, QUANT_IN_KERNEL=0,
                               FUSED_ACT=0)
_PREFILL = MoeTritonConfig(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                           FUSED_ACT=1, WGMMA=1)
_PREFILL_WIDE = MoeTritonConfig(BLOCK_M=64, BLOCK_N=256, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                                FUSED_ACT=0, WGMMA=1, PERSISTENT=1)
_PREFILL_LARGE = MoeTritonConfig(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=4, QUANT_IN_KERNEL=0,
                                 FUSED_ACT=0, WGMMA=1, PERSISTENT=1)


def without_wgmma(config: MoeTritonConfig) -> MoeTritonConfig:
    """What runs ``config`` where the ``wgmma`` kernels do not (off Hopper, and on shapes TMA cannot read): the
    same tiles on the ``tl.dot`` kernels (``WGMMA`` above), except for ``PERSISTENT`` 1, whose tiles were
    chosen for the ``wgmma`` kernels only and whose rings (128-160 KB on the ``tl.dot`` kernels) exceed the
    shared memory of GPUs with about 100 KB a block: the rule's configuration at 64-255 tokens per expert
    runs instead."""
    return _PREFILL if config.PERSISTENT else config


def tuning_configs(m: int, top_k: int, experts: int) -> list[MoeTritonConfig]:
    """What ``tune --moe`` times at ``m`` tokens, most likely first, each distinct, at most 10 (load-time
    measurement takes the first two): the rule's configuration (:func:`default_config`), then the
    candidates that came within a few percent of the fastest somewhere near its range of tokens per
    expert, then the other structures (timings: docs/moe-measurements.md).

    * below 8: the fused gate-up on the rule's transposed 16-row tile (4 and 3 stages), the rule's tile
      with one stage fewer, with half the columns (plain and fused), the transposed 32-row tile (the
      rule's from 8: skewed routing gives a busy expert more tokens), the ``tl.dot`` 64 x 128 tile;
    * 8 to 15: the transposed 32-row tile plain, the ``tl.dot`` 64 x 128 tile (the rule's from 16), the
      rule's tile below 8 and four of its neighbours there;
    * 16 to 63: the ``tl.dot`` 64 x 64 tile, the fused transposed 32-row tile, the fused ``wgmma`` tile (the
      rule's from 64), the plain transposed 32-row tile, below 32 the transposed 16-row one, the plain
      structure on the ``wgmma`` tile, the fused one on 256 columns;
    * from 64: the rule's three configurations from 64 tokens (the range's first, then the one nearest it in
      the timings), the fused gate-up with its down GEMM on 256 columns (persistent with 3 stages, and not),
      the 128-row tile one program per tile, the ``tl.dot`` 64-row tiles (what runs where the ``wgmma``
      kernels do not).

    Then, everywhere, the fused gate-up on the normal ``tl.dot`` tile, and quantizing its activation in the
    K loop (both slower on the H200 and the H100 at every point measured, kept for other devices)."""
    per_expert = _tokens_per_expert(m, top_k, experts)
    plain_wgmma = replace(_PREFILL, FUSED_ACT=0)
    plain32 = replace(_DECODE_BUSY, FUSED_ACT=0, num_stages=4)
    fused16 = replace(_DECODE, FUSED_ACT=1)
    half16 = replace(_DECODE, BLOCK_N=64, num_stages=3)
    swap16 = [replace(fused16, num_stages=3), replace(_DECODE, num_stages=3), half16, replace(half16, FUSED_ACT=1)]
    if per_expert < 8:
        candidates = [_DECODE, fused16, *swap16, _DECODE_BUSY, replace(_NEAR_DECODE, num_stages=4)]
    elif per_expert < 16:
        candidates = [_DECODE_BUSY, plain32, _NEAR_DECODE, _DECODE, *swap16]
    elif per_expert < 64:
        candidates = [_NEAR_DECODE, replace(_NEAR_DECODE, BLOCK_N=64), _DECODE_BUSY, _PREFILL, plain32,
                      *([_DECODE] if per_expert < 32 else []), plain_wgmma, replace(_PREFILL, BLOCK_N=256)]
    else:
        ranked = ([_PREFILL, _PREFILL_WIDE, _PREFILL_LARGE] if per_expert < 256 else
                  [_PREFILL_WIDE, _PREFILL_LARGE, _PREFILL] if per_expert < 1024 else
                  [_PREFILL_LARGE, _PREFILL_WIDE, _PREFILL])
        candidates = [*ranked, replace(_PREFILL, BLOCK_N=256, num_stages=3, PERSISTENT=1), replace(_PREFILL, BLOCK_N=256),
                      replace(_PREFILL_LARGE, PERSISTENT=0), _NEAR_DECODE, replace(_NEAR_DECODE, BLOCK_N=64)]
    first = candidates[0]
    fused_tl_dot = replace(first, FUSED_ACT=1, WGMMA=0, SWAP_AB=0, PERSISTENT=0, BLOCK_M=min(first.BLOCK_M, 64),
                           BLOCK_N=min(first.BLOCK_N, 128), num_warps=4)
    candidates += [fused_tl_dot, replace(fused_tl_dot, QUANT_IN_KERNEL=1)]
    return list(dict.fromkeys(candidates))
