"""The tables of the docs generated from the code: the backend requirements in ``docs/backends.md``
(from the declarations) and the served shapes in ``docs/measurements.md`` (from the model catalogue
and the shipped tables).

A test regenerates them and compares, so the documentation cannot drift from the code.
Regenerate with ``python -c "import fp8select._docs as d; d.write()"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fp8select.backends import BUILTIN_BACKENDS, DEFAULT_ORDER
from fp8select.measured.shapes import MODELS, TP_DEGREES, served_shapes, unserved
from fp8select.measured.table import SHIPPED_DIR
from fp8select.problem import dtype_name


def backends_table() -> str:
    by_name = {b.name: b for b in BUILTIN_BACKENDS}
    rows = ["| rank | backend | device-level requirements | problem-level gate | implemented |",
            "| --- | --- | --- | --- | --- |"]
    for rank, name in enumerate(DEFAULT_ORDER, 1):
        b = by_name[name]
        requires = "<br>".join(p.requirement for p in b.requires) or "none"
        gate = [
            "blocks " + ", ".join(f"[{bn}, {bk}]" for bn, bk in b.block_sizes),
            "output " + "/".join(dtype_name(d) for d in b.out_dtypes),
        ]
        if b.n_multiple > 1:
            gate.append(f"N % {b.n_multiple} == 0")
        if b.k_multiple > 1:
            gate.append(f"K % {b.k_multiple} == 0")
        m_rule = (b.supports_m.__doc__ or "").strip().splitlines()[0] if b.supports_m.__doc__ else ""
        if m_rule and "every M" not in m_rule:
            gate.append(m_rule)
        rows.append(f"| {rank} | `{name}` | {requires} | {'<br>'.join(gate)} | {'yes' if b.implemented else 'not yet'} |")
    return "\n".join(rows)


def served_shapes_table() -> str:
    """Every served shape, what it serves, and which shipped tables hold it; then the degrees not served."""
    shipped = {}
    for path in sorted(SHIPPED_DIR.glob("tuning-*.json")):
        table = json.loads(path.read_text(encoding="utf-8"))
        shipped[table["device_name"]] = {s for g in table["groups"] for s in g["shapes"]}
    rows = ["| N x K | serves (projection, tensor-parallel degrees) | in the shipped table of |", "| --- | --- | --- |"]
    for shape in served_shapes():
        where = [device for device, keys in shipped.items() if f"{shape.n},{shape.k}" in keys]
        rows.append(f"| {shape.n} x {shape.k} | {shape.describe()} | {', '.join(where) or '-'} |")
    rows.append("")
    sources = "; ".join(f"{m.title} ({m.source})" for m in MODELS.values())
    missing = "; ".join(f"{MODELS[name].title} at TP {tp} ({why})" for name, tp, why in unserved()) or "none"
    rows.append(f"Configurations (`config.json` on Hugging Face): {sources}. Degrees {'/'.join(map(str, TP_DEGREES))} "
                f"not served: {missing}.")
    return "\n".join(rows)


SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "backend requirements": ("docs/backends.md", backends_table),
    "served shapes": ("docs/measurements.md", served_shapes_table),
}


def generated_section(name: str = "backend requirements") -> str:
    return f"<!-- BEGIN GENERATED: {name} -->\n{SECTIONS[name][1]()}\n<!-- END GENERATED: {name} -->"


def write(root: str | Path = ".") -> None:
    """Regenerate every section in place, in the docs under ``root``."""
    for name, (path, _) in SECTIONS.items():
        target = Path(root) / path
        text = target.read_text(encoding="utf-8")
        begin, end = f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"
        start, stop = text.index(begin), text.index(end) + len(end)
        target.write_text(text[:start] + generated_section(name) + text[stop:], encoding="utf-8")
