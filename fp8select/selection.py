"""The result of a resolution: the chosen backend, every verdict, and where the choice came from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fp8select.backends.base import Backend
from fp8select.capabilities import Capabilities

if TYPE_CHECKING:
    from fp8select.layer import Fp8Linear

SOURCES = ("argument", "environment", "auto")


@dataclass(frozen=True)
class Candidate:
    """One backend's verdict in the chain (rank is 1-based in priority order)."""

    rank: int
    name: str
    accepted: bool
    reason: str
    origin: str = "builtin"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "backend": self.name, "accepted": self.accepted, "reason": self.reason, "origin": self.origin}


@dataclass(frozen=True)
class Selection:
    """What :func:`fp8select.resolve` decided.

    ``backend`` is the chosen backend; ``verdicts`` has one entry per candidate in priority
    order (never pre-filtered), plus one rejected entry per plugin that failed to load;
    ``source`` says whether the choice came from an ``argument``, the ``environment`` or
    ``auto``; ``chain`` lists the accepted backends, chosen first, which the layer object
    uses as fallbacks for calls the chosen one cannot take.
    """

    backend: Backend
    verdicts: tuple[Candidate, ...]
    source: str
    capabilities: Capabilities
    chain: tuple[Backend, ...]
    disabled: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    tuning: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def fallbacks(self) -> tuple[Backend, ...]:
        return self.chain[1:]

    def explain(self) -> str:
        caps = self.capabilities
        where = caps.device_kind + (f" ({caps.device_name})" if caps.device_name else "")
        if caps.compute_capability:
            where += f", sm{caps.compute_capability[0]}{caps.compute_capability[1]}"
        if caps.gfx_arch:
            where += f", {caps.gfx_arch}"
        lines = [f"fp8select chose {self.backend.name!r} ({self.source}) on {where}, torch {caps.torch_version}", ""]
        width = max([len("backend")] + [len(c.name) for c in self.verdicts])
        lines.append(f"{'rank':>4}  {'backend':<{width}}  {'verdict':<8}  reason")
        for c in self.verdicts:
            verdict = "CHOSEN" if c.name == self.backend.name else ("ok" if c.accepted else "rejected")
            lines.append(f"{c.rank:>4}  {c.name:<{width}}  {verdict:<8}  {c.reason}")
        lines.append("")
        lines.append("fallback chain: " + " -> ".join(b.name for b in self.chain))
        if self.tuning:
            lines.append(f"tuning table: {self.tuning.get('_path', 'given')} ({len(self.tuning.get('entries', {}))} shapes), "
                         "chooses per M between the chosen backend and its fallback")
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend.name,
            "source": self.source,
            "chain": [b.name for b in self.chain],
            "disabled": list(self.disabled),
            "verdicts": [c.to_dict() for c in self.verdicts],
            "capabilities": self.capabilities.to_dict(),
            "fingerprint": self.capabilities.fingerprint(),
            "tuning_table": self.tuning.get("_path", "given") if self.tuning else None,
        }

    def prepare(self, weight: torch.Tensor, weight_scale: torch.Tensor,
                block_size: Sequence[int] = (128, 128), *, out_dtype: torch.dtype | None = None) -> Fp8Linear:
        """Lay the weight out for the chosen backend (and its fallback) once; returns a callable layer."""
        from fp8select.layer import Fp8Linear

        return Fp8Linear(self, weight, weight_scale, block_size, out_dtype=out_dtype)

    def linear(self, input: torch.Tensor, weight: torch.Tensor, block_size: Sequence[int], weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Drop-in for the engines' ``w8a8_block_fp8_linear(input, weight, block_size, weight_scale, ...)``.

        It prepares the weight on every call; use :meth:`prepare` once at load time where the
        chosen backend re-lays weights out (most do not, so this stays cheap for them). The
        output dtype is the activation's; a pre-quantized fp8 ``input`` needs ``out_dtype``.
        """
        layer = self.prepare(weight, weight_scale, block_size, out_dtype=out_dtype)
        return layer(input, bias=bias, input_scale=input_scale)
