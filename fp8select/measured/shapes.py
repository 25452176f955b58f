"""The layer shapes of the block-FP8 models people serve, per tensor-parallel degree.

Each model's dense projections are derived from its published configuration (the values below,
from each checkpoint's ``config.json`` on Hugging Face), as the engines (vLLM, SGLang) split them
across ``tp`` GPUs: a column-parallel layer divides N, a row-parallel one divides K, a replicated
one keeps both. Fused projections are one layer, as the engines load them:

* **MLA** (DeepSeek-V3 architecture): ``q_a`` and ``kv_a`` fused (``q_lora_rank + kv_lora_rank +
  qk_rope_head_dim`` by ``hidden``, replicated), ``q_b`` and ``kv_b`` (column), ``o`` (row); the
  dense MLP of the first layers and the shared expert: gate and up fused (column), down (row).
* **GQA** (Qwen3): q, k and v fused (column; with fewer KV heads than GPUs each GPU holds one KV
  head, replicated ``tp / kv_heads`` times, as vLLM's ``QKVParallelLinear`` does), ``o`` (row),
  gate and up fused (column), down (row). For MoE models only the attention is dense.

A degree is served only when every split dimension's part on each GPU is a whole number of 128
weight blocks (vLLM and SGLang refuse to load block-FP8 weights split otherwise; a replicated
layer may be ragged, as DeepSeek-V3's 2112-row fused ``q_a+kv_a`` is); :func:`unserved` says
which degrees are not and why. Routed experts (grouped GEMMs) are not dense layers: not listed.

Shape-set names (:func:`shape_sets`): a model's name is its shapes at TP 1 (``deepseek-v3``: the
eight the shipped table holds), ``NAME:tpN`` at one degree, ``NAME:all`` at every degree of
:data:`TP_DEGREES`, ``served`` every model at every degree. Pure data: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["MODELS", "TP_DEGREES", "Gqa", "Mla", "Model", "ServedShape", "Use", "served_shapes", "shape_sets",
           "unserved"]

TP_DEGREES = (1, 2, 4, 8)
BLOCK = 128  # the weight block every part must be whole in


class _Unserved(ValueError):
    """A degree a model cannot be split at (the reason)."""


def _split(total: int, tp: int, what: str) -> int:
    """``total / tp`` when each GPU's part is whole in 128-blocks, else :class:`_Unserved` saying so."""
    if total % (tp * BLOCK):
        raise _Unserved(f"{what} {total} / {tp} is not a multiple of {BLOCK}")
    return total // tp


@dataclass(frozen=True)
class Mla:
    """A DeepSeek-V3-style layer: multi-head latent attention, a dense MLP (first layers), a shared expert."""

    hidden: int
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate: int  # the dense MLP of the first ``first_k_dense_replace`` layers
    moe_intermediate: int  # one expert's; the shared expert is ``n_shared_experts`` of them
    shared_experts: int

    def projections(self, tp: int) -> list[tuple[str, int, int]]:
        """``(projection, N, K)`` on each of ``tp`` GPUs."""
        shared = _split(self.moe_intermediate * self.shared_experts, tp, "shared expert intermediate")
        dense = _split(self.intermediate, tp, "intermediate")
        return [("q_a+kv_a", self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim, self.hidden),
                ("q_b", _split(self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim), tp, "q_b N"),
                 self.q_lora_rank),
                ("kv_b", _split(self.heads * (self.qk_nope_head_dim + self.v_head_dim), tp, "kv_b N"),
                 self.kv_lora_rank),
                ("o", self.hidden, _split(self.heads * self.v_head_dim, tp, "o K")),
                ("shared gate+up", 2 * shared, self.hidden), ("shared down", self.hidden, shared),
                ("dense gate+up", 2 * dense, self.hidden), ("dense down", self.hidden, dense)]


@dataclass(frozen=True)
class Gqa:
    """A Qwen3-style layer: grouped-query attention and, for a dense model, a gated MLP."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int | None  # None: a MoE model (its MLP is routed experts)

    def projections(self, tp: int) -> list[tuple[str, int, int]]:
        """``(projection, N, K)`` on each of ``tp`` GPUs."""
        q = _split(self.heads * self.head_dim, tp, "q N")
        kv = max(1, self.kv_heads // tp) * self.head_dim  # fewer KV heads than GPUs: one each, replicated
        out = [("qkv", q + 2 * kv, self.hidden), ("o", self.hidden, q)]
        if self.intermediate is not None:
            part = _split(self.intermediate, tp, "intermediate")
            out += [("gate+up", 2 * part, self.hidden), ("down", self.hidden, part)]
        return out


@dataclass(frozen=True)
class Model:
    title: str
    layer: Mla | Gqa
    source: str  # where the configuration values come from


# Published configurations (``config.json`` of each checkpoint; every one ships block-FP8 [128, 128] weights).
_DEEPSEEK_V3 = Mla(hidden=7168, heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                   qk_rope_head_dim=64, v_head_dim=128, intermediate=18432, moe_intermediate=2048, shared_experts=1)
MODELS: dict[str, Model] = {
    "deepseek-v3": Model("DeepSeek-V3/R1/V3.1", _DEEPSEEK_V3,
                         "deepseek-ai/DeepSeek-V3, DeepSeek-R1 and DeepSeek-V3.1"),
    "kimi-k2": Model("Kimi-K2", Mla(hidden=7168, heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                                    qk_rope_head_dim=64, v_head_dim=128, intermediate=18432, moe_intermediate=2048,
                                    shared_experts=1), "moonshotai/Kimi-K2-Instruct"),
    "qwen3-4b": Model("Qwen3-4B", Gqa(hidden=2560, heads=32, kv_heads=8, head_dim=128, intermediate=9728),
                      "Qwen/Qwen3-4B-FP8"),
    "qwen3-8b": Model("Qwen3-8B", Gqa(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288),
                      "Qwen/Qwen3-8B-FP8"),
    "qwen3-14b": Model("Qwen3-14B", Gqa(hidden=5120, heads=40, kv_heads=8, head_dim=128, intermediate=17408),
                       "Qwen/Qwen3-14B-FP8"),
    "qwen3-32b": Model("Qwen3-32B", Gqa(hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600),
                       "Qwen/Qwen3-32B-FP8"),
    "qwen3-30b-a3b": Model("Qwen3-30B-A3B", Gqa(hidden=2048, heads=32, kv_heads=4, head_dim=128, intermediate=None),
                           "Qwen/Qwen3-30B-A3B-FP8"),
    "qwen3-235b-a22b": Model("Qwen3-235B-A22B", Gqa(hidden=4096, heads=64, kv_heads=4, head_dim=128,
                                                    intermediate=None), "Qwen/Qwen3-235B-A22B-FP8"),
}
_ALIASES = {"deepseek-r1": "deepseek-v3", "deepseek-v3.1": "deepseek-v3"}


@dataclass(frozen=True)
class Use:
    """One projection of a model at one tensor-parallel degree."""

    model: str  # the title: "Qwen3-32B"
    projection: str
    tp: int


@dataclass(frozen=True)
class ServedShape:
    """One (N, K) and the projections it serves."""

    n: int
    k: int
    uses: tuple[Use, ...]

    def describe(self) -> str:
        """``Qwen3-8B qkv TP1, gate+up TP4; Qwen3-235B-A22B o TP2`` (degrees of one projection joined by /)."""
        tps: dict[str, dict[str, list[int]]] = {}
        for use in self.uses:
            tps.setdefault(use.model, {}).setdefault(use.projection, []).append(use.tp)
        return "; ".join(f"{model} " + ", ".join(f"{p} TP{'/'.join(map(str, t))}" for p, t in projections.items())
                         for model, projections in tps.items())


def _parts(model: Model, tp: int) -> tuple[list[tuple[str, int, int]], str | None]:
    """The per-GPU ``(projection, N, K)`` at degree ``tp``, and why that degree is not served (else None)."""
    try:
        return model.layer.projections(tp), None
    except _Unserved as exc:
        return [], str(exc)


def unserved() -> list[tuple[str, int, str]]:
    """``(model, tp, why)`` for each degree of :data:`TP_DEGREES` a model cannot be split at."""
    return [(name, tp, why) for name, model in MODELS.items() for tp in TP_DEGREES
            if (why := _parts(model, tp)[1]) is not None]


def served_shapes(models: Iterable[str] | None = None, tps: Iterable[int] = TP_DEGREES) -> tuple[ServedShape, ...]:
    """The distinct (N, K) of ``models`` (default: all) at degrees ``tps``, in order of first use."""
    uses: dict[tuple[int, int], list[Use]] = {}
    for name in MODELS if models is None else models:
        model = MODELS[_ALIASES.get(name, name)]
        for tp in tps:
            for projection, n, k in _parts(model, tp)[0]:
                uses.setdefault((n, k), []).append(Use(model.title, projection, tp))
    return tuple(ServedShape(n, k, tuple(u)) for (n, k), u in uses.items())


def shape_sets() -> dict[str, tuple[tuple[int, int], ...]]:
    """Every shape-set name (see the module docstring) and its (N, K), in order of first use."""
    sets: dict[str, tuple[tuple[int, int], ...]] = {}
    for name in [*MODELS, *_ALIASES]:
        sets[name] = tuple((s.n, s.k) for s in served_shapes([name], (1,)))
        for tp in TP_DEGREES:
            sets[f"{name}:tp{tp}"] = tuple((s.n, s.k) for s in served_shapes([name], (tp,)))
        sets[f"{name}:all"] = tuple((s.n, s.k) for s in served_shapes([name]))
    sets["served"] = tuple((s.n, s.k) for s in served_shapes())
    return {name: shapes for name, shapes in sets.items() if shapes}
