"""The command line's MoE parts: ``explain``'s MoE verdicts and ``--moe E,H,I,k`` plans, and ``tune --moe``.

``explain`` lists every built-in MoE experts backend with its verdict on the (detected or replayed)
snapshot, the MoE chain and the MoE rows of the tuning tables; each ``--moe`` shape adds its plan:
per M range the backend and layout, its configuration and why (``measured``, ``model``, ``rule``, ``gate`` or
``explicit``: :mod:`fp8select.moe_plan`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from fp8select.errors import BatchInvariantError, Fp8SelectError, NoBackendError
from fp8select.measured.moe import MOE_SHAPES, parse_moe_shape, parse_moe_shapes
from fp8select.moe_select import moe_measurements, moe_plan_for, moe_verdicts
from fp8select.selection import Selection

__all__ = ["MOE_HELP", "MOE_TUNE_HELP", "explain_moe", "parse_explain_shapes", "tune_moe_command"]

MOE_HELP = ("also show the plan a MoE experts layer of this shape gets (E experts, hidden H, intermediate I, top-k k; "
            f"or a name: {', '.join(MOE_SHAPES)}): per M range the backend, layout and why (repeatable)")
MOE_TUNE_HELP = (f"MoE experts layers to measure instead of (or with --shapes, besides) dense ones: names ({', '.join(MOE_SHAPES)}; "
                 "'all' for every one) and/or E,H,I,k groups, e.g. 'all' or 'deepseek-v3-e32;64,4096,1024,6'")


def parse_explain_shapes(texts: Sequence[str]) -> list[tuple[int, int, int, int]]:
    return [parse_moe_shape(text) for text in texts]


def explain_moe(selection: Selection, shapes: Sequence[tuple[int, int, int, int]]) -> tuple[str, dict[str, Any]]:
    """``explain``'s MoE section as text and as JSON. Raises :class:`NoBackendError` when ``shapes`` are
    asked for and no MoE backend runs here."""
    verdicts = moe_verdicts(selection)
    chain = tuple(b for b, c in verdicts if c.accepted)
    table = moe_measurements(selection, chain, selection.tables) if chain else None
    width = max([len("backend")] + [len(b.name) for b, _ in verdicts])
    lines = ["MoE experts backends (explain --moe E,H,I,k shows a layer's plan)", "",
             f"{'rank':>4}  {'backend':<{width}}  {'verdict':<8}  {'layouts':<19}  reason"]
    for backend, c in verdicts:
        lines.append(f"{c.rank:>4}  {c.name:<{width}}  {'ok' if c.accepted else 'rejected':<8}  "
                     f"{'/'.join(backend.layouts):<19}  {c.reason}")
    lines.append("")
    lines.append("MoE chain: " + (" -> ".join(b.name for b in chain) if chain else "none (MoE layers cannot run here)"))
    if table is not None:
        lines.append("MoE measurements: " + ", ".join(selection.tuning_sources))
        lines.extend("  " + line for line in table.describe().splitlines())
    else:
        lines.append("MoE measurements: none for this device, so MoE plans follow the rule (docs/moe.md)")
    if selection.batch_invariant and selection.invariance is not None:
        lines.append("MoE batch-invariance (one route and configuration for every M):")
        for b in chain:
            for layout in b.layouts:
                options, why = selection.invariance.options(b, explicit=b.name == selection.explicit, layout=layout)
                lines.append(f"  {b.name}/{layout}: " + ("; ".join(o.why for o in options) if options else f"not used: {why}"))
    if shapes and not chain:
        raise NoBackendError("MoE experts layers", [c for _, c in verdicts])
    texts, plans = [], []
    for shape in shapes:
        try:
            plan = moe_plan_for(selection, chain, *shape, table=table, invariance=selection.invariance
                                if selection.batch_invariant else None)
        except BatchInvariantError as exc:  # no route runs this layer batch-invariant: say why, per route
            texts.append(f"MoE plan for E={shape[0]}, H={shape[1]}, I={shape[2]}, k={shape[3]}: {exc}")
            plans.append({"experts": shape[0], "hidden": shape[1], "intermediate": shape[2], "top_k": shape[3],
                          "error": str(exc)})
            continue
        texts.append(plan.describe())
        plans.append(plan.to_dict())
    data = {"verdicts": [{**c.to_dict(), "layouts": list(b.layouts)} for b, c in verdicts],
            "chain": [b.name for b in chain], "measured_routes": list(table.routes) if table else [],
            "plans": plans}
    return "\n\n".join(["\n".join(lines), *texts]), data


def tune_moe_command(args: argparse.Namespace, selection: Selection, known: dict[str, Any], done: dict[str, Any] | None,
                     save_so_far: Callable[[dict[str, Any]], None],
                     backends: Sequence[str] = ()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``tune --moe``: measure the MoE shapes the tables lack (:func:`fp8select.measure.tune_moe.tune_moe`);
    ``backends``: the canonical names and routes of ``--backends``."""
    from fp8select.measure.bench import parse_ms
    from fp8select.measure.tune_moe import tune_moe

    shapes = parse_moe_shapes(args.moe)
    ms = parse_ms(args.m)
    try:
        return tune_moe(selection, shapes, ms, known=known, force=args.force, done=done, replays=args.replays,
                        max_configs=args.max_configs, budget_s=args.budget_s,
                        backends=list(backends) or None,
                        progress=lambda line: print(line, flush=True), on_shape=save_so_far)
    except NoBackendError as exc:
        raise Fp8SelectError(f"tune --moe: {str(exc).splitlines()[0]}") from None
