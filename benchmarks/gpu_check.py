"""GPU check for a CUDA GPU (the H200 figures come from it): tests, cuBLAS facts, numerics sweep.

Run from the repository root:

    python -m benchmarks.gpu_check --out OUTDIR [--quick]

It writes ``gpu_check.json`` under OUTDIR with: the snapshot and ``explain`` text of this
machine; the result of the GPU-marked tests; which M / K / recipe combinations cuBLAS
block-wise ``F.scaled_mm`` accepts (and with what error); and the relative error of every
backend the resolver accepts, through ``selection.prepare(...)(x)``, over the DeepSeek-V3
shapes with M from 1 to 8192 plus ragged N and K and K with (K/128) % 4 != 0, against an
fp64 dequantized reference computed on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import fp8select
from benchmarks._cuda import require_cuda
from tests.fp64_reference import expected, random_problem, rel_err

DEEPSEEK_V3 = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (36864, 7168), (7168, 18432)]
RAGGED = [(4160, 7168), (2112, 7200), (576, 1536), (256, 640), (384, 1152), (7168, 896), (1000, 1000)]
M_VALUES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def cublas_facts(quick: bool) -> list[dict[str, Any]]:
    """Which (M, K, weight recipe, scale padding) cuBLAS block-wise scaled_mm takes, and how accurate."""
    st = F.ScalingType
    rows: list[dict[str, Any]] = []
    ms = [*range(1, 34), 48, 64, 100, 127, 128, 255, 256]
    if quick:
        ms = [1, 2, 4, 8, 15, 16, 24, 32]
    from fp8select.kernels.quant import M_MAJOR, quantize_per_token_group

    for block in ((128, 128), (1, 128)):
        for n, k in ((256, 512), (256, 640), (512, 7168), (256, 7200)):
            w, s = random_problem(n, k, block, seed=n + k, device="cuda")
            kb = s.shape[1]
            l4 = -(-kb // 4) * 4
            variants: dict[str, torch.Tensor] = {}
            if block == (128, 128):
                variants["checkpoint.t()"] = s.t()
                padded = torch.zeros(s.shape[0], l4, device="cuda")
                padded[:, :kb] = s
                variants["padded.t()"] = padded.t()
            else:
                variants["untransposed"] = s
                padded = torch.zeros(n, l4, device="cuda")
                padded[:, :kb] = s
                variants["padded"] = padded[:, :kb] if l4 == kb else padded
            recipe_b = st.BlockWise128x128 if block == (128, 128) else st.BlockWise1x128
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                xq, xs = quantize_per_token_group(x, 128, layout=M_MAJOR)
                ref = expected(x, w, s, block)
                for name, sb in variants.items():
                    row: dict[str, Any] = {"block": list(block), "n": n, "k": k, "m": m, "scale_b": name}
                    try:
                        out = F.scaled_mm(xq, w.t(), xs, st.BlockWise1x128, sb, recipe_b, output_dtype=torch.bfloat16)
                        torch.cuda.synchronize()
                        row.update(ok=True, rel_err=rel_err(out, ref))
                    except Exception as exc:  # noqa: BLE001 - recording what the library says
                        row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                    rows.append(row)
    return rows


def numerics_sweep(selection: fp8select.Selection, quick: bool, rows: list[dict[str, Any]],
                   save: Any = lambda: None, deadline: float = float("inf"), first: int = 0) -> list[dict[str, Any]]:
    shapes = (DEEPSEEK_V3 + RAGGED)[first:]
    ms = M_VALUES
    if quick:
        shapes, ms = [(2112, 7168), (256, 640), (4160, 7200)], [1, 8, 16, 100, 1024]
    caps = selection.capabilities
    layers_by_backend: dict[str, Any] = {}
    for n, k in shapes:
        if time.time() > deadline:
            rows.append({"n": n, "k": k, "skipped": "time budget"})
            continue
        for block in ((128, 128), (1, 128)) if (n, k) in RAGGED[:4] or quick else ((128, 128),):
            w, s = random_problem(n, k, block, seed=n * 7 + k, device="cuda")
            layers_by_backend.clear()
            for backend in selection.chain:
                verdict = backend.supports(fp8select.Problem(n, k, block), caps)
                if not verdict.ok:
                    rows.append({"n": n, "k": k, "block": list(block), "backend": backend.name, "skipped": verdict.reason})
                    continue
                sel = fp8select.resolve(caps, backend=backend.name, plugins=False)
                layers_by_backend[backend.name] = sel.prepare(w, s, block)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
                ref = expected(x, w, s, block, bias)
                for name, layer in layers_by_backend.items():
                    row: dict[str, Any] = {"n": n, "k": k, "m": m, "block": list(block), "backend": name}
                    try:
                        row["ran"] = layer.backend_for(m).name
                        out = layer(x, bias=bias)
                        torch.cuda.synchronize()
                        row["rel_err"] = rel_err(out, ref)
                        row["ok"] = row["rel_err"] < 1e-2
                    except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
                        row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                    rows.append(row)
                del ref
            torch.cuda.empty_cache()
            save()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-facts", action="store_true", help="skip the cuBLAS acceptance facts")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop starting new shapes after this many seconds")
    parser.add_argument("--first-shape", type=int, default=0,
                        help="start the numerics sweep at this index of its 15 shapes (resume a budget-cut run)")
    args = parser.parse_args(argv)
    require_cuda("gpu_check")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = out_dir / "gpu_check.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1))

    import triton

    result["device"] = torch.cuda.get_device_name(0)
    result["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__}
    selection = fp8select.resolve(plugins=False)
    result["snapshot"] = selection.capabilities.to_dict()
    result["explain"] = selection.explain()
    result["chain"] = [b.name for b in selection.chain]
    print(selection.explain(), flush=True)
    save()

    if not args.skip_tests:
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py", "-p", "no:cacheprovider"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        result["gpu_tests"] = {"rc": proc.returncode, "tail": proc.stdout[-3000:] + proc.stderr[-2000:], "s": time.time() - t0}
        print(f"gpu tests rc={proc.returncode} ({time.time() - t0:.0f}s): {proc.stdout.strip().splitlines()[-1:]}", flush=True)
        save()

    result["numerics"] = []
    deadline = time.time() + args.budget_s
    parts = [("numerics", lambda: numerics_sweep(selection, args.quick, result["numerics"], save, deadline,
                                                          args.first_shape))]
    if not args.skip_facts:
        parts.insert(0, ("cublas_facts", lambda: cublas_facts(args.quick)))
    for key, fn in parts:
        t0 = time.time()
        try:
            result[key] = fn()
        except Exception:  # noqa: BLE001 - keep what the other parts found
            result[key + "_error"] = traceback.format_exc()
        result[key + "_s"] = time.time() - t0
        save()

    rows = result.get("numerics", [])
    bad = [r for r in rows if ("rel_err" in r and not r["ok"]) or "error" in r]
    worst = max((r["rel_err"] for r in rows if "rel_err" in r), default=float("nan"))
    print(f"numerics: {len(rows)} rows, {len(bad)} failing, worst rel err {worst:.2e}")
    for r in bad[:20]:
        print("  FAIL", r)
    facts = result.get("cublas_facts", [])
    accepted = sorted({r["m"] for r in facts if r["ok"] and r["block"] == [128, 128] and r["k"] == 512})
    print(f"cuBLAS block-wise accepts M (N=256, K=512, 128x128): {accepted}")
    for r in facts:
        if r["m"] == 16:
            print("  M=16", r["block"], r["k"], r["scale_b"], "ok" if r["ok"] else r["error"], r.get("rel_err", ""))
    result["summary"] = {"numerics_rows": len(rows), "numerics_failing": len(bad), "worst_rel_err": worst,
                         "cublas_m_accepted": accepted}
    save()
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
