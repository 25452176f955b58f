"""The import graph goes one way: no circle among fp8select's modules (type-only and lazy imports
count too), and the call path never reaches measurement code."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fp8select"
MEASUREMENT = {"fp8select.measure.bench", "fp8select.measure.tune", "fp8select.measure.loadtime"}
CALL_PATH = ("fp8select.layer", "fp8select.ops", "fp8select.plan")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_no_import_circle() -> None:
    graph = _graph()
    circles = sorted(m for m in graph if m in _reach(graph, m) and m != "fp8select")
    assert not circles, f"modules that import themselves through others: {circles}"


def test_the_call_path_imports_no_measurement_code() -> None:
    graph = _graph()
    for module in CALL_PATH:
        assert not _reach(graph, module) & MEASUREMENT, module
