"""The output tile width DeepGEMM picks for a dense block-FP8 GEMM on Hopper: a feature of the plan's model.

DeepGEMM compiles its kernels per shape and, per call, picks the block sizes itself: among the output tiles
its SM90 kernel supports (``BLOCK_M`` 64, 128 or 256, and 16 and 32 for a few rows; ``BLOCK_N`` a multiple of
16 up to 192 that the kernel's K loop unrolls evenly; a cluster of two along either side where there is more
than one wave), those whose pipeline fits the shared memory with enough stages, it takes the one with the
least modelled time: the L1 and the L2 traffic of a tile times the tiles, over the wave efficiency (tiles
over the waves of tiles the SMs run). Its pick changes with M, N and K in steps, and its speed with the pick:
in the H200 table at M >= 256, DeepGEMM is the fastest backend wherever it picks a ``BLOCK_N`` of 128, 160 or
192 (377 points, geometric mean 1.000 of the fastest), and 1.08x the fastest where it picks 112 (111 points,
84 of them more than 3% behind: N 5120 and 7168 at M 2048, where it picks 112 for the waves, and CUTLASS or
cuBLAS run up to 1.21x faster). So the shapes where DeepGEMM picks the same width at an M bucket are alike in
how every backend stands against the fastest, and :mod:`fp8select.measured.model` weighs them so.

:func:`deepgemm_block_n` restates that choice from DeepGEMM 2.6.1's description of it (its SM90 heuristic:
the candidates, the stage rule and the cost), for the dense ``fp8_gemm_nt`` with 128x128 weight scales and a
bf16 output, on 132 SMs: the model uses it for the tables of :data:`DEVICES` only. It decides nothing by
itself: a later DeepGEMM that picks otherwise only makes the feature less telling, and the tables are
measured again at its version. Pure Python.
"""

from __future__ import annotations

import functools

__all__ = ["DEVICES", "SMS", "deepgemm_block_n"]

SMS = 132
DEVICES = frozenset({"NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H800"})
"""The devices (as torch names them) whose tables the feature applies to: Hopper (sm90) with 132 SMs, as the
restated choice assumes; on others DeepGEMM runs another heuristic or other waves."""
_SMEM = 232448  # bytes of shared memory a thread block may use on sm90
_L1 = 128 * SMS  # bytes per cycle, as DeepGEMM's cost counts them
_L2 = min(64 * SMS, int(8e6 / 1.3e3))
_MAX_STAGES = 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def _layouts(few_rows: int) -> tuple[tuple[int, ...], ...]:
    """The candidate tiles in DeepGEMM's order (the first of equal cost wins), each with what its cost needs:
    ``(BLOCK_M, BLOCK_N, clustered, the most bytes of weight scales its stages leave room for, L1 and L2
    operand bytes per K, L1 and L2 output bytes)``. ``few_rows``: M where it is 32 or less (16- and 32-row
    tiles are candidates then), else 33."""
    block_ms = [64, 128] + ([16] if few_rows <= 16 else []) + ([32] if few_rows <= 32 else []) + [256]
    out = []
    for cluster_m, cluster_n in ((1, 1), (1, 2), (2, 1)):
        for bm in block_ms:
            for bn in range(16, 193, 16):
                if bn > 128 and 128 % (bn - 128) and bn % (bn - 128):
                    continue  # the K loop's unroll needs one of the two to divide the other
                if bm > 128 and bn > 128:
                    continue  # registers
                extra = _cdiv(bm * bn * 2, 1024) * 1024 + _MAX_STAGES * 16  # the bf16 output tile, barriers
                per_stage = bm * 128 + bn * 128 + _cdiv(bm * 4, 128) * 128
                stages = 4 if bm * bn < 128 * 192 else 3  # to hide the loads' latency
                room = (_SMEM - extra - stages * per_stage) // (1 if 128 % bn == 0 else 2)  # one or two copies
                if room >= 0:
                    out.append((bm, bn, int(cluster_m * cluster_n > 1), room, bm + max(64, bm) + 2 * bn,
                                bm // cluster_n + bn // cluster_m, 4 * bm * bn, 2 * bm * bn))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def deepgemm_block_n(m: int, n: int, k: int) -> int:
    """The ``BLOCK_N`` DeepGEMM picks for an ``[M, K] x [N, K]`` block-FP8 GEMM on a 132-SM Hopper GPU."""
    scales = _cdiv(_cdiv(k, 128) * 4, 8) * 8  # the weight scales of a row of tiles, kept in shared memory
    best, pick = -1, 0
    for bm, bn, clustered, room, l1_ab, l2_ab, l1_cd, l2_cd in _layouts(min(m, 33)):
        if scales > room:
            continue
        tiles = -(-m // bm) * -(-n // bn)  # ceilings, inline: this loop runs about 90 times a call
        waves = -(-tiles // SMS)
        if clustered and waves <= 1:
            continue
        cycles = int(max((k * l1_ab + l1_cd) * tiles // _L1, (k * l2_ab + l2_cd) * tiles // _L2) * waves * SMS / tiles)
        if best < 0 or cycles < best:
            best, pick = cycles, bn
    return pick
