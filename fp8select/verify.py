"""Verification: run one small problem through a backend and compare with an fp64 reference.

Declared gates say a backend *should* work here; verification shows that it *does*, once,
at resolve time, before an engine relies on it for every forward pass. A backend that raises
or returns wrong numbers is rejected with that reason (and :func:`fp8select.resolve` takes
the next one) instead of failing, or silently corrupting outputs, in the forward pass.

The expected result is computed here in float64 from the same random inputs, independently
of fp8select's own quantizer and of the ``reference`` backend, so a bug shared by those
cannot hide itself. :func:`run_functional_probes` uses the same machinery for the gates
FACTS.md marks uncertain (block-wise ``scaled_mm`` on XPU): it records in the snapshot
whether the tiny call worked, instead of trusting a version guess.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fp8select.backends.base import Backend, BLOCK_128x128, block_pair
from fp8select.capabilities import Capabilities
from fp8select.problem import Problem, dtype_name
from fp8select.verdict import Verdict

__all__ = [
    "VERIFIED_FILE",
    "TOLERANCE",
    "VERIFY_SHAPE",
    "XPU_BLOCKWISE_KEY",
    "device_for",
    "expected_output",
    "run_functional_probes",
    "verify_backend",
]

VERIFY_SHAPE = (256, 384, 8)
"""(N, K, M) of the verification problem: two N blocks and three K blocks (so a transposed
or mis-strided scale gives a wrong answer rather than a coincidentally right one), K/128 odd
(the case that needs padding on cuBLAS), and M a multiple of 8 (every backend's M gate)."""

TOLERANCE = 1e-2
"""Largest relative Frobenius error accepted; bf16 output rounding gives about 2e-3."""

XPU_BLOCKWISE_KEY = "xpu_blockwise_scaled_mm"
"""Key in ``Capabilities.functional`` for the block-wise XPU ``F.scaled_mm`` functional probe."""

VERIFIED_FILE = "verified.json"
"""In the cache directory: built-in backends that passed verification, per device and versions."""

_DEVICES = {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "npu": "npu", "cpu": "cpu"}
_EPS = 1e-10  # amax floor of the documented activation quantization recipe


def device_for(caps: Capabilities) -> torch.device:
    """The torch device a snapshot's backends run on (ROCm devices are ``cuda`` in torch)."""
    return torch.device(_DEVICES[caps.device_kind])


def _fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _inputs(n: int, k: int, m: int, block: tuple[int, int], weight_dtype: torch.dtype, act_dtype: torch.dtype,
            seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random non-zero weight, block scales that differ per block, and activations (on CPU)."""
    gen = torch.Generator().manual_seed(seed)
    fmax = _fp8_max(weight_dtype)
    w = (torch.randn(n, k, generator=gen) * fmax / 4).clamp(-fmax, fmax)
    w = torch.where(w.abs() < 1e-2, torch.full_like(w, 1.0), w).to(weight_dtype)
    rows, cols = -(-n // block[0]), -(-k // block[1])
    scale = (torch.rand(rows, cols, generator=gen) + 0.5) * 2.0 ** -8
    x = torch.randn(m, k, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen))
    return w, scale, x.to(act_dtype)


def expected_output(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                    group: int = 128, act_fp8: torch.dtype | None = None) -> torch.Tensor:
    """``y = quant(x) @ dequant(weight).T`` in float64 (on CPU), written independently of the library.

    Activations are quantized with the recipe every backend implements: per token and per
    ``group`` K elements, ``scale = max(amax, 1e-10) / fp8_max`` in fp32, values divided,
    clamped and rounded to ``act_fp8`` (default: the weight's fp8 dtype); then both operands
    are dequantized in float64 and multiplied.
    """
    x32 = x.detach().cpu().to(torch.float32)
    m, k = x32.shape
    act_fp8 = act_fp8 or weight.dtype
    fmax = _fp8_max(act_fp8)
    groups = -(-k // group)
    padded = torch.zeros((m, groups * group), dtype=torch.float32)
    padded[:, :k] = x32
    tiles = padded.view(m, groups, group)
    x_scale = tiles.abs().amax(dim=2).clamp_min(_EPS) / fmax
    x_q = (tiles / x_scale[:, :, None]).clamp(-fmax, fmax).to(act_fp8)
    a = (x_q.to(torch.float64) * x_scale.to(torch.float64)[:, :, None]).view(m, groups * group)[:, :k]
    w = weight.detach().cpu()
    n = w.shape[0]
    s = scale.detach().cpu().to(torch.float64)
    row = torch.arange(n) // block[0]
    col = torch.arange(k) // block[1]
    b = w.to(torch.float64) * s[row][:, col]
    return a @ b.t()


def _pick(preferred: torch.dtype, allowed: tuple[torch.dtype, ...]) -> torch.dtype:
    return preferred if preferred in allowed or not allowed else allowed[0]


def verify_backend(backend: Backend, caps: Capabilities, device: torch.device | str | None = None, *,
                   shape: tuple[int, int, int] = VERIFY_SHAPE, seed: int = 0, tolerance: float = TOLERANCE) -> Verdict:
    """Run one small problem through ``backend`` on ``device`` and compare with the fp64 reference.

    Returns an accepted verdict with the measured error, or a rejected one naming what went
    wrong: the exception the backend raised (type and message), a wrong output shape or
    dtype, NaN/inf, or a relative Frobenius error above ``tolerance``. A backend whose own
    gate declines the verification problem is accepted as "not verified" (its gate will keep
    it from such calls anyway). Never raises for a backend's failure; ``device`` defaults to
    the snapshot's (:func:`device_for`).
    """
    n, k, m = shape
    dev = torch.device(device) if device is not None else device_for(caps)
    block = BLOCK_128x128 if BLOCK_128x128 in backend.block_sizes else block_pair(backend.block_sizes[0])
    act = _pick(torch.bfloat16, tuple(backend.activation_dtypes))
    out = _pick(torch.bfloat16, tuple(backend.out_dtypes))
    try:
        native = backend.weight_dtype(caps)
        # The checkpoint format first (what a layer receives from a DeepSeek-style checkpoint),
        # then the backend's own if its gate only takes that (e4m3fnuz on gfx942).
        for weight_dtype in dict.fromkeys((torch.float8_e4m3fn, native)):
            problem = Problem(n, k, block, m, weight_dtype, act, out)
            gate = backend.supports(problem, caps)
            if gate.ok:
                break
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a backend's (possibly third-party) gate may raise anything, SystemExit too
        return Verdict.reject(f"verification failed: its gate raised {_describe(exc)}")
    if not gate.ok:
        return Verdict.accept(f"not verified: its gate declines the verification problem ({gate.reason})")
    w, scale, x = _inputs(n, k, m, block, weight_dtype, act, seed)
    # A correct backend quantizes activations to the weight's fp8 format or to its native one.
    refs = [expected_output(x, w, scale, block, act_fp8=f) for f in dict.fromkeys((weight_dtype, native))]
    where = f"{problem.describe()} on {dev}"
    try:
        prepared = backend.prepare(w.to(dev), scale.to(dev), block, caps)
        y = backend.run(prepared, x.to(dev), input_scale=None, bias=None, out_dtype=out, caps=caps)
        if isinstance(y, torch.Tensor):
            y = y.detach().to("cpu")  # also waits for the device, so asynchronous faults surface here
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of the backend is the finding, SystemExit too
        return Verdict.reject(f"verification failed: raised {_describe(exc)} ({where})")
    return _compare(y, refs, (m, n), out, tolerance, where)


def _compare(y: Any, refs: list[torch.Tensor], shape: tuple[int, int], out: torch.dtype, tolerance: float,
             where: str) -> Verdict:
    if not isinstance(y, torch.Tensor):
        return Verdict.reject(f"verification failed: expected a tensor from run(), found {type(y).__name__} ({where})")
    if tuple(y.shape) != shape or y.dtype != out:
        return Verdict.reject(f"verification failed: expected output {dtype_name(out)} {list(shape)}, "
                              f"found {dtype_name(y.dtype)} {list(y.shape)} ({where})")
    y64 = y.to(torch.float64)
    bad = int((~torch.isfinite(y64)).sum())
    if bad:
        return Verdict.reject(f"verification failed: expected finite output, found {bad} NaN/inf values ({where})")
    err = min(float((y64 - ref).norm() / ref.norm().clamp_min(1e-30)) for ref in refs)
    if not err < tolerance:
        return Verdict.reject(f"verification failed: wrong result, relative Frobenius error {err:.2e} against the fp64 "
                              f"reference, required < {tolerance:.0e} ({where})")
    return Verdict.accept(f"verified: relative error {err:.1e} < {tolerance:.0e} ({where})")


def _describe(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run_functional_probes(caps: Capabilities, device: torch.device | str | None = None) -> Capabilities:
    """``caps`` with the results of functional probes added (tiny calls tried on this device).

    Only where a version gate is uncertain (FACTS.md): block-wise ``F.scaled_mm`` on XPU,
    recorded as ``functional["xpu_blockwise_scaled_mm"]`` (true when the small problem ran
    and matched the fp64 reference). Results already in the snapshot are kept, so a replayed
    snapshot is never re-probed; each probe runs at most once per process and device.
    """
    if caps.device_kind != "xpu" or XPU_BLOCKWISE_KEY in caps.functional:
        return caps
    if not caps.has_scaled_mm or not {"BlockWise1x128", "BlockWise128x128"} <= set(caps.scaling_types):
        ok = False  # nothing to call: the API or its block-wise recipes are absent
    else:
        ok = _xpu_blockwise_works(str(torch.device(device) if device is not None else device_for(caps)),
                                  caps.to_json(indent=None))
    return replace(caps, functional={**caps.functional, XPU_BLOCKWISE_KEY: ok})


@functools.lru_cache(maxsize=4)
def _xpu_blockwise_works(device: str, caps_json: str) -> bool:
    """Whether the XPU ``scaled_mm`` backend runs a small block-wise problem correctly (cached)."""
    from fp8select._log import get_logger
    from fp8select.backends.scaled_mm import XpuScaledMMBackend

    caps = Capabilities.from_json(caps_json)
    verdict = verify_backend(XpuScaledMMBackend(), caps, device)
    get_logger().info("fp8select.functional_probe", probe=XPU_BLOCKWISE_KEY, ok=verdict.ok, reason=verdict.reason)
    return verdict.ok and not verdict.reason.startswith("not verified")



# -- remembered verifications -----------------------------------------------------------------------
#
# Verifying runs each backend's kernels once, which on a fresh process means importing the vendor
# package and compiling its kernels (seconds with DeepGEMM and FlashInfer). A built-in backend
# that passed on this device model, with these versions of torch, CUDA, Triton, its packages and
# fp8select, passes again: the pass is remembered in the cache directory and later resolutions
# skip the run. Failures are never remembered (they are re-checked), nor are plugin backends
# (their versions are not known here). ``resolve(verify=True)`` always runs the check.


def verification_key(backend: Backend, caps: Capabilities) -> str:
    from fp8select._version import __version__
    from fp8select.measured.table import backend_versions

    payload = {"device": caps.device_name, "cc": caps.compute_capability, "gfx": caps.gfx_arch, "backend": backend.name,
               "versions": backend_versions(caps, backend.packages), "fp8select": __version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _verified_path(caps: Capabilities) -> Path:
    from fp8select.measured.table import cache_dir

    return cache_dir(caps.env) / VERIFIED_FILE


def remembered(caps: Capabilities) -> dict[str, str]:
    """Verification key -> the reason it passed with, from the cache directory (empty when unreadable)."""
    try:
        data = json.loads(_verified_path(caps).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    passed = data.get("passed") if isinstance(data, dict) else None
    if not isinstance(passed, dict):
        return {}
    return {k: v for k, v in passed.items() if isinstance(k, str) and isinstance(v, str)}


def remember(caps: Capabilities, passed: dict[str, str]) -> None:
    """Add ``passed`` to the remembered verifications (atomic replace; a cache that cannot be
    written is left alone: verification then simply runs again next time)."""
    from fp8select.measured.table import write_json

    with contextlib.suppress(OSError):
        write_json(_verified_path(caps), {"schema": 1, "passed": {**remembered(caps), **passed}})
