"""The layers the drop-in call prepared, kept per weight so that it prepares each weight once.

Engines call ``w8a8_block_fp8_linear(input, weight, block_size, weight_scale, ...)`` in every
forward, with the same weight tensors each time; :meth:`fp8select.Selection.linear` takes that
signature. Planning and laying out the weight on every call cost 5-20x the prepared layer's call
on the H200, so :class:`PreparedLayers` keeps the layer prepared for each weight:

* found by the weight tensor's identity, and used only while the weight and its scale are the
  very tensors it was prepared from (held by weak references), unmodified (their version
  counters, which every in-place write bumps, and their data pointers and shapes unchanged),
  with the same block size and output dtype; anything else prepares again and replaces it. A
  different weight, or one modified through its own tensor, is never served a stale layer. Two writes leave
  no trace to see: through ``.data`` (``param.data.copy_(new)``, a tensor with a version counter of its own)
  and into an inference tensor (it has none); after those, :meth:`PreparedLayers.clear`
  (``Selection.forget_prepared()``) makes the next calls prepare again.
* freed with the weight: the layer is prepared from views of the caller's tensors (sharing their
  storage, not their Python objects), so the cache never keeps the weight tensor alive, and the
  entry is dropped when that tensor is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["PreparedLayers"]

Prepare = Callable[..., Any]


class _Entry:
    """One weight's prepared layer and what the weight looked like when it was prepared."""

    __slots__ = ("block", "layer", "out_dtype", "scale", "scale_state", "weight", "weight_state")

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, ...], out_dtype: torch.dtype | None,
                 layer: Any, weight_ref: weakref.ref[torch.Tensor]) -> None:
        self.weight = weight_ref
        self.scale = weakref.ref(scale)
        self.weight_state = _state(weight)
        self.scale_state = _state(scale)
        self.block = block
        self.out_dtype = out_dtype
        self.layer = layer


def _state(t: torch.Tensor) -> tuple[Any, ...]:
    """What changes when a tensor is written in place or re-pointed: version, data pointer, shape, dtype
    (an inference tensor has no version: None)."""
    try:
        version = t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        version = None
    return version, t.data_ptr(), t.shape, t.dtype


class PreparedLayers:
    """Per weight tensor, the layer prepared for it (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}

    def get(self, weight: object, weight_scale: object, block_size: object, out_dtype: torch.dtype | None) -> Any:
        """The kept layer when it still serves these arguments (see the module docstring), else None."""
        entry = self._entries.get(id(weight))
        if (entry is None or entry.weight() is not weight or entry.scale() is not weight_scale
                or out_dtype is not entry.out_dtype or not isinstance(block_size, (list, tuple))):
            return None
        # Both are the entry's tensors (identity above): whether they were written or re-pointed since.
        if _state(weight) != entry.weight_state or _state(weight_scale) != entry.scale_state:  # type: ignore[arg-type]
            return None
        return entry.layer if tuple(block_size) == entry.block else None

    def keep(self, weight: object, weight_scale: object, block_size: Sequence[int], out_dtype: torch.dtype | None,
             prepare: Prepare) -> Any:
        """``prepare(...)``'s layer for these arguments, kept for the next calls with the same weight."""
        if (not isinstance(weight, torch.Tensor) or not isinstance(weight_scale, torch.Tensor)
                or not isinstance(block_size, (list, tuple))):
            return prepare(weight, weight_scale, block_size, out_dtype=out_dtype)  # raises its typed error
        layer = prepare(weight.detach(), weight_scale.detach(), block_size, out_dtype=out_dtype)
        key, entries = id(weight), self._entries

        def forget(_: weakref.ref[torch.Tensor]) -> None:
            entries.pop(key, None)

        entries[key] = _Entry(weight, weight_scale, tuple(block_size), out_dtype, layer, weakref.ref(weight, forget))
        return layer

    def clear(self) -> None:
        """Forget every kept layer: the next call with each weight prepares it again."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
