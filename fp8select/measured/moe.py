"""MoE experts layers in the tuning tables: their shapes, and the rows their plans read.

A table's optional ``moe`` list holds the whole-experts-op times (:mod:`fp8select.measured.table`
checks it), one entry per backend, layout and the versions that backend's speed depends on::

    "moe": [{"backend": "deepgemm", "layout": "masked", "versions": {..., "deep_gemm": "2.6.1"},
             "shapes": {"32,7168,2048,8": {"1": {"us": 61.2}, ...}}},
            {"backend": "triton", "layout": "sorted", "versions": {...},
             "shapes": {"32,7168,2048,8": {"1": {"us": 70.4, "config": {"BLOCK_M": 16, ...}}}}}]

A shape key is ``"E,H,I,k"`` (experts, hidden, intermediate, top-k); buckets are the dense layers'.
:class:`MoeMeasurements` indexes a device's tables once (later tables winning on equal keys) and
answers, per layer shape, the rows :func:`fp8select.moe_plan.build_moe_plan` takes. As for the dense
layers, a backend's rows at the versions installed here are used, else those of the other versions
with the most rows (and ``describe`` says so). A shape never measured has no rows; ``estimates`` then
models its routes' times from the measured shapes (:mod:`fp8select.measured.moe_model`). Pure Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fp8select.buckets import M_BUCKETS
from fp8select.errors import InvalidInputError
from fp8select.measured.moe_model import MoeEstimate, MoeModel, MoeShape
from fp8select.measured.table import row_problem, used_versions, versions_text

__all__ = ["MOE_SHAPES", "MoeMeasurements", "check_moe_times", "moe_shape_key", "parse_moe_shape", "parse_moe_shapes"]

MOE_SHAPES: dict[str, MoeShape] = {
    "deepseek-v3-e8": (8, 7168, 2048, 8),
    "deepseek-v3-e32": (32, 7168, 2048, 8),
    "deepseek-v3-e256": (256, 7168, 2048, 8),
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "qwen3-235b-a22b": (128, 4096, 1536, 8),
}
"""The MoE layers the shipped tables hold, ``(E, H, I, k)``: DeepSeek-V3's routed experts per rank
(256 experts over 32, 8 and 1 ranks of expert parallelism; hidden 7168, moe_intermediate 2048, 8 per
token) and Qwen3-MoE's (config.json: 128 experts, 8 per token; 30B-A3B hidden 2048, moe_intermediate
768; 235B-A22B 4096, 1536). ``all`` names every one."""


def moe_shape_key(experts: int, hidden: int, intermediate: int, top_k: int) -> str:
    return f"{experts},{hidden},{intermediate},{top_k}"


def parse_moe_shape(text: str, what: str = "--moe") -> MoeShape:
    """``"E,H,I,k"`` (four positive integers) or a name of :data:`MOE_SHAPES`; a typed error otherwise."""
    name = text.strip().lower()
    if name in MOE_SHAPES:
        return MOE_SHAPES[name]
    parts = [p for p in re.split(r"[,x ]+", name) if p]
    if len(parts) == 4 and all(p.isascii() and p.isdigit() and len(p) <= 9 and int(p) > 0 for p in parts):
        e, h, i, k = (int(p) for p in parts)
        if k <= e:
            return e, h, i, k
    raise InvalidInputError(f"{what} {text!r}: expected E,H,I,k (experts, hidden, intermediate, top-k: positive "
                            f"integers, k <= E) or one of {', '.join(MOE_SHAPES)}")


def parse_moe_shapes(text: str, what: str = "--moe") -> list[MoeShape]:
    """Names (``all``: every one of :data:`MOE_SHAPES`) and ``E,H,I,k`` groups, separated by ``;``, spaces
    or commas between names: ``deepseek-v3-e32,qwen3-30b-a3b``, ``all``, ``64,4096,1024,6;all``."""
    shapes: list[MoeShape] = []
    for chunk in (c for c in re.split(r"[; ]+", text.strip()) if c):
        tokens = chunk.split(",")
        while tokens:
            if tokens[0].strip().lower() == "all":
                shapes.extend(MOE_SHAPES.values())
                tokens = tokens[1:]
            elif tokens[0].strip().lower() in MOE_SHAPES:
                shapes.append(MOE_SHAPES[tokens[0].strip().lower()])
                tokens = tokens[1:]
            else:
                shapes.append(parse_moe_shape(",".join(tokens[:4]), what))
                tokens = tokens[4:]
    if not shapes:
        raise InvalidInputError(f"{what}: expected MoE shapes (E,H,I,k or {', '.join(MOE_SHAPES)}, all), found {text!r}")
    return list(dict.fromkeys(shapes))


def check_moe_times(measured: object, routes: Iterable[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """Rows of one layer shape given to ``prepare_moe(measured=...)`` (``"backend/layout"`` -> M bucket ->
    row), checked as a table's MoE rows are, as a copy keyed by int buckets; :class:`InvalidInputError`
    naming the first bad place otherwise. ``routes``: the routes some MoE backend declares (a row of one
    this machine does not run is kept, and never read; a name no backend declares is a mistake)."""
    if not isinstance(measured, Mapping):
        raise InvalidInputError(f"measured: expected a mapping of 'backend/layout' to M buckets, found "
                                f"{type(measured).__name__}")
    known = sorted(routes)
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for route, buckets in measured.items():
        if route not in known:
            raise InvalidInputError(f"measured: no MoE backend declares route {route!r}; the routes are "
                                    f"{', '.join(known)}")
        if not isinstance(buckets, Mapping):
            raise InvalidInputError(f"measured[{route!r}]: expected a mapping of M buckets to rows, found "
                                    f"{type(buckets).__name__}")
        rows = out[route] = {}
        for bucket, row in buckets.items():
            m = int(bucket) if isinstance(bucket, str) and bucket.isascii() and bucket.isdigit() else bucket
            if isinstance(m, bool) or not isinstance(m, int) or m not in M_BUCKETS:
                raise InvalidInputError(f"measured[{route!r}]: expected M buckets 1, 2, 4, ..., {M_BUCKETS[-1]}, "
                                        f"found {bucket!r}")
            problem = row_problem(route.split("/", 1)[0], row, moe=True)
            if problem is not None:
                raise InvalidInputError(f"measured[{route!r}][{bucket!r}]{problem}")
            assert isinstance(row, dict)  # (row_problem says so)
            rows[m] = dict(row)
    return out


@dataclass(frozen=True)
class _RouteRows:
    versions: Mapping[str, str]
    exact: bool
    shapes: Mapping[str, Mapping[int, Mapping[str, Any]]]


def _with_skewed(uniform: MoeEstimate, skewed: MoeEstimate | None) -> MoeEstimate:
    if skewed is None:
        return uniform
    return replace(uniform, skewed_us=skewed.us, detail=f"{uniform.detail}; under skewed routing {skewed.us:.1f} us")


class MoeMeasurements:
    """The MoE rows of one device's tables, per ``backend/layout`` (immutable once built)."""

    def __init__(self, tables: Iterable[Mapping[str, Any]], installed: Mapping[str, Mapping[str, str]]) -> None:
        """``tables``: valid tables of one device, later ones winning; ``installed``: per backend name, the
        versions found here (:func:`~fp8select.measured.table.backend_versions`)."""
        groups: dict[str, dict[tuple[tuple[str, str], ...], dict[str, dict[int, Mapping[str, Any]]]]] = {}
        for table in tables:
            for entry in table.get("moe", ()):
                route = f"{entry['backend']}/{entry['layout']}"
                shapes = groups.setdefault(route, {}).setdefault(tuple(sorted(entry["versions"].items())), {})
                for shape, buckets in entry["shapes"].items():
                    shapes.setdefault(shape, {}).update({int(b): dict(r) for b, r in buckets.items()})
        self._rows: dict[str, _RouteRows] = {}
        for route, by_versions in groups.items():
            key, exact = used_versions(by_versions, installed.get(route.split("/", 1)[0], {}))
            self._rows[route] = _RouteRows(dict(key), exact, by_versions[key])
        self._model, self._skewed = (MoeModel({route: {_shape_of(s): {b: float(r[key]) for b, r in buckets.items() if key in r}
                                                       for s, buckets in rows.shapes.items()}
                                               for route, rows in self._rows.items()}) for key in ("us", "skewed_us"))

    def __bool__(self) -> bool:
        return bool(self._rows)

    @property
    def routes(self) -> tuple[str, ...]:
        return tuple(sorted(self._rows))

    def times(self, experts: int, hidden: int, intermediate: int, top_k: int) -> dict[str, dict[int, Mapping[str, Any]]]:
        """The rows of one layer shape: ``"backend/layout"`` -> bucket -> ``{"us", "config"?}`` (empty: none)."""
        key = moe_shape_key(experts, hidden, intermediate, top_k)
        return {route: dict(rows.shapes[key]) for route, rows in self._rows.items() if rows.shapes.get(key)}

    def estimates(self, experts: int, hidden: int, intermediate: int, top_k: int) -> dict[str, dict[int, MoeEstimate]]:
        """Per route and M bucket, the modelled time of one layer shape from the measured shapes (routes
        measured at no shape at a bucket have no estimate there), and under skewed routing from the rows
        that hold that time (``skewed_us``, where there are any). The plan reads them only for buckets with
        no measured row, and ranks them as it ranks measured rows."""
        shape = (experts, hidden, intermediate, top_k)
        out: dict[str, dict[int, MoeEstimate]] = {}
        for route in self._rows:
            found = {b: _with_skewed(e, self._skewed.estimate(route, shape, b)) for b in M_BUCKETS
                     if (e := self._model.estimate(route, shape, b)) is not None}
            if found:
                out[route] = found
        return out

    def describe(self) -> str:
        """One line per backend/layout: how many MoE shapes, and at which versions."""
        lines = []
        for route, rows in sorted(self._rows.items()):
            which = "installed versions" if rows.exact else f"other versions ({versions_text(rows.versions)})"
            lines.append(f"{route}: {len(rows.shapes)} MoE shapes measured, {which}")
        return "\n".join(lines)


def _shape_of(key: str) -> MoeShape:
    e, h, i, k = (int(v) for v in key.split(","))
    return e, h, i, k
