"""Relative error of each pinned backend over many seeded activations, and FlashInfer's quantizer against ours.

    source .vendors/setup.sh && python benchmarks/vendor_error_probe.py --out vendor_error_probe.json

tests/test_gpu.py::test_every_accepted_backend_is_correct draws its activation with an unseeded
``torch.randn`` and requires a relative error under 1e-2 against the fp64 reference of
tests/fp64_reference.py; FlashInfer failed it once (M=1, N x K = 4160 x 640, 1.21e-2). This probe
takes the test's weights (``random_problem(n, k, seed=n + k + m)``) and 40 seeded activations and
biases (``torch.Generator("cuda").manual_seed(seed)``, x then bias) per (shape, M), runs every backend
the resolver accepts among flashinfer, deepgemm, cutlass, cuda-scaled-mm, triton, pinned
(``resolve(backend=NAME, plugins=False).prepare(w, s, block)``), and records per (backend, shape, M)
the max, median and count over 1e-2 of the relative error, with the bias as in the test and without.

FlashInfer's Hopper kernel (``fp8_blockscale_gemm_sm90``) quantizes the bf16 activation itself
(``scale_1x128_kernel``: ``scale = 448.f / amax`` in float32, ``q = fp8(x * scale)``, stored scale
``1.f / scale``), where the reference divides by ``amax / 448`` in float64. For FlashInfer the error is
also taken against a second fp64 reference whose activation is quantized that way (``fi_ref``), and
the two references are compared (``quantizer_gap``: their relative difference, and how many quantized
activation values differ). A gap that the FlashInfer-style reference closes is the quantizer's rounding;
one it does not close is the GEMM's. ``bf16_floor``: the error of the reference itself rounded to
bfloat16 (what a bf16 output alone costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch
from fp64_reference import dequant_weight, expected, quantize_groups, random_problem, rel_err

import fp8select

BACKENDS = ("flashinfer", "deepgemm", "cutlass", "cuda-scaled-mm", "triton")
SHAPES = ((4160, 640), (256, 640), (576, 1536), (2112, 7168))
M_VALUES = (1, 2, 8, 16)
BLOCK = (128, 128)
THRESHOLD = 1e-2
FP8_MAX = 448.0


def sig(v: float) -> float:
    return float(f"{v:.4g}")


def flashinfer_quantize(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's sm90 1x128 activation quantizer, emulated in float32: (fp8 [M, K], float32 scales [M, K/group]).

    amax of the bf16 group (exact in float32), ``scale = 448.f / amax`` (1 where amax is 0),
    ``q = fp8(float(x) * scale)`` (the cast saturates: __nv_fp8_e4m3 is satfinite), stored
    dequantization scale ``1.f / scale``.
    """
    m, k = x.shape
    groups = -(-k // group)
    padded = torch.zeros((m, groups * group), dtype=torch.float32, device=x.device)
    padded[:, :k] = x.detach().to(torch.float32)
    blocks = padded.view(m, groups, group)
    amax = blocks.abs().amax(dim=2)
    scale = torch.where(amax != 0, torch.tensor(FP8_MAX, dtype=torch.float32, device=x.device) / amax,
                        torch.ones_like(amax))
    q = (blocks * scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    inv = torch.tensor(1.0, dtype=torch.float32, device=x.device) / scale
    return q.view(m, groups * group)[:, :k], inv


def flashinfer_expected(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, wdq: torch.Tensor) -> tuple[torch.Tensor, int]:
    """fp64 [M, N] with the activation quantized the FlashInfer way (no bias), and how many quantized
    values differ from the reference quantizer's."""
    k = w.shape[1]
    q, inv = flashinfer_quantize(x, BLOCK[1])
    q_ref, _ = quantize_groups(x, BLOCK[1], w.dtype)
    mismatches = int((q.to(torch.float32) != q_ref.to(torch.float32)).sum())
    cols = torch.arange(k, device=x.device) // BLOCK[1]
    a = q.to(torch.float64) * inv.to(torch.float64)[:, cols]
    return a @ wdq.t(), mismatches


def nblock_errors(out: torch.Tensor, ref: torch.Tensor) -> list[float]:
    """Relative error of each 128-row block of N (the output columns a weight-scale row covers)."""
    diff = out.detach().to(torch.float64) - ref
    n = ref.shape[1]
    return [float(diff[:, i:i + 128].norm() / ref[:, i:i + 128].norm().clamp_min(1e-30)) for i in range(0, n, 128)]


def stats(errs: list[float]) -> list[Any]:
    """[max, median, count >= THRESHOLD, the seed of the max] (a NaN counts as inf)."""
    vals = [e if e == e else float("inf") for e in errs]
    worst = max(range(len(vals)), key=vals.__getitem__)
    return [sig(vals[worst]), sig(statistics.median(vals)), sum(e >= THRESHOLD for e in vals), worst]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--budget-s", type=float, default=100.0, help="start no new (shape, M) after this many seconds")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated backend names")
    parser.add_argument("--fi-ref", default="flashinfer",
                        help="backends also compared with the FlashInfer-style reference (comma-separated)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to try the script (reference backend)")
    args = parser.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("vendor_error_probe: no CUDA device", file=sys.stderr)
        return 2
    t_start = time.time()
    deadline = t_start + args.budget_s
    wanted = [b for b in args.backends.split(",") if b]
    fi_ref = set(b for b in args.fi_ref.split(",") if b)
    selection = fp8select.resolve(plugins=False)
    caps = selection.capabilities
    accepted = [b.name for b in selection.chain]
    env: dict[str, Any] = {"torch": torch.__version__, "accepted_chain": accepted}
    if device == "cuda":
        env["device"] = torch.cuda.get_device_name(0)
    try:
        import flashinfer

        env["flashinfer"] = getattr(flashinfer, "__version__", "?")
    except Exception:  # noqa: BLE001 - absent is fine
        env["flashinfer"] = None
    report: dict[str, Any] = {
        "source": "benchmarks/vendor_error_probe.py", "environment": env, "seeds": args.seeds,
        "threshold": THRESHOLD, "block": list(BLOCK),
        "keys": {"err": "rel err vs the fp64 reference, with the test's bias", "err_nobias": "the same without bias",
                 "fi_ref": "rel err vs the FlashInfer-style fp64 reference (with bias)",
                 "fi_ref_nobias": "the same without bias",
                 "each": "[max, median, count >= threshold, seed of the max] over the seeds",
                 "ran": "the kernel the pinned layer's plan names at M, where not the backend's own name",
                 "n_blocks_nobias": "at the seed of the max error without bias: [seed, worst 128-row N block, its "
                                    "rel err, the median block's, blocks]",
                 "bf16_floor": "(references) the fp64 reference with bias rounded to bf16, against itself",
                 "quantizer_gap": "(references) [max, median] rel difference of the FlashInfer-style reference from "
                                  "the fp64 one (no bias), quantized values that differ, values"},
        "not_run": {}, "points": [], "skipped": [],
    }
    backends = []
    for name in wanted:
        if name not in accepted:
            report["not_run"][name] = "not accepted by the resolver on this machine"
        else:
            backends.append(next(b for b in selection.chain if b.name == name))
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        report["seconds"] = round(time.time() - t_start, 1)
        out_path.write_text(dumps(report))

    for n, k in SHAPES:
        for m in M_VALUES:
            if time.time() > deadline:
                report["skipped"].append({"n": n, "k": k, "m": m, "why": "time budget"})
                continue
            t0 = time.time()
            w, s = random_problem(n, k, BLOCK, seed=n + k + m, device=device)  # the test's weight
            wdq = dequant_weight(w, s, BLOCK)
            layers: dict[str, Any] = {}
            errs: dict[str, dict[str, list[float]]] = {}
            point_notes: dict[str, str] = {}
            for backend in backends:
                verdict = backend.supports(fp8select.Problem(n, k, BLOCK), caps)
                if not verdict.ok:
                    point_notes[backend.name] = f"unsupported: {verdict.reason}"
                    continue
                try:
                    layers[backend.name] = fp8select.resolve(caps, backend=backend.name, plugins=False).prepare(w, s, BLOCK)
                except Exception as exc:  # noqa: BLE001 - recorded
                    point_notes[backend.name] = f"prepare: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    continue
                errs[backend.name] = {"err": [], "err_nobias": [], "fi_ref": [], "fi_ref_nobias": []}
            floor: list[float] = []
            gap: list[float] = []
            mismatch: list[int] = []
            worst_blocks: dict[str, tuple[float, int, list[float]]] = {}
            for seed in range(args.seeds):
                gen = torch.Generator(device=device).manual_seed(seed)
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
                bias = torch.randn(n, device=device, dtype=torch.bfloat16, generator=gen)
                ref_nb = expected(x, w, s, BLOCK)
                ref_b = ref_nb + bias.to(torch.float64)
                floor.append(rel_err(ref_b.to(torch.bfloat16), ref_b))
                fi_nb = fi_b = None
                if fi_ref & set(layers):
                    fi_nb, mm = flashinfer_expected(x, w, s, wdq)
                    fi_b = fi_nb + bias.to(torch.float64)
                    gap.append(rel_err(fi_nb, ref_nb))
                    mismatch.append(mm)
                for name, layer in list(layers.items()):
                    try:
                        out_b = layer(x, bias=bias)
                        out_nb = layer(x)
                        if device == "cuda":
                            torch.cuda.synchronize()
                    except Exception as exc:  # noqa: BLE001 - recorded, the others go on
                        point_notes[name] = f"call: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                        del layers[name]
                        continue
                    e = errs[name]
                    e["err"].append(rel_err(out_b, ref_b))
                    e["err_nobias"].append(rel_err(out_nb, ref_nb))
                    if name in fi_ref and fi_nb is not None:
                        e["fi_ref"].append(rel_err(out_b, fi_b))
                        e["fi_ref_nobias"].append(rel_err(out_nb, fi_nb))
                        worst = worst_blocks.get(name)
                        if worst is None or e["err_nobias"][-1] > worst[0]:
                            worst_blocks[name] = (e["err_nobias"][-1], seed, nblock_errors(out_nb, ref_nb))
            for name, e in errs.items():
                row: dict[str, Any] = {"backend": name, "n": n, "k": k, "m": m}
                if name in layers and layers[name].plan(m).name != name:
                    row["ran"] = layers[name].plan(m).name
                for key, values in e.items():
                    if values:
                        row[key] = stats(values)
                if name in worst_blocks:
                    _, seed, blocks = worst_blocks[name]
                    i = max(range(len(blocks)), key=blocks.__getitem__)
                    row["n_blocks_nobias"] = [seed, i, sig(blocks[i]), sig(statistics.median(blocks)), len(blocks)]
                if name in point_notes:
                    row["note"] = point_notes[name]
                report["points"].append(row)
            for name, note in point_notes.items():
                if name not in errs:
                    report["points"].append({"backend": name, "n": n, "k": k, "m": m, "note": note})
            shape_row: dict[str, Any] = {"backend": "(references)", "n": n, "k": k, "m": m,
                                         "bf16_floor": stats(floor)}
            if gap:
                shape_row["quantizer_gap"] = [sig(max(gap)), sig(statistics.median(gap)), sum(mismatch),
                                              m * k * len(mismatch)]
            shape_row["s"] = round(time.time() - t0, 1)
            report["points"].append(shape_row)
            print(f"{n}x{k} M={m}: " + ", ".join(
                f"{r['backend']} {r['err'][0]:.2e}" + (f" (fi_ref {r['fi_ref'][0]:.2e})" if "fi_ref" in r else "")
                for r in report["points"] if r.get("n") == n and r.get("m") == m and "err" in r), flush=True)
            del layers
            if device == "cuda":
                torch.cuda.empty_cache()
            save()
    report["summary"] = summarize(report["points"])
    save()
    print(json.dumps(report["summary"], indent=1))
    return 0


def dumps(report: dict[str, Any]) -> str:
    """Indented at the top, one line per point (a few KB)."""
    lines = []
    for key, value in report.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            inner = ",\n  ".join(json.dumps(v) for v in value)
            lines.append(f' {json.dumps(key)}: [\n  {inner}\n ]')
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def summarize(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per backend: points, worst error (with and without bias) and where, seeds over the threshold."""
    out: dict[str, Any] = {}
    for r in points:
        if "err" not in r:
            continue
        b = out.setdefault(r["backend"], {"points": 0, "over": 0, "over_nobias": 0, "worst": 0.0, "worst_nobias": 0.0})
        b["points"] += 1
        b["over"] += r["err"][2]
        b["over_nobias"] += r["err_nobias"][2]
        for key, src in (("worst", "err"), ("worst_nobias", "err_nobias"), ("worst_fi_ref", "fi_ref"),
                         ("worst_fi_ref_nobias", "fi_ref_nobias")):
            if src in r and r[src][0] > b.get(key, 0.0):
                b[key] = r[src][0]
                b[key + "_at"] = f"{r['n']}x{r['k']} M={r['m']} seed {r[src][3]}"
        if "fi_ref" in r:
            b["over_fi_ref"] = b.get("over_fi_ref", 0) + r["fi_ref"][2]
            b["over_fi_ref_nobias"] = b.get("over_fi_ref_nobias", 0) + r["fi_ref_nobias"][2]
    return out


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - a traceback in the log, exit 1
        traceback.print_exc()
        sys.exit(1)
