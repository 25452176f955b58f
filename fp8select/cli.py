"""``python -m fp8select``: ``probe`` prints this machine's snapshot, ``explain`` the decision."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from fp8select.bench import DEFAULT_M
from fp8select.capabilities import Capabilities, detect_capabilities
from fp8select.errors import BackendRejectedError, Fp8SelectError, NoBackendError
from fp8select.resolver import parse_names, resolve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fp8select", description="Choose and explain the block-FP8 linear backend.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("probe", help="print this machine's capability snapshot as JSON")
    ex = sub.add_parser("explain", help="show every backend's verdict and the choice")
    ex.add_argument("--json", action="store_true", help="machine-readable output")
    ex.add_argument("--capabilities", metavar="FILE", help="replay a snapshot written by `probe` instead of detecting")
    ex.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                    help="override a snapshot field (repeatable), e.g. --set device_kind=xpu --set torch_version=2.11.0")
    ex.add_argument("--backend", metavar="NAME", help="explicit choice (as FP8SELECT_BACKEND)")
    ex.add_argument("--disable", metavar="A,B", default="", help="backends to leave out (as FP8SELECT_DISABLE)")
    ex.add_argument("--no-plugins", action="store_true", help="do not load entry-point plugins")
    be = sub.add_parser("bench", help="check and time every accepted backend on this GPU, per shape")
    be.add_argument("--shapes", default="deepseek-v3", help="'deepseek-v3' (default) or N,K pairs, e.g. 2112,7168,4096,7168")
    be.add_argument("--m", default=",".join(str(m) for m in DEFAULT_M), help="comma list of M (rows)")
    be.add_argument("--backends", default="", help="comma list (default: every accepted backend but reference)")
    be.add_argument("--replays", type=int, default=50, help="CUDA-graph replays per timing (median reported)")
    be.add_argument("--json", metavar="FILE", help="write the raw rows with device name and versions")
    be.add_argument("--plot", metavar="FILE.png", help="plot time against M per shape (needs matplotlib)")
    be.add_argument("--budget-s", type=float, default=float("inf"), help="start no new shape after this many seconds")
    tu = sub.add_parser("tune", help="measure per (N, K, M bucket) and write a tuning table for prepare() to use")
    tu.add_argument("--shapes", default="deepseek-v3", help="'deepseek-v3' (default) and/or N,K pairs")
    tu.add_argument("--m", default=",".join(str(m) for m in DEFAULT_M), help="comma list of M (one per bucket is enough)")
    tu.add_argument("--out", metavar="FILE", help="write the table here instead of the cache directory")
    tu.add_argument("--force", action="store_true", help="measure again what the tables already hold for these versions")
    tu.add_argument("--backends", default="", help="comma list of backends to measure (default: the chain but reference)")
    tu.add_argument("--json", metavar="FILE", help="also write every timing measured")
    tu.add_argument("--replays", type=int, default=30, help="CUDA-graph replays per timing")
    tu.add_argument("--max-configs", type=int, default=10, help="Triton configurations tried per (N, K, M)")
    tu.add_argument("--budget-s", type=float, default=float("inf"), help="stop starting new points after this many seconds")
    return parser


def _snapshot(args: argparse.Namespace) -> Capabilities:
    if args.capabilities:
        try:
            with open(args.capabilities, encoding="utf-8") as fh:
                caps = Capabilities.from_json(fh.read())
        except OSError as exc:
            raise Fp8SelectError(f"--capabilities: cannot read {args.capabilities!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise Fp8SelectError(f"--capabilities: expected UTF-8 JSON text in {args.capabilities!r}, "
                                 f"found byte {exc.object[exc.start]:#04x} at position {exc.start}") from None
    else:
        caps = detect_capabilities()
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Fp8SelectError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    return caps.with_overrides(overrides) if overrides else caps


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "probe":
            print(detect_capabilities().to_json())
            return 0
        if args.command == "bench":
            return _bench(args)
        if args.command == "tune":
            return _tune(args)
        caps = _snapshot(args)
        selection = resolve(caps, backend=args.backend or None, disable=parse_names(args.disable),
                            plugins=not args.no_plugins)
    except (BackendRejectedError, NoBackendError) as exc:
        if getattr(args, "json", False):
            print(json.dumps({"backend": None, "error": str(exc).splitlines()[0],
                              "verdicts": [c.to_dict() for c in exc.candidates]}, indent=2))
        else:
            print(f"fp8select: {exc}", file=sys.stderr)
        return 1
    except Fp8SelectError as exc:
        print(f"fp8select: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(selection.to_dict(), indent=2) if args.json else selection.explain())
    return 0


def _bench(args: argparse.Namespace) -> int:
    import torch

    from fp8select import bench

    shapes, ms = bench.parse_shapes(args.shapes), bench.parse_ms(args.m)
    if args.replays < 1:
        raise Fp8SelectError(f"--replays: expected a positive integer, found {args.replays}")
    if not torch.cuda.is_available():
        raise Fp8SelectError("bench: needs a CUDA GPU, found none")
    selection = resolve()
    backends = parse_names(args.backends) or None
    print(f"fp8select bench on {torch.cuda.get_device_name(0)}: chain {' -> '.join(b.name for b in selection.chain)}", flush=True)
    rows = bench.measure(selection, shapes, ms, backends=backends, replays=args.replays, budget_s=args.budget_s,
                         progress=lambda line: print(line, flush=True))
    print(bench.format_table(rows))
    figures = bench.summary(rows)
    print("summary: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"environment": bench.environment(), "chain": [b.name for b in selection.chain],
                       "tuning_sources": list(selection.tuning_sources), "summary": figures,
                       "capabilities": selection.capabilities.to_dict(), "rows": rows}, fh, indent=1)
    if args.plot:
        try:
            bench.plot(rows, args.plot)
        except ImportError:
            print("fp8select: --plot needs matplotlib (pip install 'fp8select[plot]')", file=sys.stderr)
    failed = [r for r in rows if r.get("correct") is False or "error" in r]
    return 1 if failed else 0


def _tune(args: argparse.Namespace) -> int:
    import torch

    from fp8select import bench
    from fp8select.tuning.sources import find_tables
    from fp8select.tuning.table import cache_dir, load_table, merge_tables, new_table, save_table, table_path
    from fp8select.tuning.tune import tune

    shapes, ms = bench.parse_shapes(args.shapes), bench.parse_ms(args.m)
    if args.replays < 1 or args.max_configs < 1:
        raise Fp8SelectError(f"--replays/--max-configs: expected positive integers, found {args.replays}/{args.max_configs}")
    if not torch.cuda.is_available():
        raise Fp8SelectError("tune: needs a CUDA GPU, found none")
    selection = resolve()
    caps = selection.capabilities
    device = caps.device_name or "unknown"
    path = args.out or str(table_path(cache_dir(caps.env), device))
    known = new_table(device)
    for _, found in find_tables(caps):
        known = merge_tables(known, found)
    print(f"fp8select tune on {device}: chain {' -> '.join(b.name for b in selection.chain)}", flush=True)
    existing = load_table(path, device)

    def save(measured: dict[str, Any]) -> None:  # after every shape: an interrupted run keeps what it measured
        save_table(path, merge_tables(existing, measured) if existing is not None else measured)

    table, rows = tune(selection, shapes, ms, known=known, force=args.force, replays=args.replays,
                       max_configs=args.max_configs, budget_s=args.budget_s, backends=parse_names(args.backends) or None,
                       progress=lambda line: print(line, flush=True), on_shape=save)
    save(table)
    measured = sum(len(b) for g in table["groups"] for b in g["shapes"].values())
    print(f"{measured} new measurements ({', '.join(g['backend'] for g in table['groups']) or 'none missing'}) written to {path}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"environment": bench.environment(), "table": table, "rows": rows}, fh, indent=1)
    return 0
