"""Distil a ``benchmarks.limits`` report into the small JSON kept under ``benchmarks/results/``.

    python -m benchmarks.distill_limits limits.json distilled.json

Keeps the environment, the arguments, the launch floor and the summary, and one line per point:
at decode and prefill the table's and the sweep's best configuration (as
:meth:`TritonConfig.to_dict` mappings, which ``benchmarks.merge_tuning`` reads back) with their
times and the vendors'; the quantization points as measured. Drops the per-phase sweep
bookkeeping and the run's output path.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _decode(point: dict[str, Any]) -> dict[str, Any]:
    vendor = point.get("vendor") or {}
    return {"n": point["n"], "k": point["k"], "m": point["m"], "floor_us": point["floor_us"],
            "table_us": point["table"]["us"], "table_frac": point["table"]["frac"], "table_config": point["table"]["config"],
            "sweep_us": point["sweep"]["us"], "sweep_frac": point["sweep"]["frac"], "sweep_config": point["sweep"]["config"],
            "vendor": vendor.get("name"), "vendor_us": vendor.get("us"), "vendor_frac": vendor.get("frac")}


def _prefill(point: dict[str, Any]) -> dict[str, Any]:
    return {"n": point["n"], "k": point["k"], "m": point["m"], "tried": point["tried"],
            "table_us": point["table"]["us"], "table_config": point["table"]["config"],
            "sweep_us": point["sweep"]["us"], "sweep_config": point["sweep"]["config"],
            "layer_us": point.get("triton_layer_us"), "vendors_us": point.get("vendors_us")}


def json_lines(head: Mapping[str, Any], lists: Mapping[str, Sequence[Any]], per_line: int = 1) -> str:
    """JSON text of ``head`` and ``lists`` (empty lists left out) with a header key per line and
    ``per_line`` list items per line: the form results are kept in (small diffs, a point or a shape's
    points per line)."""
    def rows(items: Sequence[Any]) -> list[str]:
        return ["  " + ", ".join(json.dumps(item) for item in items[i:i + per_line])
                for i in range(0, len(items), per_line)]

    lines = [f' "{k}": {json.dumps(v)}' for k, v in head.items()]
    lines += [f' "{k}": [\n' + ",\n".join(rows(items)) + "\n ]" for k, items in lists.items() if items]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def portable(path: str) -> str:
    """``path`` as results and tables name it: relative to the working directory (the repository) where it lies
    inside it, else its file name after ``.../``: the file, not the machine it was measured or written on."""
    if not os.path.isabs(path):
        return path
    inside = os.path.commonpath([path, os.getcwd()]) == os.getcwd()
    return os.path.relpath(path) if inside else ".../" + os.path.basename(path)


def distill(report: dict[str, Any]) -> str:
    """The distilled report as JSON text: a header key per line, a point per line."""
    head = {"source": report.get("source", "benchmarks/limits.py"), "environment": report["environment"],
            "args": {k: v for k, v in report["args"].items() if k != "out"}, "launch_floor": report.get("launch_floor"),
            "summary": report["summary"]}
    return json_lines(head, {phase: [row(p) for p in (report.get(phase) or {}).get("points") or []
                                     if phase == "quant" or "sweep" in p]
                             for phase, row in (("decode", _decode), ("quant", dict), ("prefill", _prefill))})


if __name__ == "__main__":
    text = distill(json.loads(Path(sys.argv[1]).read_text()))
    json.loads(text)
    Path(sys.argv[2]).write_text(text)
