"""The import graph goes one way: every module imports only modules of its own layer or below
(type-only and lazy imports count too), no circle, and the call path never reaches measurement code."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fp8select"
# The layers, bottom first (a name ending in * is a package and everything in it). docs/architecture.md
# says what each holds and why ``resolve()`` and ``nn`` sit above measurement.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fp8select._version", "fp8select._log", "fp8select.errors", "fp8select.verdict", "fp8select.names",
     "fp8select.buckets", "fp8select.problem", "fp8select.roofline", "fp8select.guard", "fp8select.dropin",
     "fp8select.capabilities"),                                          # values and typed errors
    ("fp8select.detect",),                                               # the one place that reads the machine
    ("fp8select.probes*",),                                              # pure predicates over the snapshot
    ("fp8select.kernels*",),                                             # kernels, configurations, layouts
    ("fp8select.backends*",),                                            # gates, prepare, bind, run
    ("fp8select.plugins", "fp8select.decision"),                         # the choice: a Decision
    ("fp8select.measured*",),                                            # the measured data plans read
    ("fp8select.inputs", "fp8select.routes", "fp8select.plan",
     "fp8select.moe_plan"),                                              # typed checks; per layer: a route per M bucket
    ("fp8select.ops", "fp8select.layer", "fp8select.warmup", "fp8select.jit_processes",
     "fp8select.moe_ops", "fp8select.moe", "fp8select.grouped"),         # the call path
    ("fp8select.distributed", "fp8select.moe_select", "fp8select.selection"),  # ranks agreeing; the facade
    ("fp8select.verify", "fp8select.verify_chain"),                      # verification of a chain
    ("fp8select.measure*",),                                             # timing, bench, tune, load-time measuring
    ("fp8select.resolver",),                                             # resolve(): facts to a settled Selection
    ("fp8select.nn", "fp8select.integrations*", "fp8select.jit_worker"),  # modules that resolve when not given one
    ("fp8select.cli", "fp8select.cli_moe", "fp8select.cli_files", "fp8select.__main__", "fp8select._docs",
     "fp8select"),                                                       # the command line, the package
)
MEASUREMENT = {"fp8select.measure.bench", "fp8select.measure.tune", "fp8select.measure.loadtime"}
CALL_PATH = ("fp8select.layer", "fp8select.ops", "fp8select.plan", "fp8select.routes", "fp8select.moe", "fp8select.moe_ops",
             "fp8select.moe_plan")


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


def _layer(module: str) -> int:
    for index, names in enumerate(LAYERS):
        for name in names:
            if module == name.rstrip("*") or (name.endswith("*") and module.startswith(name[:-1] + ".")):
                return index
    raise AssertionError(f"{module} is in no layer of LAYERS: place it")


def test_every_module_imports_only_its_layer_and_below() -> None:
    graph = _graph()
    climbs = sorted(f"{m} -> {t}" for m in graph for t in graph[m] if _layer(t) > _layer(m))
    assert not climbs, f"imports that climb to a higher layer: {climbs}"
