"""Hugging Face transformers: swap its fine-grained FP8 linears for :class:`~fp8select.nn.BlockFp8Linear`.

transformers' ``FineGrainedFP8Config`` (``quant_method="fp8"``, block ``[128, 128]``) turns a
model's ``nn.Linear`` layers into ``transformers.integrations.finegrained_fp8.FP8Linear``,
which holds the checkpoint's ``weight`` (float8_e4m3fn ``[N, K]``) and ``weight_scale_inv``
(fp32 block scales, multiplied in: ``w ~= weight * weight_scale_inv``) and quantizes
activations per token and 1x128 group at run time, as fp8select does. A loaded model's
``FP8Linear`` layers are replaced here by modules holding the same tensors (no copy).

transformers is an optional dependency (the ``integration`` extra): it is imported only
when :func:`replace_fp8_linears` is called without ``classes``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from fp8select.nn import BlockFp8Linear
from fp8select.selection import Selection

__all__ = ["Replacement", "fp8_linear_classes", "replace_fp8_linears", "unsupported_reason"]

_SCALE_DTYPES = tuple(getattr(torch, n) for n in ("float32", "float8_e8m0fnu") if hasattr(torch, n))


@dataclass(frozen=True)
class Replacement:
    """What :func:`replace_fp8_linears` did: the modules it replaced, and those it left, with why."""

    replaced: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]


def fp8_linear_classes() -> tuple[type[torch.nn.Module], ...]:
    """transformers' fine-grained FP8 linear class (imports transformers)."""
    from transformers.integrations.finegrained_fp8 import FP8Linear

    return (FP8Linear,)


def unsupported_reason(module: torch.nn.Module) -> str | None:
    """Why an FP8Linear-like module cannot become a BlockFp8Linear, or None when it can."""
    block = getattr(module, "block_size", None)
    if block is None:
        return "per-tensor weight scale (block_size None)"
    if getattr(module, "activation_scale", None) is not None:
        return "static per-tensor activation scale (fp8select quantizes activations per token group)"
    weight, scale = getattr(module, "weight", None), getattr(module, "weight_scale_inv", None)
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        found = f"{weight.dtype} {list(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight).__name__
        return f"weight: expected a float8_e4m3fn [N, K] tensor, found {found} (dequantized or FP4-packed)"
    if not isinstance(scale, torch.Tensor) or scale.dtype not in _SCALE_DTYPES:
        found = str(scale.dtype) if isinstance(scale, torch.Tensor) else type(scale).__name__
        return f"weight_scale_inv: expected float32 (or UE8M0) block scales, found {found}"
    return None


def replace_fp8_linears(model: torch.nn.Module, selection: Selection | None = None, *,
                        classes: Iterable[type[torch.nn.Module]] | None = None) -> Replacement:
    """Replace, in place, every module of exactly one of ``classes`` (default: transformers'
    ``FP8Linear``; subclasses such as the block-diagonal ``FP8GroupedLinear`` are left alone)
    by a :class:`BlockFp8Linear` holding its tensors.

    ``selection`` is resolved once for the whole model when not given. Modules on the
    selection's device are prepared now, others when the model is moved there. UE8M0
    scales become fp32 (exact: they are powers of two). Modules that fp8select cannot
    run (static activation scales, per-tensor scales, dequantized weights) are left in
    place and listed in ``skipped``.
    """
    wanted = fp8_linear_classes() if classes is None else tuple(classes)
    replaced: list[str] = []
    skipped: list[tuple[str, str]] = []
    for name, module in list(model.named_modules()):
        if type(module) not in wanted:
            continue
        reason = unsupported_reason(module) if name else "the root module cannot be replaced in place"
        if reason is not None:
            skipped.append((name, reason))
            continue
        if selection is None:
            from fp8select.resolver import resolve

            selection = resolve()
        scale = module.weight_scale_inv
        new = BlockFp8Linear.from_weights(
            module.weight, scale if scale.dtype == torch.float32 else scale.to(torch.float32), module.bias,
            block_size=tuple(module.block_size), selection=selection)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        replaced.append(name)
    return Replacement(tuple(replaced), tuple(skipped))
