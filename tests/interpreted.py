"""Rebuilding fp8select's Triton kernels for the interpreter, for the CPU test modules that run them.

A kernel is built when its module is imported: one imported before ``TRITON_INTERPRET=1`` was set
(by another test module of the same process) is a compiled kernel, which a CPU cannot run. The
modules are reloaded in import order, each after the ones it takes kernels and helpers from, so that
none keeps a kernel of the previous build.
"""

from __future__ import annotations

import importlib
from types import ModuleType

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
