"""Would a persistent, flattened tile GEMM beat the shipped Triton kernel at prefill? A probe, GEMM alone.

    PYTHONPATH=. python benchmarks/persistent_probe.py --out probe.json

The probe kernel below runs a grid of ``programs per SM x SMs`` programs, each looping over output tiles with
``tl.range(..., flatten=True)``: Triton flattens the tile and K loops into one and software-pipelines it, so the
next tile's TMA loads are in flight during a tile's epilogue (the shipped kernel, one tile per program, refills its
pipeline for every tile: 4-16 K steps at K 512-2048). For every DeepSeek-V3 shape at M 1024 and 4096, on one
prequantized activation (fp8select's quantizer, M-major scales): the shipped kernel with the table's configuration
(``w8a8_block_gemm``) and the probe at a few tiles, CUDA graph, median, weights rotated past the L2; each probe
result checked against the shipped kernel's (relative error below 1e-3).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROBES = [(128, 128, 8, 3, 1), (128, 128, 8, 4, 1), (128, 128, 4, 3, 2), (128, 64, 4, 4, 2), (64, 128, 4, 4, 2),
          (256, 64, 8, 3, 1)]  # (BLOCK_M, BLOCK_N, num_warps, num_stages, programs per SM)


def probe_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def persistent_kernel(a_desc, as_ptr, b_desc, bs_ptr, c_ptr, M, N, K, stride_asm, stride_ask, stride_bsn,
                          stride_bsk, stride_cm, stride_cn, PROGRAMS, SCALE_BN: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, STAGES: tl.constexpr):
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        pids_per_group = GROUP_M * num_pid_n
        for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, PROGRAMS, flatten=True, num_stages=STAGES):
            first_pid_m = (tile // pids_per_group) * GROUP_M
            group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
            pid_m = first_pid_m + (tile % pids_per_group) % group_rows
            pid_n = (tile % pids_per_group) // group_rows
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            as_base = as_ptr + (offs_m % M).to(tl.int64) * stride_asm
            bs_base = bs_ptr + (pid_n * BLOCK_N // SCALE_BN) * stride_bsn
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kb in range(0, tl.cdiv(K, BLOCK_K)):
                a = a_desc.load([pid_m * BLOCK_M, kb * BLOCK_K])
                b = tl.trans(b_desc.load([pid_n * BLOCK_N, kb * BLOCK_K]))
                acc += tl.dot(a, b) * (tl.load(as_base + kb * stride_ask) * tl.load(bs_base + kb * stride_bsk))[:, None]
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
            c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)

    return persistent_kernel


def launch(kernel: Any, a_desc: Any, xs: Any, wi: Any, *, s: Any, out: Any, tile: tuple[int, int, int, int],
           programs: int) -> Any:
    """One probe call on weight ``wi`` (its TMA descriptor made per call, as the shipped kernel does)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, warps, stages = tile
    m, n, k = out.shape[0], out.shape[1], wi.shape[1]
    b_desc = TensorDescriptor(wi, list(wi.shape), [wi.stride(0), 1], [bn, 128])
    kernel[(programs,)](a_desc, xs, b_desc, s, out, m, n, k, xs.stride(0), xs.stride(1), s.stride(0), s.stride(1),
                        out.stride(0), out.stride(1), programs, SCALE_BN=128, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128,
                        GROUP_M=8, STAGES=stages, num_warps=warps)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--replays", type=int, default=30)
    args = parser.parse_args(argv)
    import torch
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import limits

    from fp8select import bench
    from fp8select.buckets import m_bucket
    from fp8select.kernels import triton_gemm
    from fp8select.kernels.quant import M_MAJOR
    from fp8select.kernels.triton_quant import quantize_per_token_group_triton

    t0 = time.monotonic()
    kernel = probe_kernel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table = limits.plan_work(0, 0, 0).table
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict[str, Any]] = []
    for n, k in bench.SHAPE_SETS["deepseek-v3"]:
        w, s = bench.random_weight(n, k, "cuda", gen)
        weights = [w] + [w.clone() for _ in range(bench.rotation_copies(n * k) - 1)]
        for m in (1024, 4096):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            xq, xs = quantize_per_token_group_triton(x, 128, dtype=w.dtype, layout=M_MAJOR)
            cfg = table[(n, k, m_bucket(m))]
            shipped = functools.partial(triton_gemm.w8a8_block_gemm, xq, xs, block_size=(128, 128),
                                        out_dtype=torch.bfloat16, config=cfg)
            ref = shipped(w, s).float()
            row: dict[str, Any] = {"n": n, "k": k, "m": m, "table_config": cfg.describe(),
                                   "table_us": round(bench.time_graph([functools.partial(shipped, wi, s) for wi in weights],
                                                                      args.replays).median_us, 3)}
            for bm, bn, warps, stages, per_sm in PROBES:
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                programs = min(per_sm * sms, triton.cdiv(m, bm) * triton.cdiv(n, bn))
                a_desc = TensorDescriptor(xq, list(xq.shape), [xq.stride(0), 1], [bm, 128])

                call = functools.partial(launch, kernel, a_desc, xs, s=s, out=out, tile=(bm, bn, warps, stages),
                                         programs=programs)
                key = f"{bm}x{bn} w{warps} s{stages} x{per_sm}"
                try:
                    err = float((call(w).float() - ref).norm() / ref.norm())
                    if not err < 1e-3:
                        raise ValueError(f"relative error {err:.2e} against the shipped kernel")
                    row[key] = round(bench.time_graph([functools.partial(call, wi) for wi in weights],
                                                      args.replays).median_us, 3)
                except Exception as exc:  # noqa: BLE001 - a probe that fails is data
                    row[key] = f"{type(exc).__name__}: {exc}"[:160]
            timed = {key: v for key, v in row.items() if key.endswith(tuple(f"x{p[4]}" for p in PROBES))
                     and isinstance(v, float)}
            if timed:
                best = min(timed, key=timed.__getitem__)
                row["best_probe"], row["best_over_table"] = best, round(timed[best] / row["table_us"], 4)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        del weights
    ratios = [r["best_over_table"] for r in rows if "best_over_table" in r]
    report = {"source": "benchmarks/persistent_probe.py", "elapsed_s": round(time.monotonic() - t0, 1),
              "best_over_table_geomean": round(float(torch.tensor(ratios).log().mean().exp()), 4) if ratios else None,
              "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
