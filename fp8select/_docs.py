"""The backend requirements table in ``docs/backends.md``, generated from the declarations.

A test regenerates it and compares, so the documentation cannot drift from the code.
Regenerate with ``python -c "import fp8select._docs as d; d.write()"``.
"""

from __future__ import annotations

from pathlib import Path

from fp8select.backends import BUILTIN_BACKENDS, DEFAULT_ORDER
from fp8select.problem import dtype_name

BEGIN = "<!-- BEGIN GENERATED: backend requirements -->"
END = "<!-- END GENERATED: backend requirements -->"


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


def generated_section() -> str:
    return f"{BEGIN}\n{backends_table()}\n{END}"


def write(path: str | Path = "docs/backends.md") -> None:
    target = Path(path)
    text = target.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    target.write_text(text[:start] + generated_section() + text[end:], encoding="utf-8")
