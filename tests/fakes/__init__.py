"""Fake vendor kernel modules for CPU tests of fp8select's backend adapters.

Each fake stands in for a vendor package that cannot run here (DeepGEMM, FlashInfer,
sgl-kernel's CUTLASS GEMM, AITER, Ascend ``torch_npu``). A fake exposes the function names
and signatures of the real API version documented in ``docs/vendor-apis.md``, validates
every argument the way that API requires (dtype, shape, strides, padding, packing), raises
an exception of the kind the vendor raises, and otherwise computes the product with a
float64 reference so adapter tests can check numbers.

Typical use in a test::

    from fakes import install

    def test_adapter_calls_deepgemm(monkeypatch):
        fake = install(monkeypatch, "deep_gemm", arch="sm100")
        ...  # run the adapter, which does ``import deep_gemm`` lazily
        call = fake.last("fp8_gemm_nt")
        assert call.ok and call.arguments["disable_ue8m0_cast"] is False

``install`` builds a fresh fake (state is never shared between tests), registers it and its
submodules in ``sys.modules`` for the duration of the test, and returns a :class:`FakeVendor`
handle holding the module, the knobs object (``fake.impl``) and the record of calls.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
import torch

__all__ = [
    "VENDORS",
    "BlockFP8Problem",
    "Call",
    "FakeVendor",
    "ceil_div",
    "dequantize_blockwise",
    "fake_vendor",
    "install",
    "installed",
    "make_problem",
    "make_vendor_module",
    "recorded",
    "round_up",
    "unpack_ue8m0",
]

#: Import name of each vendor package -> module in this package that builds its fake.
VENDORS: Mapping[str, str] = {
    "deep_gemm": "deep_gemm",
    "flashinfer": "flashinfer",
    "sgl_kernel": "sgl_kernel",
    "aiter": "aiter",
    "torch_npu": "torch_npu",
}


# --------------------------------------------------------------------------- call records


@dataclass(frozen=True)
class Call:
    """One call made to a fake vendor function.

    ``arguments`` maps every parameter name of the real signature to the value passed (or
    its default), so tests can assert on an argument however the adapter passed it.
    ``error`` is the exception the fake raised, or ``None`` when the call was accepted.
    """

    vendor: str
    function: str
    arguments: Mapping[str, Any]
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """Whether the fake accepted the call."""
        return self.error is None

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={_describe(value)}" for key, value in self.arguments.items())
        outcome = "ok" if self.error is None else f"{type(self.error).__name__}: {self.error}"
        return f"<{self.vendor}.{self.function}({args}) -> {outcome}>"


def _describe(value: Any) -> str:
    """Short description of an argument: tensors as dtype[shape] with strides."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}@{tuple(value.stride())}"
    if isinstance(value, tuple | list):
        inner = ", ".join(_describe(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


@dataclass
class FakeVendor:
    """Handle on an installed fake: its modules, its knobs and the calls it received."""

    name: str
    module: ModuleType
    modules: Mapping[str, ModuleType]
    impl: Any
    calls: list[Call] = field(default_factory=list)

    def calls_to(self, function: str) -> list[Call]:
        """All recorded calls to ``function`` (accepted or rejected), oldest first."""
        return [c for c in self.calls if c.function == function]

    def last(self, function: str | None = None) -> Call:
        """The most recent call (to ``function`` when given); ``LookupError`` if none."""
        matching = self.calls if function is None else self.calls_to(function)
        if not matching:
            raise LookupError(f"no recorded call to {function or 'any function'} of fake {self.name}")
        return matching[-1]

    def clear_calls(self) -> None:
        """Forget the recorded calls."""
        self.calls.clear()


def recorded(log: list[Call], vendor: str, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn`` so every call is appended to ``log`` with its bound arguments.

    The wrapper keeps ``fn``'s signature (``inspect.signature`` follows ``__wrapped__``), and
    a call that does not bind (unknown keyword, missing argument) raises ``TypeError`` like
    the real function would.
    """
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            log.append(Call(vendor, name, {"*args": args, "**kwargs": kwargs}, exc))
            raise
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            log.append(Call(vendor, name, arguments, exc))
            raise
        log.append(Call(vendor, name, arguments, None))
        return result

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def make_vendor_module(name: str, attributes: Mapping[str, Any], doc: str = "") -> ModuleType:
    """A module object named ``name`` holding ``attributes``, with a spec so ``find_spec`` works."""
    module = ModuleType(name, doc)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__path__ = []  # a package, so ``import parent.child`` resolves from sys.modules
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


# --------------------------------------------------------------------------- installation


def install(monkeypatch: pytest.MonkeyPatch, vendor: str, **options: Any) -> FakeVendor:
    """Install a fresh fake of ``vendor`` in ``sys.modules`` until the test ends.

    ``options`` are the fake's knobs (see each fake module's ``build``), e.g.
    ``install(monkeypatch, "deep_gemm", arch="sm100", api="v2")``. Any real module of the
    same package already imported is hidden for the duration of the test.
    """
    if vendor not in VENDORS:
        raise LookupError(f"no fake for vendor {vendor!r}; known: {sorted(VENDORS)}")
    builder = importlib.import_module(f"{__name__}.{VENDORS[vendor]}")
    calls: list[Call] = []
    impl, modules = builder.build(calls, **options)
    for loaded in list(sys.modules):
        if (loaded == vendor or loaded.startswith(vendor + ".")) and loaded not in modules:
            monkeypatch.delitem(sys.modules, loaded, raising=False)
    for module_name, module in modules.items():
        monkeypatch.setitem(sys.modules, module_name, module)
    return FakeVendor(name=vendor, module=modules[vendor], modules=modules, impl=impl, calls=calls)


@contextlib.contextmanager
def installed(vendor: str, **options: Any) -> Iterator[FakeVendor]:
    """Context-manager form of :func:`install` for code that has no ``monkeypatch``."""
    with pytest.MonkeyPatch.context() as patcher:
        yield install(patcher, vendor, **options)


@pytest.fixture
def fake_vendor(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeVendor]:
    """Fixture returning ``install`` bound to this test's ``monkeypatch``.

    Import it into a test module or conftest (``from fakes import fake_vendor``) and
    call ``fake_vendor("aiter", gfx="gfx942")`` inside the test.
    """

    def _install(vendor: str, **options: Any) -> FakeVendor:
        return install(monkeypatch, vendor, **options)

    return _install


# --------------------------------------------------------------------------- numeric helpers


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling of ``a / b``."""
    return (a + b - 1) // b


def round_up(a: int, b: int) -> int:
    """Smallest multiple of ``b`` not below ``a``."""
    return ceil_div(a, b) * b


def dequantize_blockwise(q: torch.Tensor, scale: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """Float64 values of ``q`` [R, C] times a per-block ``scale`` [ceil(R/br), ceil(C/bc)].

    ``scale`` is read by logical index, whatever its strides. Used by every fake as the
    reference: ``dequant(a) @ dequant(b).T`` in float64.
    """
    rows, cols = q.shape
    if tuple(scale.shape) != (ceil_div(rows, block_rows), ceil_div(cols, block_cols)):
        raise ValueError(f"scale shape {tuple(scale.shape)} does not tile {tuple(q.shape)} by {(block_rows, block_cols)}")
    expanded = scale.to(torch.float64).repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return q.to(torch.float64) * expanded[:rows, :cols]


def unpack_ue8m0(packed: torch.Tensor, groups: int) -> torch.Tensor:
    """Decode DeepGEMM-packed UE8M0 scales: int32 [MN, ceil(groups/4)] -> float64 [MN, groups].

    Each int32 holds four 8-bit exponents of consecutive K groups of one row, group ``4j`` in
    the least significant byte (little-endian byte order); exponent ``e`` means ``2**(e-127)``
    (``e == 0`` decodes to 0, as DeepGEMM's own ``unpack_ue8m0_from_int`` does). Strides are
    ignored: the tensor is read by logical index.
    """
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"packed UE8M0 scales must be a 2-D int32 tensor, got {packed.dtype} {tuple(packed.shape)}")
    rows = packed.shape[0]
    dense = torch.empty(packed.shape, dtype=torch.int32).copy_(packed)  # standard strides, even for size-1 dims
    exponents = dense.view(torch.uint8).reshape(rows, -1)[:, :groups]
    return (exponents.to(torch.int32) << 23).view(torch.float32).to(torch.float64)


@dataclass(frozen=True)
class BlockFP8Problem:
    """A DeepSeek-style block-FP8 linear problem in checkpoint layouts, with its reference.

    ``x_q`` [M, K] and ``x_scale`` [M, ceil(K/128)] (row-major) are the 1x128 per-token
    quantised activations; ``w_q`` [N, K] and ``w_scale`` [ceil(N/128), ceil(K/128)]
    (row-major) are the 128x128 block-quantised weights; ``reference`` is
    ``dequant(x) @ dequant(w).T`` in float64.
    """

    x: torch.Tensor
    x_q: torch.Tensor
    x_scale: torch.Tensor
    w_q: torch.Tensor
    w_scale: torch.Tensor
    reference: torch.Tensor

    @property
    def m(self) -> int:
        """Number of tokens."""
        return self.x_q.shape[0]

    @property
    def n(self) -> int:
        """Output features."""
        return self.w_q.shape[0]

    @property
    def k(self) -> int:
        """Input features."""
        return self.x_q.shape[1]


def _pow2_ceil(values: torch.Tensor) -> torch.Tensor:
    """Round positive float32 values up to a power of two (what UE8M0 can represent)."""
    return torch.exp2(torch.ceil(torch.log2(values)))


def make_problem(
    m: int,
    n: int,
    k: int,
    *,
    seed: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    pow2_scales: bool = False,
) -> BlockFP8Problem:
    """Build a random block-FP8 problem (checkpoint layouts) and its float64 reference.

    ``pow2_scales`` rounds every scale up to a power of two, so the problem is exactly
    representable with UE8M0 scales (DeepGEMM on SM100).
    """
    gen = torch.Generator().manual_seed(seed)
    fp8_max = torch.finfo(fp8_dtype).max
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen) * 0.05
    kb, nb = ceil_div(k, 128), ceil_div(n, 128)

    x_pad = torch.zeros(m, kb * 128)
    x_pad[:, :k] = x.float()
    x_scale = (x_pad.view(m, kb, 128).abs().amax(-1).clamp(min=1e-4) / fp8_max).float()
    if pow2_scales:
        x_scale = _pow2_ceil(x_scale)
    x_q = (x_pad.view(m, kb, 128) / x_scale.unsqueeze(-1)).view(m, -1)[:, :k].to(fp8_dtype)

    w_pad = torch.zeros(nb * 128, kb * 128)
    w_pad[:n, :k] = w
    blocks = w_pad.view(nb, 128, kb, 128)
    w_scale = (blocks.abs().amax(dim=(1, 3)).clamp(min=1e-4) / fp8_max).float()
    if pow2_scales:
        w_scale = _pow2_ceil(w_scale)
    w_q = (blocks / w_scale[:, None, :, None]).view(nb * 128, kb * 128)[:n, :k].to(fp8_dtype)

    reference = dequantize_blockwise(x_q, x_scale, 1, 128) @ dequantize_blockwise(w_q, w_scale, 128, 128).T
    return BlockFP8Problem(
        x=x,
        x_q=x_q.contiguous(),
        x_scale=x_scale.contiguous(),
        w_q=w_q.contiguous(),
        w_scale=w_scale.contiguous(),
        reference=reference,
    )
