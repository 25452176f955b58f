"""fp8select's Triton MoE experts op against vLLM's tuned Triton fused-MoE kernel, on the same problem, in one run.

Usage (repository root): ``python -m benchmarks.moe_peer --out DIR [--peer .peer/vllm_fused_moe]
[--shapes deepseek-v3-e32,qwen3-30b-a3b] [--m 1,16,64,512,4096] [--budget-s S]``; writes ``DIR/moe_peer.json``.

**The peer is not part of fp8select** and is never committed: ``--peer`` names a folder (ignored by git,
``.peer/`` by default; docs/moe-measurements.md says how to fill it) holding ``fused_moe_kernel.py`` (vLLM's
``@triton.jit`` ``fused_moe_kernel`` and the helper it calls, with vLLM's license header, standalone: it
imports only triton), ``configs/`` (vLLM's tuned JSONs, named as vLLM names them,
``E={E},N={I},device_name={device},dtype=fp8_w8a8,block_shape=[128,128].json``) and ``SOURCE.txt`` (the
repository, commit and paths). The kernel file is loaded by path (importlib); nothing here is vLLM's code.

Method, per shape (``fp8select.measured.moe.MOE_SHAPES``) and M:

* **Problem**: random fp8 experts (``fp8select.measure.tune_moe.random_experts``), rotated through enough
  copies that one call's expert weights exceed the 60 MB L2 three times over (``weight_copies``), bf16
  activations, uniform routing (``fp8select.kernels.moe_routing.uniform_routing``: k distinct experts per
  token, no id -1). Both columns run on the same tensors.
* **fp8select**: the Triton MoE backend pinned (``backend.bind``, layout ``sorted``) at its configuration for
  the point: the shipped table's measured ``triton/sorted`` row for the M bucket, else its default rule.
  The whole experts op: routing, activation quantization, gate-up GEMM with fused ``silu(gate) * up`` and
  1x128 quantization, down GEMM, weighted sum.
* **vLLM** (``peer``): the same op as vLLM's ``TritonExperts`` runs it around ``fused_moe_kernel``
  (``use_fp8_w8a8``, block ``[128, 128]``, per-token-group activation quantization), with fp8select's
  pieces where vLLM's are CUDA C++ or tied to vLLM:

  - routing: fp8select's ``route()`` at the configuration's ``BLOCK_SIZE_M``, which has the meaning of
    vLLM's ``moe_align_block_size`` (a CUDA op): slot ids (``t * k + j``) sorted by expert, each expert's run
    padded to ``BLOCK_SIZE_M`` with the sentinel ``M * k``, one expert per block, -1 for an unused block.
    ``num_tokens_post_padded`` is the routing's capacity (a device scalar set once per M), so the trailing
    unused blocks take the kernel's expert -1 branch (its zero rows all masked) instead of its early return;
  - the activation's 1x128 quantization: fp8select's Triton quantizer (vLLM's ``per_token_group_quant_fp8``
    computes the same scale, amax / 448 per group);
  - gate-up GEMM: the peer kernel, bf16 output ``[M, k, 2I]``;
  - ``silu(gate) * up`` and its 1x128 quantization: fp8select's ``silu_mul_quant`` (one launch, where vLLM
    runs its CUDA ``silu_and_mul`` then ``per_token_group_quant_fp8``: two; this favours the peer);
  - down GEMM: the peer kernel with ``MUL_ROUTED_WEIGHT``, bf16 ``[M, k, H]``;
  - the sum over k: ``torch.sum(dim=1)`` (vLLM's ``moe_sum`` calls ``at::sum_out`` for k > 4).

  The launch follows vLLM's ``invoke_fused_moe_kernel`` (re-implemented here): grid
  ``cdiv(EM, BLOCK_SIZE_M) * cdiv(N, BLOCK_SIZE_N)`` with ``EM`` the sorted ids' length, cut to
  ``rows * top_k * BLOCK_SIZE_M`` when the GEMM's A has fewer rows than ``BLOCK_SIZE_M``; ``BLOCK_SIZE_K``
  at most the 128 of the block; ``SPLIT_K`` 1. Its configuration: vLLM's tuned JSON for ``(E, N = I)`` and
  this device when the peer folder has it, at the M key nearest the token count (vLLM's
  ``try_get_optimal_moe_config``), else vLLM's default for block fp8 (:data:`VLLM_DEFAULT_FP8_BLOCK`).
* **Check**, before timing, against the fp64 semantics on the GPU (``benchmarks.moe.reference64``): fp8select
  within 1e-2 of it, the peer within 1e-2 of it with both GEMMs' outputs rounded to bf16 (what the peer
  computes: its GEMMs write bf16 gate/up before silu, and bf16 weighted rows), and the two within 3e-2 of each
  other (relative Frobenius errors, all recorded). Not 1e-2 between the two: rounding gate/up to bf16 moves
  some values of the requantized product across an fp8 rounding step, which docs/moe.md measured at up to
  1.44e-2 for the vendors that do the same. A point that fails is recorded and not timed.
* **Timing**: each column captured in a CUDA graph (one call per weight copy), replays interleaved
  (``fp8select.measure.timing.time_graphs``), median / min / max per call.
* **Summary**: per point fp8select's median over the peer's (below 1: fp8select faster); geomean and worst.

Not measured here: ids of -1 (this peer path leaves those slots' rows unset; vLLM zeroes them only with an
expert map), skewed routing, the peer's own alignment, activation and sum kernels (CUDA, not in the peer
folder). Stops starting points (and says so) when ``--budget-s`` runs out; what was measured is written.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks._cuda import require_cuda
from benchmarks._stats import geomean
from fp8select.measured.moe import MOE_SHAPES

DEFAULT_PEER = Path(".peer") / "vllm_fused_moe"
KERNEL_FILE = "fused_moe_kernel.py"
DEFAULT_SHAPES = ("deepseek-v3-e32", "qwen3-30b-a3b")
DEFAULT_M = (1, 16, 64, 512, 4096)
REL_ERR_MAX = 1e-2
MUTUAL_ERR_MAX = 3e-2
BLOCK = (128, 128)

VLLM_DEFAULT_FP8_BLOCK: dict[str, int] = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": BLOCK[0], "BLOCK_SIZE_K": BLOCK[1],
                                          "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 3}
"""vLLM's ``get_default_config`` for ``dtype == "fp8_w8a8"`` with a block shape on CUDA (at the peer's commit,
SOURCE.txt), what it runs where no tuned JSON exists."""

_LAUNCH_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


# -- vLLM's configuration lookup, re-implemented (no GPU needed) --------------------------------------------------


def vllm_device_name(cuda_name: str) -> str:
    """The device part of vLLM's config file names: spaces to underscores, any H200 variant ``NVIDIA_H200``."""
    name = cuda_name.replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(experts: int, intermediate: int, device_name: str, block: Sequence[int] = BLOCK) -> str:
    """vLLM's tuned-config file name for block fp8 w8a8 (``N`` is the intermediate size per rank: w13 has 2N rows)."""
    return (f"E={experts},N={intermediate},device_name={device_name},dtype=fp8_w8a8,"
            f"block_shape=[{block[0]},{block[1]}].json")


def parse_configs(data: Mapping[str, Any]) -> dict[int, dict[str, int]]:
    """A tuned JSON's M -> configuration map (keys as ints; the ``triton_version`` entry dropped)."""
    return {int(key): dict(value) for key, value in data.items() if key != "triton_version"}


def load_configs(peer: Path, experts: int, intermediate: int, device_name: str) -> tuple[dict[int, dict[str, int]] | None, str]:
    """``(M -> configuration, file name)`` from ``peer/configs``; ``(None, name)`` when the peer has no such file."""
    name = config_file_name(experts, intermediate, device_name)
    path = peer / "configs" / name
    if not path.is_file():
        return None, name
    return parse_configs(json.loads(path.read_text(encoding="utf-8"))), name


def nearest_m(keys: Sequence[int] | Mapping[int, Any], m: int) -> int:
    """The key vLLM picks for ``m`` tokens: ``min(keys, key=|key - m|)``, a tie to the first key (the files
    list them ascending, so the smaller)."""
    return min(keys, key=lambda key: abs(key - m))


def peer_config(configs: Mapping[int, Mapping[str, int]] | None, m: int, file_name: str = "") -> tuple[dict[str, int], str]:
    """``(configuration, where it came from)`` for ``m`` tokens: the tuned one at the nearest M key, else
    vLLM's default for block fp8."""
    if not configs:
        return dict(VLLM_DEFAULT_FP8_BLOCK), f"vLLM default (no tuned file {file_name})" if file_name else "vLLM default"
    key = nearest_m(list(configs), m)
    return dict(configs[key]), f"vLLM tuned {file_name} at M key {key}"


def launch_meta(config: Mapping[str, int], block: Sequence[int] = BLOCK) -> dict[str, int]:
    """The kernel's meta-parameters from a configuration, as vLLM's launcher passes them: ``BLOCK_SIZE_K``
    at most the block's, ``SPLIT_K`` 1, ``num_warps`` / ``num_stages`` kept (absent: Triton's defaults)."""
    missing = [key for key in _LAUNCH_KEYS[:4] if key not in config]
    if missing:
        raise ValueError(f"peer configuration lacks {missing}: {dict(config)}")
    meta = {key: int(config[key]) for key in _LAUNCH_KEYS if key in config}
    meta["BLOCK_SIZE_K"] = min(meta["BLOCK_SIZE_K"], min(block))
    meta["SPLIT_K"] = 1
    return meta


def grid_rows(a_rows: int, sorted_len: int, block_m: int, top_k: int) -> int:
    """vLLM's ``EM``: the sorted ids' length, cut to ``a_rows * top_k * block_m`` when A has fewer rows than
    one block (each token's experts are distinct, so at most that many blocks are used)."""
    return min(sorted_len, a_rows * top_k * block_m) if a_rows < block_m else sorted_len


def parse_ms(text: str) -> tuple[int, ...]:
    """``"1,16,64"`` -> ``(1, 16, 64)``: positive ints, ascending, once each."""
    try:
        ms = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--m {text!r}: expected positive integers separated by commas") from None
    if not ms or ms[0] < 1:
        raise argparse.ArgumentTypeError(f"--m {text!r}: expected positive integers separated by commas")
    return tuple(ms)


def parse_shapes(text: str) -> dict[str, tuple[int, int, int, int]]:
    """``--shapes``: names of :data:`MOE_SHAPES` separated by commas (``all``: every one), or names and ``E,H,I,k``
    quadruples separated by ``;``. Keys: the name, or ``"E,H,I,k"``."""
    from fp8select.errors import InvalidInputError
    from fp8select.measured.moe import parse_moe_shape

    if text.strip().lower() == "all":
        return dict(MOE_SHAPES)
    names = [part.strip().lower() for part in text.split(",")]
    parts = names if all(name in MOE_SHAPES for name in names) else [part.strip().lower() for part in text.split(";")]
    out: dict[str, tuple[int, int, int, int]] = {}
    for part in parts:
        try:
            shape = parse_moe_shape(part)
        except InvalidInputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        out[part if part in MOE_SHAPES else "{},{},{},{}".format(*shape)] = shape
    if not out:
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: no shape")
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_peer", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for moe_peer.json")
    parser.add_argument("--peer", type=Path, default=DEFAULT_PEER,
                        help=f"folder holding the peer ({KERNEL_FILE}, configs/, SOURCE.txt); default {DEFAULT_PEER}")
    parser.add_argument("--shapes", type=parse_shapes, default=",".join(DEFAULT_SHAPES),
                        help=f"MoE shapes: names ({', '.join(MOE_SHAPES)}, or all) separated by commas, or E,H,I,k "
                             f"quadruples separated by ';' (default {','.join(DEFAULT_SHAPES)})")
    parser.add_argument("--m", type=parse_ms, default=",".join(map(str, DEFAULT_M)),
                        help=f"token counts (default {','.join(map(str, DEFAULT_M))})")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per column and point")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no point after this many seconds")
    return parser.parse_args(argv)


# -- the peer path ------------------------------------------------------------------------------------------------


def load_peer(folder: Path) -> ModuleType:
    """The peer's kernel module, loaded by path (a fresh module each call: its kernels are built now, so under
    ``TRITON_INTERPRET=1`` they are interpreted). FileNotFoundError naming what is missing."""
    path = Path(folder) / KERNEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no peer kernel at {path}: fetch vLLM's fused_moe_kernel into {folder} (docs/moe.md, "
                                "'What is measured and what is not yet')")
    name = "fp8select_peer_vllm_fused_moe"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton reads the kernels' source through their module
    spec.loader.exec_module(module)
    if not hasattr(module, "fused_moe_kernel"):
        raise ImportError(f"{path} defines no fused_moe_kernel")
    return module


def _compute_type(dtype: Any) -> Any:
    import torch
    import triton.language as tl

    types = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
    if dtype not in types:
        raise ValueError(f"the peer kernel writes bf16, fp16 or fp32, not {dtype}")
    return types[dtype]


def _peer_gemm(kernel: Any, a: Any, a_scale: Any, w: Any, w_scale: Any, c: Any, topk_weights: Any, routing: Any,
               num_post: Any, top_k: int, mul_routed_weight: bool, meta: Mapping[str, int]) -> None:
    """One launch of the peer kernel as vLLM's ``invoke_fused_moe_kernel`` makes it for block fp8 w8a8:
    ``a`` ``[rows, K]`` fp8 with scales ``[rows, K/128]``, ``w`` ``[E, N, K]`` with ``[E, N/128, K/128]``,
    ``c`` ``[*, top_k', N]`` written at each slot's row."""
    import triton

    n, k = w.shape[1], w.shape[2]
    em = grid_rows(a.shape[0], routing.slot_ids.shape[0], meta["BLOCK_SIZE_M"], top_k)
    grid = (triton.cdiv(em, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)
    kernel[grid](
        a, w, c, None, a_scale, w_scale, topk_weights, routing.slot_ids, routing.block_expert, num_post,
        n, k, em, a.shape[0] * top_k,
        a.stride(0), a.stride(1), w.stride(0), w.stride(2), w.stride(1), c.stride(1), c.stride(2),
        a_scale.stride(0), a_scale.stride(1), w_scale.stride(0), w_scale.stride(2), w_scale.stride(1), 0, 0,
        BLOCK[0], BLOCK[1],
        MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, compute_type=_compute_type(c.dtype), use_fp8_w8a8=True,
        use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False, HAS_BIAS=False, **meta)


class PeerExperts:
    """The experts op around the peer kernel on one copy of the weights (``w13`` ``[E, 2I, H]``, ``w2``
    ``[E, H, I]`` fp8 with their block scales): ``bind(m, top_k, config)`` returns ``launch(x, topk_weights, topk_ids)``."""

    def __init__(self, peer: ModuleType, w13: Any, s13: Any, w2: Any, s2: Any) -> None:
        self.kernel = peer.fused_moe_kernel
        self.w13, self.s13 = w13.contiguous(), s13.contiguous()
        self.w2, self.s2 = w2.contiguous(), s2.contiguous()
        self.experts, two_i, self.hidden = w13.shape
        self.inter = two_i // 2
        self._quantizer: Any = None

    def bind(self, m: int, top_k: int, config: Mapping[str, int]) -> Callable[[Any, Any, Any], Any]:
        """The call for ``m`` tokens of ``top_k`` experts each (sizes fixed, so it captures into a CUDA graph)."""
        import torch

        from fp8select.kernels.moe_routing import block_capacity
        from fp8select.kernels.quant import ROW_MAJOR
        from fp8select.kernels.triton_quant import TritonQuantizer

        meta = launch_meta(config)
        device = self.w13.device
        if self._quantizer is None:
            self._quantizer = TritonQuantizer(self.hidden, dtype=self.w13.dtype, layout=ROW_MAJOR, device=device)
        rows = block_capacity(m * top_k, self.experts, meta["BLOCK_SIZE_M"]) * meta["BLOCK_SIZE_M"]
        num_post = torch.full((1,), rows, dtype=torch.int32, device=device)
        return functools.partial(self._call, meta=meta, num_post=num_post)

    def _call(self, x: Any, topk_weights: Any, topk_ids: Any, *, meta: Mapping[str, int], num_post: Any) -> Any:
        import torch

        from fp8select.kernels.moe_routing import route
        from fp8select.kernels.moe_triton import silu_mul_quant

        m, k = topk_ids.shape
        routing = route(topk_ids, self.experts, meta["BLOCK_SIZE_M"])
        a, a_scale = self._quantizer(x)
        gate_up = torch.empty((m, k, 2 * self.inter), dtype=x.dtype, device=x.device)
        _peer_gemm(self.kernel, a, a_scale, self.w13, self.s13, gate_up, None, routing, num_post, k, False, meta)
        q, q_scale = silu_mul_quant(gate_up.view(m * k, 2 * self.inter), self.w2.dtype)
        down = torch.empty((m, k, self.hidden), dtype=x.dtype, device=x.device)
        _peer_gemm(self.kernel, q, q_scale, self.w2, self.s2, down, topk_weights.contiguous(), routing, num_post, 1,
                   True, meta)
        return torch.sum(down, dim=1)


# -- the measurement ----------------------------------------------------------------------------------------------


def _rel(out: Any, ref: Any) -> float:
    diff = out.double() - ref.double()
    if not bool(diff.isfinite().all()):
        return math.inf
    return float(diff.norm() / ref.double().norm().clamp_min(1e-30))


def check_failures(row: Mapping[str, Any]) -> list[str]:
    """Why a point's outputs are not fit to time (empty: fit): each column within :data:`REL_ERR_MAX` of its
    own fp64 semantics (the peer's with both GEMMs' outputs rounded to bf16, which it writes), and the two
    within :data:`MUTUAL_ERR_MAX` of each other."""
    checks = (("fp8select vs fp64", row["fp8select"].get("rel_err_vs_fp64"), REL_ERR_MAX),
              ("vLLM vs fp64 with bf16 GEMM outputs", row["peer"].get("rel_err_vs_fp64_bf16_gemm_outputs"), REL_ERR_MAX),
              ("fp8select vs vLLM", row.get("rel_err"), MUTUAL_ERR_MAX))
    return [f"{what} {err:.3e} >= {limit}" if isinstance(err, float) else f"{what}: no error computed"
            for what, err, limit in checks if not (isinstance(err, float) and err < limit)]


def fp8select_config(backend: Any, table_rows: Mapping[Any, Mapping[str, Any]], problem: Any, m: int) -> tuple[Any, str]:
    """fp8select's Triton configuration for ``m`` tokens: the table's measured row for its bucket, else the rule."""
    import dataclasses

    from fp8select.buckets import m_bucket

    bucket = m_bucket(m)
    row = table_rows.get(bucket, table_rows.get(str(bucket)))
    if isinstance(row, Mapping) and row.get("config") is not None:
        return backend.launch_config(row["config"]), f"measured row of the table (bucket {bucket}, {row.get('us')} us)"
    return backend.default_config(dataclasses.replace(problem, m=m), "sorted", bucket), f"default rule (bucket {bucket})"


def measure_shape(selection: Any, peer: ModuleType, peer_dir: Path, name: str, shape: tuple[int, int, int, int],
                  ms: Sequence[int], replays: int, deadline: float, device_name: str,
                  device: str = "cuda") -> tuple[list[dict[str, Any]], str]:
    """One shape's rows (and a note when ``deadline`` stopped it). ``device`` other than CUDA (the CPU tests,
    under the interpreter, with the clock faked) runs one copy of the weights."""
    import torch

    from benchmarks.moe import reference64
    from fp8select.backends.moe import MoeProblem, MoeWeights
    from fp8select.kernels.moe_routing import uniform_routing
    from fp8select.measure.timing import time_graphs
    from fp8select.measure.tune_moe import random_experts, weight_copies
    from fp8select.moe_select import moe_chain, moe_measurements

    e, h, i, k = shape
    caps = selection.capabilities
    chain = moe_chain(selection)
    triton_moe = next((b for b in chain if b.name == "triton"), None)
    if triton_moe is None:
        return [{"shape": name, "error": "fp8select's Triton MoE backend is not in this selection's MoE chain"}], ""
    table = moe_measurements(selection, chain, selection.tables)
    table_rows = (table.times(e, h, i, k) if table is not None else {}).get("triton/sorted", {})
    configs, file_name = load_configs(peer_dir, e, i, device_name)
    problem = MoeProblem(e, h, i, k)
    gen = torch.Generator(device=device).manual_seed(1)
    copies = weight_copies(e, h, i, k) if device == "cuda" else 1  # rotated past a GPU's L2 only
    sets = [random_experts(e, h, i, device, gen) for _ in range(copies)]
    ours_prepared = [triton_moe.prepare(MoeWeights(*w, BLOCK), caps) for w in sets]
    theirs_prepared = [PeerExperts(peer, *w) for w in sets]
    rows: list[dict[str, Any]] = []
    for m in ms:
        if time.monotonic() > deadline:
            return rows, f"stopped at {name} M {m}: --budget-s spent"
        config, config_from = fp8select_config(triton_moe, table_rows, problem, m)
        pconfig, pconfig_from = peer_config(configs, m, file_name)
        row: dict[str, Any] = {"shape": name, "E": e, "H": h, "I": i, "k": k, "m": m, "routing": "uniform",
                               "fp8select": {"config": config.to_dict(), "config_from": config_from},
                               "peer": {"config": pconfig, "config_from": pconfig_from}}
        rows.append(row)
        weights, ids = uniform_routing(m, k, e, device, gen)
        x = torch.randn(m, h, generator=gen, device=device).to(torch.bfloat16)
        try:
            ours = [triton_moe.bind(p, "sorted", config, caps) for p in ours_prepared]
            theirs = [p.bind(m, k, pconfig) for p in theirs_prepared]
            y_ours, y_theirs = ours[0](x, weights, ids), theirs[0](x, weights, ids)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a tool: record and go on
            row["error"] = repr(exc)[:400]
            continue
        ref = reference64(x, *sets[0], weights, ids)
        ref_bf16 = reference64(x, *sets[0], weights, ids, gemm_out=torch.bfloat16)
        row["rel_err"] = _rel(y_ours, y_theirs)
        row["fp8select"]["rel_err_vs_fp64"] = _rel(y_ours, ref)
        row["peer"]["rel_err_vs_fp64"] = _rel(y_theirs, ref)
        row["peer"]["rel_err_vs_fp64_bf16_gemm_outputs"] = _rel(y_theirs, ref_bf16)
        failed = check_failures(row)
        if failed:
            row["error"] = "; ".join(failed) + "; not timed"
            continue
        errors: dict[str, str] = {}
        times = time_graphs({"fp8select": [functools.partial(run, x, weights, ids) for run in ours],
                             "peer": [functools.partial(run, x, weights, ids) for run in theirs]},
                            replays=replays, errors=errors)
        for col, t in times.items():
            row[col].update(t.to_dict())
        if errors:
            row["error"] = "; ".join(f"{col}: {err[:300]}" for col, err in errors.items())
        if len(times) == 2:
            row["ratio"] = round(times["fp8select"].median_us / times["peer"].median_us, 4)
        print(f"moe_peer: {name} M {m}: fp8select {row['fp8select'].get('median_us')} us, vLLM "
              f"{row['peer'].get('median_us')} us, ratio {row.get('ratio')}, rel err {row['rel_err']:.2e}", flush=True)
    return rows, ""


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """fp8select's median over the peer's at each timed point: geomean, worst (largest) and where, how many
    points fp8select is at least as fast."""
    timed = [r for r in rows if isinstance(r.get("ratio"), int | float)]
    untimed = [f"{r['shape']} M {r.get('m')}: {r['error']}" for r in rows if "error" in r and "ratio" not in r]
    if not timed:
        return {"points": 0, "geomean_ratio": None, "worst_ratio": None, "worst_at": None, "at_least_as_fast": 0,
                "untimed": untimed}
    worst = max(timed, key=lambda r: r["ratio"])
    return {"points": len(timed),
            "geomean_ratio": geomean(r["ratio"] for r in timed),
            "worst_ratio": worst["ratio"], "worst_at": f"{worst['shape']} M {worst['m']}",
            "at_least_as_fast": sum(r["ratio"] <= 1.0 for r in timed), "untimed": untimed}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    require_cuda("moe_peer")
    import torch
    import triton

    import fp8select

    start = time.monotonic()
    peer = load_peer(args.peer)
    source = args.peer / "SOURCE.txt"
    device_name = vllm_device_name(torch.cuda.get_device_name())
    selection = fp8select.resolve(plugins=False)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "vllm_device_name": device_name, "torch": torch.__version__,
        "triton": triton.__version__, "fp8select": fp8select.__version__,
        "peer_source": source.read_text(encoding="utf-8") if source.is_file() else None,
        "method": "whole experts op, CUDA graphs, replays interleaved; ratio = fp8select median / vLLM median",
        "rows": [], "notes": []}
    deadline = start + args.budget_s
    for name, shape in args.shapes.items():
        rows, note = measure_shape(selection, peer, args.peer, name, shape, args.m, args.replays, deadline, device_name)
        torch.cuda.empty_cache()  # the shape's weights are gone with measure_shape's frame
        report["rows"] += rows
        if note:
            report["notes"].append(note)
            break
    report["summary"] = summarize(report["rows"])
    report["seconds"] = round(time.monotonic() - start, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_peer.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    s = report["summary"]
    print(f"moe_peer: {s['points']} points, fp8select / vLLM geomean {s['geomean_ratio']}, worst {s['worst_ratio']} "
          f"({s['worst_at']}), fp8select at least as fast at {s['at_least_as_fast']}; {out / 'moe_peer.json'}")


if __name__ == "__main__":
    main()
