"""Bad input at every surface gets a typed error naming the parameter, what was expected and found.

One table, one row per malformed case: the surface it enters through, the call, the error
type, and fragments the message must contain (the parameter, and the expected / found sides).
``docs/errors.md`` lists the same cases by id (a test keeps the two in step). A second table
holds inputs that look unusual but are valid and must simply work.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from fp64_reference import expected, quantize_groups, random_problem, rel_err
from matrix import MATRIX
from plugin_dist import install_distribution

from fp8select import (
    BackendRejectedError,
    BatchInvariantError,
    Capabilities,
    CapabilitiesError,
    InvalidDtypeError,
    InvalidInputError,
    Selection,
    UnknownBackendError,
    UnsupportedProblemError,
    resolve,
)
from fp8select.cli import main
from fp8select.decision import choose
from fp8select.plugins import PluginWarning

CPU = MATRIX["cpu-only"][0]
CPU_TRITON = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",), packages={"triton": "3.9.0"},
                          env={"TRITON_INTERPRET": "1"})
H200 = MATRIX["h200-torch2.11"][0]
DEEPGEMM = MATRIX["h200-deepgemm"][0]
N, K = 256, 384
E4M3 = torch.float8_e4m3fn


def _sel(caps: Capabilities = CPU, **kw: Any) -> Selection:
    return resolve(caps, plugins=False, **kw)


def _w() -> torch.Tensor:
    return random_problem(N, K, seed=1)[0]


def _s(shape: tuple[int, ...] = (2, 3), fill: float | None = None) -> torch.Tensor:
    s = torch.rand(*shape) + 0.5
    return s if fill is None else s.fill_(fill)


def _layer(out_dtype: torch.dtype | None = None) -> Any:
    return _sel().prepare(_w(), _s(), out_dtype=out_dtype)


def _x(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*(shape or (4, K))).to(dtype)


def _fp8_input(m: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    q, s = quantize_groups(torch.randn(m, K))
    return q.contiguous(), s.to(torch.float32)


def _moe_weights(**change: Any) -> list[torch.Tensor]:
    """A small MoE checkpoint (E=2, H=128, I=128): w13, w13_scale, w2, w2_scale, with ``change`` applied by name."""
    w13 = random_problem(512, 128, seed=2)[0].view(2, 256, 128).clone()
    w2 = random_problem(256, 128, seed=3)[0].view(2, 128, 128).clone()
    tensors = {"w13": w13, "w13_scale": _s((2, 2, 1)), "w2": w2, "w2_scale": _s((2, 1, 1))}
    for name, fn in change.items():
        tensors[name] = fn(tensors[name])
    return list(tensors.values())


def _moe_call(x: Any = None, weights: Any = None, ids: Any = None) -> Any:
    moe = _sel().prepare_moe(*_moe_weights(), top_k=2)
    ids = torch.tensor([[0, 1], [1, -1], [0, 1]], dtype=torch.int32) if ids is None else ids
    return moe(_x(3, 128) if x is None else x, torch.rand(3, 2) if weights is None else weights, ids)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@dataclass(frozen=True)
class Case:
    id: str
    surface: str
    call: Callable[[], object]
    error: type[Exception]
    fragments: tuple[str, ...]


CASES: tuple[Case, ...] = (
    # --- resolve() -------------------------------------------------------------------------------
    Case("resolve-unknown-backend", "resolve", lambda: _sel(backend="cublas"), UnknownBackendError,
         ("backend:", "unknown backend 'cublas'", "valid names: deepgemm")),
    Case("resolve-unknown-disabled", "resolve", lambda: _sel(disable=["cublas"]), UnknownBackendError,
         ("disable:", "'cublas'", "valid names")),
    Case("resolve-unknown-in-order", "resolve", lambda: _sel(order=["reference", "fast"]), UnknownBackendError,
         ("order:", "'fast'", "valid names")),
    Case("resolve-empty-order", "resolve", lambda: _sel(order=[]), InvalidInputError,
         ("order:", "expected at least one backend name", "found []")),
    Case("resolve-unknown-env-backend", "resolve",
         lambda: _sel(Capabilities(torch_version="2.13.0", env={"FP8SELECT_BACKEND": "cublas"})), UnknownBackendError,
         ("FP8SELECT_BACKEND:", "'cublas'")),
    Case("resolve-unknown-env-disable", "resolve",
         lambda: _sel(Capabilities(torch_version="2.13.0", env={"FP8SELECT_DISABLE": "triton,cublas"})),
         UnknownBackendError, ("FP8SELECT_DISABLE:", "'cublas'")),
    Case("resolve-rejected-explicit", "resolve", lambda: _sel(backend="deepgemm"), BackendRejectedError,
         ("'deepgemm' was requested (argument)", "requires device cuda, found cpu")),
    Case("resolve-capabilities-dict", "resolve", lambda: resolve({"device_kind": "cpu"}), InvalidDtypeError,  # type: ignore[arg-type]
         ("capabilities:", "expected a Capabilities snapshot", "found dict")),
    Case("resolve-backend-not-str", "resolve", lambda: _sel(backend=3), InvalidDtypeError,
         ("backend:", "expected a backend name", "found 3")),
    Case("resolve-disable-not-names", "resolve", lambda: _sel(disable=5), InvalidDtypeError,
         ("disable:", "expected backend names", "found 5")),
    Case("resolve-plugins-str", "resolve", lambda: resolve(CPU, plugins="yes"), InvalidDtypeError,  # type: ignore[arg-type]
         ("plugins:", "expected True, False or an iterable", "found 'yes'")),
    Case("resolve-verify-not-bool", "resolve", lambda: _sel(verify="on"), InvalidDtypeError,
         ("verify:", "expected True, False or None", "found 'on'")),
    Case("resolve-on-mismatch", "resolve", lambda: _sel(on_mismatch="vote"), InvalidInputError,
         ("on_mismatch:", "expected 'common' or 'raise'", "found 'vote'")),
    Case("resolve-batch-invariant-not-bool", "resolve", lambda: _sel(batch_invariant="yes"), InvalidDtypeError,
         ("batch_invariant:", "expected True, False or None", "found 'yes'")),
    Case("resolve-batch-invariant-env", "resolve",
         lambda: _sel(Capabilities(torch_version="2.13.0", env={"FP8SELECT_BATCH_INVARIANT": "maybe"})), InvalidInputError,
         ("FP8SELECT_BATCH_INVARIANT:", "expected 1 or 0", "found 'maybe'")),
    Case("resolve-batch-invariant-none-known", "resolve", lambda: _sel(H200, verify=False, batch_invariant=True),
         BatchInvariantError, ("no backend runs any layer on NVIDIA H200 batch-invariant here",
                               "cuda-scaled-mm: rejected: no batch-invariance record", "benchmarks.invariance")),
    Case("choose-unknown-order", "resolve", lambda: choose(CPU, {}, ["reference"]), UnknownBackendError,
         ("order:", "'reference'")),
    # names as typed: case, blanks and the engines' spellings are accepted, the rest named in canonical form
    Case("resolve-alias-rejected", "resolve", lambda: _sel(backend=" Deep_GEMM "), BackendRejectedError,
         ("'deepgemm' was requested (argument)", "requires device cuda, found cpu")),
    Case("resolve-unknown-backend-any-case", "resolve", lambda: _sel(backend=" CUBLAS "), UnknownBackendError,
         ("backend:", "unknown backend 'cublas'")),
    Case("resolve-disable-auto", "resolve", lambda: _sel(disable="auto"), UnknownBackendError,
         ("disable:", "unknown backend 'auto'")),
    Case("resolve-env-alias-rejected", "resolve",
         lambda: _sel(Capabilities(torch_version="2.13.0", env={"FP8SELECT_BACKEND": "DEEP-GEMM"})), BackendRejectedError,
         ("'deepgemm' was requested (environment)",)),
    Case("resolve-plugin-timeout-env", "resolve",
         lambda: resolve(Capabilities(torch_version="2.13.0", env={"FP8SELECT_PLUGIN_TIMEOUT_S": "soon"})), InvalidInputError,
         ("FP8SELECT_PLUGIN_TIMEOUT_S:", "expected a positive number of seconds", "found 'soon'")),
    Case("resolve-plugin-timeout-negative", "resolve",
         lambda: resolve(Capabilities(torch_version="2.13.0", env={"FP8SELECT_PLUGIN_TIMEOUT_S": "-1"})), InvalidInputError,
         ("FP8SELECT_PLUGIN_TIMEOUT_S:", "found '-1'")),
    # --- snapshot JSON / overrides -----------------------------------------------------------------
    Case("snapshot-truncated", "snapshot", lambda: Capabilities.from_json(H200.to_json()[:60]), CapabilitiesError,
         ("snapshot:", "not valid JSON")),
    Case("snapshot-empty", "snapshot", lambda: Capabilities.from_json(""), CapabilitiesError, ("snapshot:", "not valid JSON")),
    Case("snapshot-not-utf8", "snapshot", lambda: Capabilities.from_json(b"\xff\xfe{}"), CapabilitiesError,  # type: ignore[arg-type]
         ("snapshot:", "not valid JSON")),
    Case("snapshot-too-deep", "snapshot", lambda: Capabilities.from_json(_nested(100_000)), CapabilitiesError,
         ("snapshot:", "not valid JSON")),
    Case("snapshot-not-object", "snapshot", lambda: Capabilities.from_json("[1, 2]"), CapabilitiesError,
         ("snapshot:", "expected a JSON object", "found list")),
    Case("snapshot-unknown-key", "snapshot", lambda: Capabilities.from_dict({"gpu": "h200"}), CapabilitiesError,
         ("unknown key(s) gpu", "valid keys")),
    Case("snapshot-non-string-key", "snapshot", lambda: Capabilities.from_dict({1: 2}), CapabilitiesError,  # type: ignore[dict-item]
         ("unknown key(s) 1",)),
    Case("snapshot-device-kind", "snapshot", lambda: Capabilities.from_dict({"device_kind": "tpu"}), CapabilitiesError,
         ("device_kind:", "expected one of cuda, rocm, xpu, npu, cpu", "found 'tpu'")),
    Case("snapshot-compute-capability", "snapshot", lambda: Capabilities.from_dict({"compute_capability": [9]}),
         CapabilitiesError, ("compute_capability:", "expected [major, minor] or null", "found [9]")),
    Case("snapshot-torch-version-type", "snapshot", lambda: Capabilities.from_dict({"torch_version": 2.11}),
         CapabilitiesError, ("torch_version:", "expected a version string", "found 2.11")),
    Case("snapshot-package-version-type", "snapshot", lambda: Capabilities.from_dict({"packages": {"triton": 3}}),
         CapabilitiesError, ("packages:", "expected an object of strings", "found {'triton': 3}")),
    Case("snapshot-functional-type", "snapshot", lambda: Capabilities.from_dict({"functional": {"x": "yes"}}),
         CapabilitiesError, ("functional:", "expected an object of true/false", "'yes'")),
    Case("snapshot-list-field-type", "snapshot", lambda: Capabilities.from_dict({"scaling_types": "RowWise"}),
         CapabilitiesError, ("scaling_types:", "expected a list of strings", "found 'RowWise'")),
    Case("snapshot-npu-soc-type", "snapshot", lambda: Capabilities.from_dict({"npu_soc_version": True}),
         CapabilitiesError, ("npu_soc_version:", "expected a non-negative integer or null", "found True")),
    # numbers too long to read or print: Python refuses more than 4300 digits (a bare ValueError before)
    Case("snapshot-5000-digit-integer", "snapshot",
         lambda: Capabilities.from_json('{"compute_capability": [%s, 0]}' % ("9" * 5000)), CapabilitiesError,
         ("snapshot:", "not valid JSON", "a number longer than 4300 digits")),
    Case("snapshot-huge-compute-capability", "snapshot", lambda: Capabilities.from_dict({"compute_capability": [10**5000, 0]}),
         CapabilitiesError, ("compute_capability:", "integers 0 to 999", "found (<an integer of about 5001 digits>, 0)")),
    Case("snapshot-negative-compute-capability", "snapshot", lambda: Capabilities.from_json('{"compute_capability": [-9, 0]}'),
         CapabilitiesError, ("compute_capability:", "integers 0 to 999", "found (-9, 0)")),
    Case("snapshot-huge-npu-soc", "snapshot", lambda: Capabilities.from_dict({"npu_soc_version": 10**5000}),
         CapabilitiesError, ("npu_soc_version:", "a non-negative integer or null")),
    Case("snapshot-nan", "snapshot", lambda: Capabilities.from_json('{"npu_soc_version": NaN}'), CapabilitiesError,
         ("npu_soc_version:", "found nan")),
    Case("snapshot-blank-torch-version", "snapshot", lambda: Capabilities.from_json('{"torch_version": "   "}'),
         CapabilitiesError, ("torch_version:", "expected a version string", "found '   '")),
    Case("snapshot-mapping-null", "snapshot", lambda: Capabilities.from_json('{"env": null}'), CapabilitiesError,
         ("env:", "expected an object of strings", "found None")),
    Case("snapshot-json-not-text", "snapshot", lambda: Capabilities.from_json(5), CapabilitiesError,  # type: ignore[arg-type]
         ("snapshot:", "not valid JSON")),
    Case("snapshot-constructor-env-value", "snapshot", lambda: Capabilities(env={"FP8SELECT_BACKEND": 1}),  # type: ignore[dict-item]
         CapabilitiesError, ("env:", "expected an object of strings")),
    Case("override-unknown-key", "snapshot", lambda: CPU.with_overrides({"gpu": "h200"}), CapabilitiesError,
         ("--set gpu:", "unknown key", "valid keys")),
    Case("override-entry-of-scalar", "snapshot", lambda: CPU.with_overrides({"torch_version.x": "1"}), CapabilitiesError,
         ("--set torch_version.x:", "has no entries")),
    # a version typed in a what-if must be a version (a typo would reject every version gate, silently)
    Case("override-torch-version-not-pep440", "snapshot", lambda: CPU.with_overrides({"torch_version": "banana"}),
         CapabilitiesError, ("--set torch_version:", "expected a PEP 440 version", "found 'banana'")),
    Case("override-package-version-not-pep440", "snapshot", lambda: CPU.with_overrides({"packages.triton": "3.x"}),
         CapabilitiesError, ("--set packages.triton:", "expected a PEP 440 version", "found '3.x'")),
    Case("override-toolkit-version", "snapshot", lambda: CPU.with_overrides({"cuda_version": "cuda13"}),
         CapabilitiesError, ("--set cuda_version:", "expected a version starting with its release number", "found 'cuda13'")),
    Case("override-5000-digit-value", "snapshot",
         lambda: CPU.with_overrides({"compute_capability": "[%s, 0]" % ("9" * 5000)}), CapabilitiesError,
         ("compute_capability:", "expected [major, minor]", "...")),
    Case("override-not-a-mapping", "snapshot", lambda: CPU.with_overrides("device_kind=cuda"), CapabilitiesError,  # type: ignore[arg-type]
         ("overrides:", "expected a mapping of KEY to VALUE strings", "found 'device_kind=cuda'")),
    Case("override-value-not-string", "snapshot", lambda: CPU.with_overrides({"device_kind": 5}), CapabilitiesError,  # type: ignore[dict-item]
         ("overrides:", "expected a mapping of KEY to VALUE strings", "found {'device_kind': 5}")),
    # --- prepare(): the weight, its scale and the block size ---------------------------------------
    Case("weight-not-fp8", "prepare", lambda: _sel().prepare(torch.randn(N, K, dtype=torch.bfloat16), _s()),
         InvalidDtypeError, ("weight:", "expected dtype float8_e4m3fn/float8_e4m3fnuz", "found bfloat16")),
    Case("weight-e5m2", "prepare", lambda: _sel().prepare(_w().to(torch.float8_e5m2), _s()), InvalidDtypeError,
         ("weight:", "expected dtype float8_e4m3fn", "found float8_e5m2")),
    Case("weight-not-tensor", "prepare", lambda: _sel().prepare(_w().tolist(), _s()), InvalidDtypeError,  # type: ignore[arg-type]
         ("weight:", "expected a torch.Tensor", "found list")),
    Case("weight-3d", "prepare", lambda: _sel().prepare(_w().reshape(2, 128, K), _s()), InvalidInputError,
         ("weight:", "expected a 2-D [N, K] tensor", "found shape (2, 128, 384)")),
    Case("weight-empty", "prepare", lambda: _sel().prepare(_w()[:0], _s((0, 3))), InvalidInputError,
         ("weight:", "expected N > 0 and K > 0", "found shape (0, 384)")),
    Case("weight-empty-k", "prepare", lambda: _sel().prepare(_w()[:, :0], _s((2, 0))), InvalidInputError,
         ("weight:", "expected N > 0 and K > 0", "found shape (256, 0)")),
    Case("weight-sparse", "prepare", lambda: _sel().prepare(torch.randn(N, K, dtype=torch.bfloat16).to_sparse(), _s()),
         InvalidInputError, ("weight:", "expected a dense (strided) tensor", "found layout torch.sparse_coo")),
    Case("weight-scale-sparse", "prepare", lambda: _sel().prepare(_w(), _s().to_sparse()), InvalidInputError,
         ("weight_scale:", "expected a dense (strided) tensor", "found layout torch.sparse_coo")),
    Case("prepare-max-weight-copies", "prepare", lambda: _sel().prepare(_w(), _s(), max_weight_copies=-1), InvalidInputError,
         ("max_weight_copies:", "expected a non-negative integer or None", "found -1")),
    Case("prepare-max-weight-copies-bool", "prepare", lambda: _sel().prepare(_w(), _s(), max_weight_copies=True),
         InvalidInputError, ("max_weight_copies:", "expected a non-negative integer or None", "found True")),
    Case("resolve-tuning-malformed", "resolve",
         lambda: _sel(tuning={"schema": 2, "device_name": "x", "groups": [{"backend": "triton", "versions": {},
                                                                         "shapes": {"256,384": {"8": {"us": "fast"}}}}]}),
         InvalidInputError, ("tuning:", "expected a tuning table", ".us: expected a positive finite number", "found 'fast'")),
    Case("resolve-tuning-old-schema", "resolve",
         lambda: _sel(tuning={"schema": 1, "fingerprint": "f", "device_name": "x", "versions": {},
                              "entries": {"256,384": {"8": {"backend": "triton", "config": {"BLOCK_M": "x"}, "us": 1}}}}),
         InvalidInputError, ("tuning:", "expected a tuning table (schema 2)", "found a malformed one")),
    Case("weight-on-meta", "prepare", lambda: _sel().prepare(_w().to("meta"), _s().to("meta")), InvalidInputError,
         ("weight:", "expected a tensor holding data", "meta")),
    Case("scale-shape", "prepare", lambda: _sel().prepare(_w(), _s((3, 2))), InvalidInputError,
         ("weight_scale:", "expected shape [ceil(N/128), ceil(K/128)] = [2, 3]", "found [3, 2]")),
    Case("scale-shape-for-block", "prepare", lambda: _sel().prepare(_w(), _s(), [1, 128]), InvalidInputError,
         ("weight_scale:", "= [256, 3]", "block_size [1, 128]", "found [2, 3]")),
    Case("scale-floor-k-blocks", "prepare",
         lambda: _sel().prepare(random_problem(N, 200, seed=2)[0], _s((2, 1))), InvalidInputError,
         ("weight_scale:", "ceil(K/128)", "= [2, 2]", "found [2, 1]")),
    Case("scale-dtype", "prepare", lambda: _sel().prepare(_w(), _s().half()), InvalidDtypeError,
         ("weight_scale:", "expected dtype float32", "found float16")),
    Case("scale-nan", "prepare", lambda: _sel().prepare(_w(), _s(fill=float("nan"))), InvalidInputError,
         ("weight_scale:", "expected finite values", "found 6 NaN/inf")),
    Case("scale-inf", "prepare", lambda: _sel().prepare(_w(), _s().index_fill_(1, torch.tensor([2]), float("inf"))),
         InvalidInputError, ("weight_scale:", "expected finite values", "found 2 NaN/inf")),
    Case("scale-other-device", "prepare", lambda: _sel().prepare(_w(), _s().to("meta")), InvalidInputError,
         ("weight_scale:", "expected device cpu", "found meta")),
    Case("scale-none", "prepare", lambda: _sel().prepare(_w(), None), InvalidDtypeError,  # type: ignore[arg-type]
         ("weight_scale:", "expected a torch.Tensor", "found NoneType")),
    Case("scale-not-tensor", "prepare", lambda: _sel().prepare(_w(), _s().tolist()), InvalidDtypeError,  # type: ignore[arg-type]
         ("weight_scale:", "expected a torch.Tensor", "found list")),
    Case("block-one-int", "prepare", lambda: _sel().prepare(_w(), _s(), 128), InvalidDtypeError,  # type: ignore[arg-type]
         ("block_size:", "expected two positive integers", "found 128")),
    Case("block-three-ints", "prepare", lambda: _sel().prepare(_w(), _s(), [1, 128, 128]), InvalidDtypeError,
         ("block_size:", "expected two positive integers", "found [1, 128, 128]")),
    Case("block-floats", "prepare", lambda: _sel().prepare(_w(), _s(), [128.0, 128.0]), InvalidDtypeError,  # type: ignore[list-item]
         ("block_size:", "expected two positive integers", "found [128.0, 128.0]")),
    Case("block-zero", "prepare", lambda: _sel().prepare(_w(), _s(), [0, 128]), InvalidInputError,
         ("block_size:", "expected two positive integers", "found [0, 128]")),
    Case("block-mxfp8", "prepare", lambda: _sel().prepare(_w(), _s((256, 12)), [1, 32]), UnsupportedProblemError,
         ("block [1, 32]", "requires block size [128, 128], [1, 128], found [1, 32]")),
    Case("block-unsupported-by-choice", "prepare",
         lambda: _sel(H200, backend="cuda-scaled-mm", disable="triton,reference").prepare(_w(), _s((256, 48)), [1, 8]),
         UnsupportedProblemError, ("cuda-scaled-mm: rejected: requires block size", "found [1, 8]")),
    Case("k-not-aligned-for-choice", "prepare",
         lambda: _sel(H200, backend="cuda-scaled-mm", disable="triton,reference").prepare(
             random_problem(N, 200, seed=3)[0], _s((2, 2))),
         UnsupportedProblemError, ("cuda-scaled-mm: rejected: requires K % 16 == 0, found K=200",)),
    Case("out-dtype-int", "prepare", lambda: _sel().prepare(_w(), _s(), out_dtype=torch.int8), InvalidDtypeError,
         ("out_dtype:", "expected bfloat16/float16/float32 or None", "found torch.int8")),
    Case("out-dtype-str", "prepare", lambda: _sel().prepare(_w(), _s(), out_dtype="bf16"), InvalidDtypeError,  # type: ignore[arg-type]
         ("out_dtype:", "found 'bf16'")),
    # --- the layer call ----------------------------------------------------------------------------
    Case("input-not-tensor", "call", lambda: _layer()(_x().tolist()), InvalidDtypeError,
         ("input:", "expected a torch.Tensor", "found list")),
    Case("input-wrong-k", "call", lambda: _layer()(_x(4, K - 1)), InvalidInputError,
         ("input:", "expected shape [..., K=384]", "found [4, 383]")),
    Case("input-scalar", "call", lambda: _layer()(torch.tensor(1.0, dtype=torch.bfloat16)), InvalidInputError,
         ("input:", "expected shape [..., K=384]", "found []")),
    Case("input-other-device", "call", lambda: _layer()(_x().to("meta")), InvalidInputError,
         ("input:", "expected device cpu (the weight's)", "found meta")),
    Case("input-sparse", "call", lambda: _layer()(_x().to_sparse()), InvalidInputError,
         ("input:", "expected a dense (strided) tensor", "found layout torch.sparse_coo")),
    Case("input-int", "call", lambda: _layer()(torch.ones(4, K, dtype=torch.int32)), InvalidDtypeError,
         ("input:", "expected dtype bfloat16/float16/float32", "found int32")),
    Case("input-float64", "call", lambda: _layer()(_x(dtype=torch.float64)), InvalidDtypeError,
         ("input:", "found float64")),
    Case("input-fp32-unsupported", "call",
         lambda: _sel(CPU_TRITON, backend="triton", disable="reference").prepare(_w(), _s())(_x(dtype=torch.float32)),
         UnsupportedProblemError, ("input float32", "triton: rejected: requires activations bfloat16/float16, found float32")),
    Case("input-fp8-no-scale", "call", lambda: _layer(torch.bfloat16)(_fp8_input()[0]), InvalidInputError,
         ("input_scale:", "needs its per-token group scales", "found None")),
    Case("input-fp8-no-out-dtype", "call", lambda: _layer()(_fp8_input()[0], input_scale=_fp8_input()[1]), InvalidDtypeError,
         ("out_dtype:", "a pre-quantized fp8 input needs an output dtype",
          "pass out_dtype=torch.bfloat16 (or float16/float32) to prepare() or linear()")),
    Case("input-scale-shape", "call", lambda: _layer(torch.bfloat16)(_fp8_input()[0], input_scale=torch.ones(4, 2)),
         InvalidInputError, ("input_scale:", "expected float32 of shape [4, 3]", "found float32 [4, 2]")),
    Case("input-scale-not-tensor", "call",
         lambda: _layer(torch.bfloat16)(_fp8_input()[0], input_scale=_fp8_input()[1].tolist()), InvalidDtypeError,
         ("input_scale:", "expected a torch.Tensor", "found list")),
    Case("input-scale-sparse", "call",
         lambda: _layer(torch.bfloat16)(_fp8_input()[0], input_scale=_fp8_input()[1].to_sparse()), InvalidInputError,
         ("input_scale:", "expected a dense (strided) tensor", "found layout torch.sparse_coo")),
    Case("input-scale-other-device", "call",
         lambda: _layer(torch.bfloat16)(_fp8_input()[0], input_scale=_fp8_input()[1].to("meta")), InvalidInputError,
         ("input_scale:", "expected device cpu", "found meta")),
    Case("input-scale-for-bf16", "call", lambda: _layer()(_x(), input_scale=torch.ones(4, 3)), InvalidInputError,
         ("input_scale:", "only meaningful with an fp8 input", "found input dtype bfloat16")),
    Case("bias-shape", "call", lambda: _layer()(_x(), bias=torch.zeros(N + 1)), InvalidInputError,
         ("bias:", "expected shape [N=256]", "found [257]")),
    Case("bias-2d", "call", lambda: _layer()(_x(), bias=torch.zeros(1, N)), InvalidInputError,
         ("bias:", "expected shape [N=256]", "found [1, 256]")),
    Case("bias-other-device", "call", lambda: _layer()(_x(), bias=torch.zeros(N, device="meta")), InvalidInputError,
         ("bias:", "expected device cpu", "found meta")),
    Case("bias-sparse", "call", lambda: _layer()(_x(), bias=torch.zeros(N).to_sparse()), InvalidInputError,
         ("bias:", "expected a dense (strided) tensor", "found layout torch.sparse_coo")),
    Case("bias-int", "call", lambda: _layer()(_x(), bias=torch.zeros(N, dtype=torch.int64)), InvalidDtypeError,
         ("bias:", "expected a bf16/fp16/fp32 tensor", "found int64")),
    Case("bias-not-tensor", "call", lambda: _layer()(_x(), bias=[0.0] * N), InvalidDtypeError,
         ("bias:", "expected a torch.Tensor or None", "found list")),
    # --- Selection.linear (the engines' signature) -------------------------------------------------
    Case("linear-block-none", "linear", lambda: _sel().linear(_x(), _w(), None, _s()), InvalidDtypeError,  # type: ignore[arg-type]
         ("block_size:", "found None")),
    Case("linear-weight-bf16", "linear", lambda: _sel().linear(_x(), _w().bfloat16(), [128, 128], _s()), InvalidDtypeError,
         ("weight:", "found bfloat16")),
    Case("linear-scale-nan", "linear", lambda: _sel().linear(_x(), _w(), [128, 128], _s(fill=float("inf"))),
         InvalidInputError, ("weight_scale:", "expected finite values")),
    Case("linear-bias-shape", "linear", lambda: _sel().linear(_x(), _w(), [128, 128], _s(), None, torch.zeros(3)),
         InvalidInputError, ("bias:", "found [3]")),
    # --- Selection.prepare_moe() and the MoE layer's call -------------------------------------------
    Case("moe-w13-bf16", "moe", lambda: _sel().prepare_moe(*_moe_weights(w13=lambda t: t.bfloat16())),
         InvalidDtypeError, ("w13:", "expected dtype float8_e4m3fn", "found bfloat16")),
    Case("moe-w2-shape", "moe", lambda: _sel().prepare_moe(*_moe_weights(w2=lambda t: t[:, :, :64])),
         InvalidInputError, ("w2:", "expected shape [E, H, I] = [2, 128, 128]", "found [2, 128, 64]")),
    Case("moe-scale-shape", "moe", lambda: _sel().prepare_moe(*_moe_weights(w13_scale=lambda t: t[:1])),
         InvalidInputError, ("w13_scale:", "expected shape", "found [1, 2, 1]")),
    Case("moe-scale-nan", "moe", lambda: _sel().prepare_moe(*_moe_weights(w2_scale=lambda t: t.fill_(float("nan")))),
         InvalidInputError, ("w2_scale:", "expected finite values")),
    Case("moe-top-k", "moe", lambda: _sel().prepare_moe(*_moe_weights(), top_k=0), InvalidInputError,
         ("top_k:", "found 0")),
    Case("moe-id-out-of-range", "moe", lambda: _moe_call(ids=torch.tensor([[0, 2], [1, 0], [0, 1]])), InvalidInputError,
         ("topk_ids:", "expected expert ids in [0, 2) or -1", "found [2]")),
    Case("moe-id-repeated", "moe", lambda: _moe_call(ids=torch.tensor([[1, 1], [1, 0], [0, 1]])), InvalidInputError,
         ("topk_ids:", "expected distinct expert ids", "found a repeated id")),
    Case("moe-ids-float", "moe", lambda: _moe_call(ids=torch.zeros(3, 2)), InvalidDtypeError,
         ("topk_ids:", "expected dtype int32/int64", "found float32")),
    Case("moe-weights-shape", "moe", lambda: _moe_call(weights=torch.rand(3, 1)), InvalidInputError,
         ("topk_weights:", "expected shape [3, 2]", "found [3, 1]")),
    Case("moe-x-width", "moe", lambda: _moe_call(x=_x(3, 64)), InvalidInputError,
         ("x:", "expected shape [M, H=128]", "found [3, 64]")),
    Case("moe-x-int", "moe", lambda: _moe_call(x=torch.zeros(3, 128, dtype=torch.int8)), InvalidDtypeError,
         ("x:", "expected dtype", "found int8")),
)


def test_at_least_thirty_cases_and_unique_ids() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    assert {c.surface for c in CASES} == {"resolve", "snapshot", "prepare", "call", "linear", "moe"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_a_typed_error(case: Case) -> None:
    with pytest.raises(Exception) as info:  # the type is checked precisely below
        case.call()
    exc = info.value
    assert isinstance(exc, case.error), f"{case.id}: expected {case.error.__name__}, got {type(exc).__name__}: {exc}"
    assert isinstance(exc, (ValueError, TypeError, LookupError))
    assert not isinstance(exc, AssertionError) and type(exc) is not KeyError
    message = str(exc)
    for fragment in case.fragments:
        assert fragment in message, f"{case.id}: {fragment!r} not in {message!r}"


# --- the CLI: one line on stderr, exit code 2 (1 when a requested backend is rejected), no traceback ---

CLI_CASES: dict[str, tuple[list[str], int, str]] = {
    "cli-unknown-set-key": (["--set", "gpu=h200"], 2, "--set gpu: unknown key"),
    "cli-set-without-value": (["--set", "novalue"], 2, "expected KEY=VALUE"),
    "cli-set-bad-value": (["--set", "compute_capability=[9, 0, 1]"], 2, "compute_capability: expected [major, minor]"),
    "cli-set-empty-version": (["--set", "torch_version="], 2, "--set torch_version: expected a PEP 440 version"),
    "cli-unknown-backend": (["--backend", "cublas"], 2, "unknown backend 'cublas'"),
    "cli-unknown-disable": (["--disable", "reference,cublas"], 2, "unknown backend 'cublas'"),
    "cli-missing-file": (["--capabilities", "/nonexistent/snapshot.json"], 2, "cannot read"),
    "cli-directory": (["--capabilities", "{tmp}"], 2, "Is a directory"),
    "cli-truncated-file": (["--capabilities", "{tmp}/truncated.json"], 2, "not valid JSON"),
    "cli-binary-file": (["--capabilities", "{tmp}/binary.json"], 2, "expected UTF-8 JSON text"),
    "cli-deep-file": (["--capabilities", "{tmp}/deep.json"], 2, "not valid JSON"),
    "cli-list-file": (["--capabilities", "{tmp}/list.json"], 2, "expected a JSON object, found list"),
    "cli-rejected-backend": (["--backend", "deepgemm"], 1, "requires device cuda"),
    "cli-rejected-alias": (["--backend", "Deep_GEMM"], 1, "backend 'deepgemm' was requested (argument)"),
    "cli-set-torch-not-a-version": (["--set", "torch_version=banana"], 2, "--set torch_version: expected a PEP 440 version"),
    "cli-set-5000-digits": (["--set", "npu_soc_version=" + "9" * 5000], 2, "npu_soc_version: expected a non-negative integer"),
    "cli-5000-digit-file": (["--capabilities", "{tmp}/digits.json"], 2, "a number longer than 4300 digits"),
    "cli-empty-capabilities-name": (["--capabilities", ""], 2, "--capabilities: expected a file name"),
    "cli-bench-budget-nan": (["bench", "--budget-s", "nan"], 2, "--budget-s: expected a non-negative number of seconds"),
    "cli-bench-json-under-a-file": (["bench", "--json", "{tmp}/list.json/rows.json"], 2, "list.json' is not a directory"),
    "cli-tune-resume-without-force": (["tune", "--resume"], 2, "--resume: only with --force"),
    "cli-tune-out-is-a-directory": (["tune", "--out", "{tmp}"], 2, "cannot write the tuning table (--out)"),
    "cli-tune-out-not-a-regular-file": (["tune", "--out", os.devnull], 2, "it is not a regular file"),
    "cli-tune-out-under-a-file": (["tune", "--out", "{tmp}/list.json/table.json"], 2, "list.json' is not a directory"),
    "cli-tune-json-under-a-file": (["tune", "--out", "{tmp}/table.json", "--json", "{tmp}/list.json/rows.json"], 2,
                                   "cannot write the timings (--json)"),
}
SUBCOMMANDS = ("probe", "explain", "bench", "tune")


@pytest.fixture
def snapshot_files(tmp_path: Path) -> Path:
    (tmp_path / "truncated.json").write_text(H200.to_json()[:70])
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00\x01")
    (tmp_path / "deep.json").write_text(_nested(100_000))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "digits.json").write_text('{"compute_capability": [%s, 0]}' % ("9" * 5000))
    return tmp_path


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_bad_input_is_one_line(case: str, snapshot_files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, code, fragment = CLI_CASES[case]
    argv = [a.replace("{tmp}", str(snapshot_files)) for a in argv]
    assert main(argv if argv[0] in SUBCOMMANDS else ["explain", "--no-plugins", *argv]) == code
    _, err = capsys.readouterr()
    assert fragment in err and "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    else:  # a rejected choice: the error once, then every verdict once
        assert err.count("was requested") == 1 and err.count("reference:") == 1, err


def test_cli_unknown_command_is_argparse_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("block", [None, 128])
def test_block_size_is_checked_before_load_time_measurement(block: object) -> None:
    """A CUDA weight that would be measured at load time gets the block size's typed error too (``prepare`` compared
    ``tuple(block_size)`` first: a bare TypeError). No GPU: a tensor that says it is on CUDA stands in."""
    class LooksCuda(torch.Tensor):
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    with pytest.raises(InvalidDtypeError, match="block_size: expected two positive integers"):
        _sel().prepare(_w().as_subclass(LooksCuda), _s(), block, tune=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "k"), [(0, 384), (-256, 384), (256.5, 384), ("256", 384), (True, 384), (256, 0)])
def test_plan_for_takes_positive_integer_sizes(n: object, k: object) -> None:
    with pytest.raises(InvalidInputError, match="expected a positive integer"):
        _sel().plan_for(n, k)  # type: ignore[arg-type]


def test_every_error_class_is_exported() -> None:
    """``except fp8select.XError`` works for every error class fp8select raises."""
    import fp8select
    from fp8select import errors

    classes = [name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.Fp8SelectError)]
    assert len(classes) > 5
    assert [name for name in classes if getattr(fp8select, name, None) is not getattr(errors, name)] == []
    assert set(classes) <= set(fp8select.__all__)


def test_docs_list_every_case() -> None:
    text = (Path(__file__).parent.parent / "docs" / "errors.md").read_text(encoding="utf-8")
    missing = [c for c in [*(c.id for c in CASES), *CLI_CASES, *PLUGIN_CASES, *VALID] if f"`{c}`" not in text]
    assert not missing, f"docs/errors.md does not list: {missing}"


# --- unusual but valid: these must simply work, with the right numbers -------------------------------

def _check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int] = (128, 128),
           **kw: Any) -> None:
    assert out.shape == (*x.shape[:-1], w.shape[0])
    if out.numel():
        assert rel_err(out, expected(x.contiguous(), w, s, block, **kw)) < 1e-2


def _empty_batch() -> None:
    w, s = random_problem(N, K, seed=4)
    out = _sel().prepare(w, s)(torch.empty(0, K, dtype=torch.bfloat16))
    assert out.shape == (0, N) and out.dtype == torch.bfloat16


def _empty_batch_3d_bias() -> None:
    w, s = random_problem(N, K, seed=5)
    out = _sel().prepare(w, s)(torch.empty(2, 0, K, dtype=torch.float16), bias=torch.zeros(N, dtype=torch.float16))
    assert out.shape == (2, 0, N) and out.dtype == torch.float16


def _empty_batch_prequantized() -> None:
    w, s = random_problem(N, K, seed=6)
    out = _sel().prepare(w, s, out_dtype=torch.bfloat16)(torch.empty(0, K, dtype=E4M3), input_scale=torch.empty(0, 3))
    assert out.shape == (0, N)


def _lead_dims(*lead: int) -> Callable[[], None]:
    def run() -> None:
        w, s = random_problem(N, K, seed=7)
        x = torch.randn(*lead, K, dtype=torch.bfloat16)
        _check(_sel().prepare(w, s)(x), x, w, s)

    return run


def _no_copies() -> None:
    w, s = random_problem(N, K, seed=12)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    _check(_sel().prepare(w, s, max_weight_copies=0)(x), x, w, s)


def _transposed() -> None:
    w, s = random_problem(N, K, seed=8)
    x = torch.randn(K, 5, dtype=torch.bfloat16).t()
    assert not x.is_contiguous()
    _check(_sel().prepare(w, s)(x), x, w, s)


def _sliced_3d() -> None:
    w, s = random_problem(N, K, seed=9)
    x = torch.randn(3, 4, 2 * K, dtype=torch.bfloat16)[:, ::2, K // 2: K // 2 + K]
    assert not x.is_contiguous()
    _check(_sel().prepare(w, s)(x), x, w, s)


def _broadcast_rows() -> None:
    w, s = random_problem(N, K, seed=10)
    x = torch.randn(1, K, dtype=torch.bfloat16).expand(6, K)
    _check(_sel().prepare(w, s)(x), x, w, s)


def _partial_k_block() -> None:
    w, s = random_problem(N, 200, seed=11)  # K=200: the last 128-block is partial, scale [2, 2]
    x = torch.randn(3, 200, dtype=torch.bfloat16)
    _check(_sel().prepare(w, s)(x), x, w, s)


def _unparsable_torch_version() -> None:
    caps = Capabilities(device_kind="xpu", torch_version="not-a-version", float8_dtypes=("float8_e4m3fn",),
                        has_scaled_mm=True, scaling_types=("BlockWise1x128", "BlockWise128x128"))
    selection = _sel(caps)
    assert selection.backend.name == "reference"
    xpu = next(c for c in selection.verdicts if c.name == "xpu-scaled-mm")
    assert not xpu.accepted and "found torch not-a-version" in xpu.reason


def _order_as_string() -> None:
    assert _sel(order="triton, reference").backend.name == "reference"


def _backend_blank_and_case() -> None:
    selection = _sel(backend=" Reference ")
    assert selection.backend.name == "reference" and selection.source == "argument"


def _backend_alias() -> None:
    for typed in ("deep_gemm", "deep-gemm", "DeepGEMM"):
        assert _sel(DEEPGEMM, backend=typed).backend.name == "deepgemm"


def _backend_auto() -> None:
    assert _sel(backend="AUTO").source == "auto" and _sel(backend="").source == "auto"
    from_env = _sel(replace(CPU, env={"FP8SELECT_BACKEND": "reference"}), backend="auto")
    assert from_env.source == "environment"  # "auto" is no choice: the environment's applies


def _env_backend_alias() -> None:
    selection = _sel(replace(DEEPGEMM, env={"FP8SELECT_BACKEND": " Deep_GEMM "}))
    assert selection.backend.name == "deepgemm" and selection.source == "environment"


def _disable_any_spelling() -> None:
    assert _sel(disable="TRITON, Deep_GEMM").disabled == ("triton", "deepgemm")
    assert _sel(replace(CPU, env={"FP8SELECT_DISABLE": " Triton ,deep-gemm"})).disabled == ("triton", "deepgemm")


def _order_duplicates() -> None:
    assert [c.name for c in _sel(order=["reference", "Reference", " reference"]).verdicts] == ["reference"]
    assert [c.name for c in _sel(DEEPGEMM, order="deep_gemm,deepgemm,reference").verdicts] == ["deepgemm", "reference"]


def _env_read_on_each_call() -> None:
    saved = os.environ.get("FP8SELECT_BACKEND")
    resolve(plugins=False, tuning=False)  # a first resolution caches the device facts
    os.environ["FP8SELECT_BACKEND"] = "reference"
    try:
        assert resolve(plugins=False, tuning=False).source == "environment"
    finally:
        if saved is None:
            del os.environ["FP8SELECT_BACKEND"]
        else:
            os.environ["FP8SELECT_BACKEND"] = saved


def _snapshot_hashable() -> None:
    a, b = H200, Capabilities.from_json(H200.to_json())
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(TypeError):
        a.packages["triton"] = "0"  # type: ignore[index]


VALID: dict[str, Callable[[], None]] = {
    "valid-empty-batch": _empty_batch,
    "valid-empty-batch-3d-bias": _empty_batch_3d_bias,
    "valid-empty-batch-prequantized": _empty_batch_prequantized,
    "valid-1d-input": _lead_dims(),
    "valid-3d-input": _lead_dims(2, 3),
    "valid-4d-input": _lead_dims(2, 2, 3),
    "valid-transposed-input": _transposed,
    "valid-sliced-3d-input": _sliced_3d,
    "valid-broadcast-rows": _broadcast_rows,
    "valid-partial-k-block": _partial_k_block,
    "valid-unparsable-torch-version": _unparsable_torch_version,
    "valid-order-as-string": _order_as_string,
    "valid-backend-blank-and-case": _backend_blank_and_case,
    "valid-backend-alias": _backend_alias,
    "valid-backend-auto": _backend_auto,
    "valid-env-backend-alias": _env_backend_alias,
    "valid-disable-any-spelling": _disable_any_spelling,
    "valid-order-duplicates": _order_duplicates,
    "valid-env-read-on-each-call": _env_read_on_each_call,
    "valid-snapshot-hashable": _snapshot_hashable,
    "valid-max-weight-copies-zero": _no_copies,
}


@pytest.mark.parametrize("case", sorted(VALID))
def test_unusual_but_valid_input_works(case: str) -> None:
    VALID[case]()


@pytest.mark.parametrize("step", [1, 2, 6])
def test_the_checked_input_has_unit_k_stride(step: int) -> None:
    """What a backend gets from a strided activation (K stride 1, 2 or 6) is ``[M, K]`` with K stride 1."""
    from fp8select.inputs import check_input

    x = torch.randn(6, K * step, dtype=torch.bfloat16)[:, ::step]
    assert x.shape == (6, K) and x.stride(-1) == step
    x2, scale, lead = check_input(x, None, k=K, group=128, device=torch.device("cpu"), out_dtype=None)
    assert x2.stride(-1) == 1 and torch.equal(x2, x) and scale is None and lead == (6,)


def test_a_one_token_input_is_checked_as_one_row() -> None:
    from fp8select.inputs import check_input

    x = torch.randn(K, dtype=torch.bfloat16)
    x2, _, lead = check_input(x, None, k=K, group=128, device=torch.device("cpu"), out_dtype=None)
    assert x2.shape == (1, K) and lead == () and torch.equal(x2[0], x)


# --- plugins that misbehave beyond raising: reported and ignored, never exiting, hanging or failing later ---
# Each row is an entry-point plugin module; resolve() must answer, and the named verdict row must be
# rejected with the fragment in its reason ("plugin:" rows also come with a PluginWarning).

PLUGIN_TIMEOUT_S = 0.5


def _hook(body: str, backend: str = "") -> str:
    return ("import itertools, time\nfrom fp8select import Backend, Placement, hookimpl\n" + backend +
            "\n@hookimpl\ndef fp8select_backends():\n    " + body + "\n")


_EXITING_GATE = """
class Gate(Backend):
    name = "exiting-gate"
    def check(self, caps):
        raise SystemExit(1)
"""
_UNPRINTABLE_ERROR = """
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")
class Gate(Backend):
    name = "unprintable-gate"
    def check(self, caps):
        raise Unprintable()
"""

PLUGIN_CASES: dict[str, tuple[str, str, str]] = {
    "plugin-import-exits": ("import argparse\nargparse.ArgumentParser(prog='x').parse_args(['--no-such-flag'])",
                            "plugin:", "failed to load entry point"),
    "plugin-import-raises-base-exception": ("raise GeneratorExit('odd')", "plugin:", "GeneratorExit: odd"),
    "plugin-import-blocks": ("import time\ntime.sleep(2)", "plugin:", f"did not finish importing within {PLUGIN_TIMEOUT_S:g} s"),
    "plugin-hook-exits": (_hook("raise SystemExit(3)"), "plugin:", "hook fp8select_backends raised SystemExit: exit status 3"),
    "plugin-hook-blocks": (_hook("time.sleep(2)"), "plugin:", f"hook fp8select_backends did not finish within {PLUGIN_TIMEOUT_S:g} s"),
    "plugin-hook-returns-text": (_hook("return 'mykernel'"), "plugin:", "returned 'mykernel', expected a list of backends"),
    "plugin-hook-returns-one-backend": (_hook("return B", "class B(Backend):\n    name = 'one'\n"), "plugin:",
                                        "expected a list of backends"),
    "plugin-hook-runaway-generator": (_hook("yield from itertools.count()"), "plugin:", "returned more than 64 backends"),
    "plugin-constructor-exits": (_hook("return [B]", "class B(Backend):\n    name = 'b'\n    def __init__(self):\n"
                                                      "        raise SystemExit(4)\n"), "plugin:",
                                 "constructing backend B raised SystemExit: exit status 4"),
    "plugin-name-raises": (_hook("return [B]", "class B(Backend):\n    @property\n    def name(self):\n"
                                                "        raise RuntimeError('nameless')\n"), "plugin:",
                           "reading its name raised RuntimeError: nameless"),
    "plugin-reserved-name": (_hook("return [B]", "class B(Backend):\n    name = 'auto'\n"), "plugin:",
                             "backend name 'auto' is reserved"),
    "plugin-alias-name": (_hook("return [B]", "class B(Backend):\n    name = 'deep_gemm'\n"), "plugin:",
                          "backend name 'deep_gemm' is reserved (it means 'deepgemm' when typed)"),
    "plugin-placement-not-a-name": (_hook("return [Placement(B, before=3)]", "class B(Backend):\n    name = 'b'\n"), "plugin:",
                                    "Placement before=3: expected a backend name or None"),
    "plugin-check-exits": (_hook("return [Gate]", _EXITING_GATE), "exiting-gate",
                           "its device-level check raised SystemExit: exit status 1"),
    "plugin-check-error-unprintable": (_hook("return [Gate]", _UNPRINTABLE_ERROR), "unprintable-gate",
                                       "its device-level check raised Unprintable: <str() raised RuntimeError>"),
}


@pytest.mark.parametrize("case", sorted(PLUGIN_CASES))
def test_misbehaving_plugin_is_reported_and_ignored(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, row, fragment = PLUGIN_CASES[case]
    module = "fp8select_test_" + case.replace("-", "_")
    install_distribution(tmp_path, module, source)
    monkeypatch.syspath_prepend(str(tmp_path))
    caps = replace(CPU, env={"FP8SELECT_PLUGIN_TIMEOUT_S": str(PLUGIN_TIMEOUT_S)})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            selection = resolve(caps)
    finally:
        sys.modules.pop(module, None)
    assert selection.backend.name == "reference"
    name = f"plugin:{module}" if row == "plugin:" else row
    verdict = next(c for c in selection.verdicts if c.name == name)
    assert not verdict.accepted and fragment in verdict.reason, verdict.reason
    plugin_warnings = [w for w in caught if issubclass(w.category, PluginWarning)]
    assert len(plugin_warnings) == (1 if row == "plugin:" else 0), [str(w.message) for w in plugin_warnings]


def test_choose_lists_a_repeated_name_once() -> None:
    from fp8select.decision import builtin_backends

    sel = choose(CPU, builtin_backends(), ["reference", "triton", "reference"])
    assert [c.name for c in sel.verdicts] == ["reference", "triton"]


def test_a_backend_whose_prepare_exits_is_left_out() -> None:
    from fp8select.backends.reference import ReferenceBackend
    from fp8select.layer import Fp8Linear

    class Exits(ReferenceBackend):
        name = "exits"

        def prepare(self, *args: Any, **kwargs: Any) -> Any:
            raise SystemExit(3)

    layer = Fp8Linear([Exits(), ReferenceBackend()], CPU, _w(), _s())
    assert layer.backends == ("reference",)


def test_warmup_sizes_no_call_could_have_fail_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    from fp8select import warmup

    layer = resolve(CPU, plugins=False).prepare(*random_problem(128, 256, seed=1))
    monkeypatch.setattr(torch, "randn", lambda *a, **k: pytest.fail("allocated an activation"))
    with pytest.raises(InvalidInputError, match=r"ms: expected sizes whose activation and output fit in cpu"):
        warmup(layer, ms=[10**12])
