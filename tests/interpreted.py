"""Rebuilding fp8select's Triton kernels for the interpreter, for the CPU test modules that run them.

A kernel is built when its module is imported: one imported before ``TRITON_INTERPRET=1`` was set
(by another test module of the same process) is a compiled kernel, which a CPU cannot run. The
modules are reloaded in import order, each after the ones it takes kernels and helpers from, so that
none keeps a kernel of the previous build.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

DENSE = ("triton_quant", "triton_gemm_kernels", "triton_device", "triton_bound", "triton_gemm")
"""The dense Triton modules, in import order."""


def rebuild(*after: str, force: bool = False) -> list[ModuleType]:
    """Reload the dense Triton modules, then the ``fp8select.kernels`` modules named in ``after`` (in that
    order, each once), when the dense kernels are not interpreted (or ``force``: the caller found a
    kernel of ``after`` that is not); return the modules of ``after``, reloaded or not."""
    names = tuple(dict.fromkeys((*DENSE, *after)))
    modules = {name: importlib.import_module(f"fp8select.kernels.{name}") for name in names}
    if force or type(modules["triton_gemm_kernels"]._w8a8_block_kernel).__name__ != "InterpretedFunction":
        modules = {name: importlib.reload(module) for name, module in modules.items()}
    return [modules[name] for name in after]


def moe_kernels() -> ModuleType:
    """:mod:`fp8select.kernels.moe_triton`, its kernels interpreted (rebuilt with the dense modules when an
    earlier module of this process imported them compiled)."""
    kernels = importlib.import_module("fp8select.kernels.moe_triton_kernels")
    if type(kernels._gate_up_kernel).__name__ != "InterpretedFunction":
        rebuild("moe_triton_kernels", "moe_triton", force=True)
    return importlib.import_module("fp8select.kernels.moe_triton")


class NanEmpty:
    """``torch`` for a kernel module (``monkeypatch.setattr(module, "torch", NanEmpty())``) with every float buffer
    it allocates filled with NaN: a row read that nothing wrote shows in the result."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)

    @staticmethod
    def empty(*args: Any, **kwargs: Any) -> Any:
        import torch

        t = torch.empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
