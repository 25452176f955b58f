"""The launch configuration of fp8select's Triton MoE kernels: one value type, every field explicit.

Pure Python (no torch, no triton). One :class:`MoeTritonConfig` serves the three launches of one
experts call (:mod:`.moe_triton`): the gate-up GEMM, the down GEMM and the weighted reduction.
``BLOCK_M`` is also the padding of each expert's rows in the sorted layout, so one routing serves
both GEMMs. ``FUSED_ACT`` picks the gate-up structure:

* 0 (plain; the rule's below 16 tokens per expert, :func:`default_config`): the gate-up runs the down
  projection's grouped GEMM kernel over all ``2I`` columns (``BLOCK_N`` per program, one accumulator),
  writing fp32 ``[rows, 2I]``; a second kernel quantizes ``silu(gate) * up`` per 1x128 group. One launch
  and an fp32 round trip more than fused, and at ``BLOCK_N`` 128 twice the programs, each holding one
  accumulator: on the ``tl.dot`` kernels faster at every point measured on the H200;
* 1 (fused; what a measured row or record without the key means: the only structure before plain;
  the rule's from 16 tokens per expert, on the ``wgmma`` kernels): each gate-up program computes 128
  columns of gate and the same 128 of up, one 1x128 scale group, so that its epilogue quantizes
  ``silu(gate) * up`` and writes the fp8 intermediate.

Both compute ``silu(gate) * up`` in fp32 from the same fp32 sums and quantize it per 1x128 group.

:func:`default_config` is the rule for shapes and sizes nothing measured, written for the H200
(132 SMs, 4.8 TB/s HBM): at decode every expert holds a handful of tokens and each GEMM streams
its experts' weights once, so the tiles are narrow in M (16 rows, the ``tl.dot`` minimum) and the
grid wide in N; from 16 tokens per expert the tiles grow to 64 rows, where the weights are re-read
``tokens / BLOCK_M`` times and the MMAs, not HBM, set the pace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["MoeTritonConfig", "default_config", "tuning_configs"]

_KEYS = ("BLOCK_M", "BLOCK_N", "GROUP_M", "num_warps", "num_stages", "QUANT_IN_KERNEL")
_OPTIONAL = {"FUSED_ACT": 1, "WGMMA": 0, "SWAP_AB": 0}
"""Keys a mapping may leave out (measured rows and records written before the key existed), with the
value they then mean; :meth:`MoeTritonConfig.to_dict` leaves them out at that value, so those rows
round-trip unchanged."""
_FLAGS = ("QUANT_IN_KERNEL", "FUSED_ACT", "WGMMA", "SWAP_AB")


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
        WGMMA: 1 runs both GEMMs on the Hopper ``wgmma`` kernels (:mod:`.gluon_gemm`, the tiles' rows one
            warpgroup's 64 per 4 warps, ``BLOCK_N`` 64 or 128, or 256 on 64 rows: twice the warps, a
            warpgroup to each 128 columns), the activation gathered into the sorted rows first; with
            ``FUSED_ACT`` 1 (64-row tiles) the gate-up is the fused one, its two halves of 8 warps computing
            the gate's and the up's 128 columns (where ``I`` is a multiple of 128; else the plain one).
            Where those kernels do not run (not Hopper, operands TMA cannot read), the plain structure with
            the same tiles on the ``tl.dot`` kernels (faster there than their fused gate-up).
        SWAP_AB: 1 runs the ``tl.dot`` GEMMs (of either structure) on the transposed tile (the weight's
            rows on the MMA's wide side, the row block's tokens on its narrow one), as the dense decode
            kernel does: the rule's below 16 tokens per expert (:func:`default_config`).
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
        return f"moe {self.BLOCK_M}x{self.BLOCK_N} w{self.num_warps} s{self.num_stages}{group}{quant}{plain}{kernel}"


def _tokens_per_expert(m: int, top_k: int, experts: int) -> int:
    return -(-m * top_k // max(experts, 1))


def default_config(m: int, top_k: int, experts: int) -> MoeTritonConfig:
    """The rule for ``m`` tokens routed to ``top_k`` of ``experts`` experts (see the module docstring).

    The activation quantized by its own kernel first, ``BLOCK_N`` 128. ``tokens per expert = m * top_k /
    experts`` (uniform routing) picks the kernels and their row tile: below 16 tokens the plain gate-up
    (``FUSED_ACT`` 0) on the ``tl.dot`` kernels' 16-row tile transposed (``SWAP_AB`` 1: the weight tile in
    the MMA's 128-row operand); from 16 the ``wgmma`` kernels (``WGMMA`` 1) on 64 x 128 tiles with the
    fused gate-up (``FUSED_ACT`` 1: silu*up quantized in its epilogue, no fp32 ``[rows, 2I]`` written and
    read again, one launch fewer; off Hopper the plain structure on the ``tl.dot`` kernels).
    Timed on an H100 SXM (``benchmarks/results/moe_gate_up.json``, ``python -m benchmarks.moe_gate_up``:
    the whole op, DeepSeek-V3 with 8 and 32 experts, Qwen3-235B-A22B and Qwen3-30B-A3B, M 512-8192, every
    structure in one process, replays interleaved): the fused gate-up took 0.81-0.96x the plain one's time
    on the same tile (geomean 0.89), and 0.77-1.02x the plain 128 x 128 tile's that the rule ran from 256
    tokens per expert (geomean 0.92; 1.00-1.02x only with 8 experts at 1024 tokens and more), with the
    same output bits at every point. Before that, measured on the H200 (``tune --moe``, DeepSeek-V3 with
    32 local experts and Qwen3-30B-A3B, each candidate timed alone under uniform and skewed routing):
    below 16 tokens per expert the transposed 16-row tile was the fastest of the four candidates at all
    13 points uniform, 0.88-1.0x the normal tile's time (112 against 119 us at M 1 of 32 experts), and
    within 4% of the fastest skewed; among ten candidates (another run, uniform) within 6% of the
    fastest; at 16 tokens (M 64 of 32 experts) the 64-row ``wgmma`` tile took 416 us uniform against 448 for the normal
    16-row tile and 417 transposed, and 271 skewed against 366 and 311 (one row block per busy
    expert); between 16 and 32 (M 64-128 of 32 experts) the uniform rows took it too, 2-6% ahead of the
    best ``tl.dot`` tile. At M 512-8192 the ``wgmma`` kernel took 0.61-0.71x the time of the ``tl.dot``
    kernels' 64 x 128 tiles (32 experts, M 4096: 4.17 ms against 6.63), whose every K block waits for
    its MMA before the scaling. On the ``tl.dot`` kernels the plain gate-up was 1.06-1.53x faster than the
    fused one at all 12 points measured, and quantizing the activation inside the gate-up K loop had
    doubled the fused op's time at decode.

    ``GROUP_M`` 8 at every ``m``: under skewed routing an expert holds several row blocks even at
    decode, and grouped launch order has its blocks take each weight tile together, read once from
    HBM into L2, where one block after another (``GROUP_M`` 1) read it once per block. Under uniform
    routing at decode each expert has one block, and the order changes nothing.
    """
    per_expert = _tokens_per_expert(m, top_k, experts)
    if per_expert < 16:
        return MoeTritonConfig(BLOCK_M=16, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                               FUSED_ACT=0, SWAP_AB=1)
    return MoeTritonConfig(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=4, QUANT_IN_KERNEL=0,
                           FUSED_ACT=1, WGMMA=1)


def tuning_configs(m: int, top_k: int, experts: int) -> list[MoeTritonConfig]:
    """What ``tune --moe`` times at ``m`` tokens, most likely first, each distinct, at most 10: the rule's
    configuration, then its neighbours. At decode (the rule's transposed 16-row tile): the fused gate-up
    on the same tile (no fp32 round trip, one launch fewer; also with one pipeline stage fewer: its two
    weight tiles a stage hold one program on an SM at 4), the rule's tile with one stage fewer, the same
    with half the columns (twice the programs over the SMs), plain and fused, the ``wgmma`` kernel's 64 x
    128 tile, the 64 x 128 tile on the ``tl.dot`` kernels (one row block for up to 64 tokens of an expert:
    vLLM's tuned H200 tile at M 64 of DeepSeek-V3's 32 experts). Timed as the whole op on an H100 SXM
    (DeepSeek-V3 with 32 experts and Qwen3-30B-A3B, M 1-64, each candidate alone, uniform and skewed
    routing), against the rule's time: one stage fewer 0.96-0.97x at 32 experts' M 1 and skewed M 4,
    0.97-1.05x elsewhere; half the columns 0.95-1.10x (each GEMM alone took 3-6% less at M 1, which the
    op's other launches hide; with the fused gate-up, the fastest candidate at Qwen3-30B-A3B's M 64). (The
    same 16-row tile in the normal orientation, tried before, never beat the transposed one:
    :func:`default_config`.) At prefill (the ``wgmma`` rule): below 64 tokens per expert the ``tl.dot``
    kernels' 64 x 128 tile with 3 stages first (0.94x the rule's time at 16 tokens, DeepSeek-V3's M 64
    with 32 experts, and 0.90x at 32, Qwen3-30B-A3B's M 512, once the kernels' row strides were
    specialized; 1.07x at 128 tokens) and its 64-column half (0.98x the 128-column tile's time at
    DeepSeek-V3's M 64 with 32 experts on the H100, 0.99x skewed: the fastest candidate there), the
    plain structure (from 64 tokens per expert on 128 x 128 tiles of 8 warps first, then on the rule's
    tile), below 32 tokens per expert the transposed 16-row tile (the rule's below 16), the down GEMM on
    256 columns, one stage fewer, 32 row blocks sharing each weight tile (vLLM's tuned H200 prefill
    configurations take 16-64), and from 64 tokens the same ``tl.dot`` tiles (the rule before the ``wgmma``
    kernel, and what runs where that kernel does not).
    Then, everywhere, the fused gate-up with the normal ``tl.dot`` tiles, and quantizing its activation
    in the K loop (both measured slower on the H200, kept for other devices)."""
    base = default_config(m, top_k, experts)
    normal = {"SWAP_AB": 0}
    tl_dot = {**normal, "WGMMA": 0, "FUSED_ACT": 0, "BLOCK_M": min(base.BLOCK_M, 64), "num_warps": 4}
    if base.WGMMA:
        plain = {"FUSED_ACT": 0}
        per_expert = _tokens_per_expert(m, top_k, experts)
        near_decode = [{**plain, "WGMMA": 0, "BLOCK_M": 16, "SWAP_AB": 1}] if per_expert < 32 else []
        rows_128 = [{**plain, "BLOCK_M": 128, "num_warps": 8}] if per_expert >= 64 else []
        steps: list[dict[str, int]] = [*rows_128, plain, *near_decode, {"BLOCK_N": 256}, {"num_stages": 3},
                                       {"GROUP_M": 32}]
        tl_dot_tiles = [{**tl_dot, "num_stages": 3}, {**tl_dot, "num_stages": 3, "BLOCK_N": 64}]
        steps = [*tl_dot_tiles, *steps] if per_expert < 64 else [*steps, *tl_dot_tiles]
    else:
        half = {"BLOCK_N": base.BLOCK_N // 2, "num_stages": 3}
        steps = [{"FUSED_ACT": 1}, {"FUSED_ACT": 1, "num_stages": 3}, {"num_stages": 3}, half, {"FUSED_ACT": 1, **half},
                 {**normal, "WGMMA": 1, "BLOCK_M": 64}, {**normal, "BLOCK_M": 64}]
    steps += [{**tl_dot, "FUSED_ACT": 1}, {**tl_dot, "FUSED_ACT": 1, "QUANT_IN_KERNEL": 1}]
    out = [base]
    for step in steps:
        try:
            config = MoeTritonConfig(**{**base.to_dict(), **step})
        except ValueError:  # a step past a bound (BLOCK_M below 16)
            continue
        if config not in out:
            out.append(config)
    return out
