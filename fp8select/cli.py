"""``fp8select`` / ``python -m fp8select``: ``probe`` prints this machine's snapshot, ``explain``
the decision, ``bench`` and ``tune`` measure on a CUDA GPU.

Every error the user can cause is one line on stderr (exit 2; exit 1 when an explicitly
requested backend is rejected, with every verdict once), never a traceback. Output piped into
a reader that stops early (``explain --json | head``) ends quietly. ``tune`` checks that it can
write its table before it measures, and never loses what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fp8select.capabilities import Capabilities
from fp8select.cli_files import check_writable, save_or_rescue, write_json
from fp8select.cli_moe import MOE_HELP, MOE_TUNE_HELP, explain_moe, parse_explain_shapes, tune_moe_command
from fp8select.detect import detect_capabilities
from fp8select.errors import BackendRejectedError, BatchInvariantError, Fp8SelectError, NoBackendError
from fp8select.measure.bench import DEFAULT_M
from fp8select.measured.moe import parse_moe_shapes
from fp8select.names import canonical
from fp8select.resolver import parse_names, resolve

DESCRIPTION = "Choose, explain and run the kernel for block-wise FP8 linear layers."
EPILOG = ("Backend names ignore case and surrounding blanks, and take the spellings engines use "
          "(deep_gemm, deep-gemm); 'auto' means no explicit choice. The environment (FP8SELECT_BACKEND, "
          "FP8SELECT_DISABLE, ...) is read on every run.")
SHAPES_HELP = ("model names and/or N,K pairs: 'deepseek-v3' (default), kimi-k2, qwen3-8b, ... at tensor-parallel degree 1; "
               "NAME:tp4 at one degree, NAME:all at 1/2/4/8, 'served' every model at every degree (docs/measurements.md); "
               "e.g. qwen3-32b:tp4,2112,7168")


def _prog() -> str:
    """``fp8select`` when run as the installed script, ``python -m fp8select`` when run as a module."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return "python -m fp8select" if os.path.basename(argv0) == "__main__.py" else "fp8select"


def _parser() -> argparse.ArgumentParser:
    from fp8select._version import __version__

    parser = argparse.ArgumentParser(prog=_prog(), description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{probe,explain,bench,tune}")
    sub.add_parser("probe", help="print this machine's capability snapshot as JSON",
                   description="Print this machine's capability snapshot (device, torch, packages, environment) as "
                               "JSON: attach it to a bug report, or replay it with `explain --capabilities FILE`.")
    ex = sub.add_parser("explain", help="show every backend's verdict and the choice",
                        description="Show every backend's verdict (chosen, ok or rejected, and why) and the fallback "
                                    "chain, for this machine or for a replayed or edited snapshot.",
                        epilog=EPILOG)
    ex.add_argument("--json", action="store_true", help="machine-readable output")
    ex.add_argument("--capabilities", metavar="FILE", help="replay a snapshot written by `probe` ('-' reads standard input)")
    ex.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                    help="override a snapshot field (repeatable), e.g. --set device_kind=xpu --set torch_version=2.11.0")
    ex.add_argument("--backend", metavar="NAME", help="explicit choice (as FP8SELECT_BACKEND; 'auto' for none)")
    ex.add_argument("--disable", metavar="A,B", default="", help="backends to leave out (as FP8SELECT_DISABLE)")
    ex.add_argument("--no-plugins", action="store_true", help="do not load entry-point plugins")
    ex.add_argument("--batch-invariant", action="store_true",
                    help="batch-invariant plans (as FP8SELECT_BATCH_INVARIANT=1): which backends may run them, and why")
    ex.add_argument("--layer", metavar="N,K", action="append", default=[],
                    help="also show the plan a layer of this shape gets: per M range the backend and why (repeatable)")
    ex.add_argument("--moe", metavar="E,H,I,k", action="append", default=[], help=MOE_HELP)
    be = sub.add_parser("bench", help="check and time every accepted backend on this GPU, per shape",
                        description="On a CUDA GPU: check every accepted backend against an fp64 reference, then time "
                                    "it (CUDA-graph replay, weights rotated past the L2) per shape and M; prints a table "
                                    "with the winner and the choice prepare() makes.")
    be.add_argument("--shapes", default="deepseek-v3", help=SHAPES_HELP)
    be.add_argument("--m", default=",".join(str(m) for m in DEFAULT_M), help="comma list of M (rows)")
    be.add_argument("--backends", default="", help="comma list (default: every accepted backend but reference)")
    be.add_argument("--replays", type=int, default=50, help="CUDA-graph replays per timing (median reported)")
    be.add_argument("--json", metavar="FILE", help="write the raw rows with device name and versions")
    be.add_argument("--plot", metavar="FILE.png", help="plot time against M per shape (needs matplotlib)")
    be.add_argument("--budget-s", type=float, default=math.inf, help="start no new shape after this many seconds")
    tu = sub.add_parser("tune", help="measure per (N, K, M bucket) and write a tuning table for prepare() to use",
                        description="On a CUDA GPU: measure every accepted backend and search Triton launch "
                                    "configurations per (N, K, M bucket), then write the tuning table that resolve() "
                                    "finds for this device and software stack (into the cache directory: "
                                    "FP8SELECT_CACHE_DIR, else $XDG_CACHE_HOME/fp8select or ~/.cache/fp8select). "
                                    "The output locations are checked before measuring.")
    tu.add_argument("--shapes", default=None, help=SHAPES_HELP + " (default deepseek-v3 unless --moe is given)")
    tu.add_argument("--moe", metavar="SHAPES", help=MOE_TUNE_HELP)
    tu.add_argument("--m", default=",".join(str(m) for m in DEFAULT_M), help="comma list of M (one per bucket is enough)")
    tu.add_argument("--out", metavar="FILE", help="write the table here instead of the cache directory")
    tu.add_argument("--force", action="store_true", help="measure again what the tables already hold for these versions")
    tu.add_argument("--resume", action="store_true",
                    help="with --force: measure again only what the output table does not hold yet "
                         "(a forced run cut short goes on where it stopped)")
    tu.add_argument("--backends", default="", help="comma list of backends to measure (default: the chain but reference)")
    tu.add_argument("--json", metavar="FILE", help="also write every timing measured")
    tu.add_argument("--replays", type=int, default=30, help="CUDA-graph replays per timing")
    tu.add_argument("--max-configs", type=int, default=10, help="Triton configurations tried per (N, K, M)")
    tu.add_argument("--budget-s", type=float, default=math.inf, help="stop starting new points after this many seconds")
    return parser


def _snapshot(args: argparse.Namespace) -> Capabilities:
    if args.capabilities is not None:
        caps = _read_snapshot(args.capabilities)
    else:
        caps = detect_capabilities()
    overrides: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise Fp8SelectError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value.strip()
    return caps.with_overrides(overrides) if overrides else caps


def _read_snapshot(name: str) -> Capabilities:
    if not name:
        raise Fp8SelectError("--capabilities: expected a file name (or - for standard input), found ''")
    try:
        if name == "-":
            raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        else:
            with open(name, "rb") as fh:
                raw = fh.read()
    except OSError as exc:
        raise Fp8SelectError(f"--capabilities: cannot read {name!r}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Fp8SelectError(f"--capabilities: expected UTF-8 JSON text in {name!r}, "
                             f"found byte {exc.object[exc.start]:#04x} at position {exc.start}") from None
    return Capabilities.from_json(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 done, 1 rejected or failed, 2 bad input)."""
    for stream in (sys.stdout, sys.stderr):  # a device name or env value this terminal cannot show is escaped
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    try:
        with _library_events_silenced():
            code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`explain --json | head`): what it wanted it has. Point stdout at
        # devnull so that the interpreter's final flush does not fail again, and stop quietly.
        _stdout_to_devnull()
        return 1
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):
            print("fp8select: interrupted", file=sys.stderr)
        return 130


@contextlib.contextmanager
def _library_events_silenced() -> Iterator[None]:
    """No fp8select log line printed by Python's last-resort handler while the CLI runs.

    The CLI prints every decision itself (a rejection is one error message with every verdict);
    the library's own events (``fp8select.resolved``) would repeat it as a log line when the
    process has no logging configured. A host that configured logging still receives them.
    """
    logger = logging.getLogger("fp8select")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor (captured, replaced)
        pass


def _main(argv: Sequence[str] | None) -> int:
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
        layers = [_layer_shape(text) for text in args.layer]
        moe_shapes = parse_explain_shapes(args.moe)
        selection = resolve(caps, backend=args.backend, disable=args.disable, plugins=not args.no_plugins,
                            batch_invariant=True if args.batch_invariant else None)
        plans = [selection.plan_for(n, k) for n, k in layers]
        moe_text, moe_data = explain_moe(selection, moe_shapes)
    except (BackendRejectedError, BatchInvariantError, NoBackendError) as exc:
        if args.command == "explain" and args.json:
            print(json.dumps({"backend": None, "error": str(exc).splitlines()[0],
                              "verdicts": [c.to_dict() for c in exc.candidates]}, indent=2))
        else:
            print(f"fp8select: error: {exc}", file=sys.stderr)
        return 1
    except Fp8SelectError as exc:
        print(f"fp8select: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    at_load = [_measured_at_load(selection, n, k) for n, k in layers]
    if args.json:
        print(json.dumps({**selection.to_dict(), "plans": [{**plan.to_dict(), "measured_at_load": buckets}
                                                           for plan, buckets in zip(plans, at_load, strict=True)],
                          "moe": moe_data}, indent=2))
    else:
        described = [plan.describe() + (f"\nprepare() measures this shape first at M buckets {', '.join(map(str, buckets))} "
                                        "(closest contests first, within the load-time budget): the plan above is the "
                                        "model's, before that" if buckets else "")
                     for plan, buckets in zip(plans, at_load, strict=True)]
        print("\n\n".join([selection.explain(), *described, moe_text]))
    return 0


def _measured_at_load(selection: Any, n: int, k: int) -> list[int]:
    """The M buckets ``prepare()`` would measure for an (N, K) layer at load time (none where it does not)."""
    if not selection.tune_at_load:
        return []
    from fp8select.measure.loadtime import points_to_measure

    return [bucket for bucket, _ in points_to_measure(selection.chain, selection.capabilities, selection.measurements, n, k)]


def _layer_shape(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        n, k = (int(p) for p in parts)
    except ValueError:
        n = k = 0
    if n <= 0 or k <= 0 or n > 2**31 or k > 2**31:
        raise Fp8SelectError(f"--layer {text!r}: expected N,K (two positive integers), e.g. --layer 7168,2048")
    return n, k


def _check_budget(args: argparse.Namespace) -> None:
    if math.isnan(args.budget_s) or args.budget_s < 0:
        raise Fp8SelectError(f"--budget-s: expected a non-negative number of seconds, found {args.budget_s}")


def _bench(args: argparse.Namespace) -> int:
    import torch

    from fp8select.measure import bench

    shapes, ms = bench.parse_shapes(args.shapes), bench.parse_ms(args.m)
    if args.replays < 1:
        raise Fp8SelectError(f"--replays: expected a positive integer, found {args.replays}")
    _check_budget(args)
    for name, label in ((args.json, "the rows (--json)"), (args.plot, "the plot (--plot)")):
        if name:
            check_writable(name, label)
    backends = parse_names(args.backends) or None
    if not torch.cuda.is_available():
        raise Fp8SelectError("bench: needs a CUDA GPU, found none")
    selection = resolve()
    print(f"fp8select bench on {torch.cuda.get_device_name(0)}: chain {' -> '.join(b.name for b in selection.chain)}", flush=True)
    rows = bench.measure(selection, shapes, ms, backends=backends, replays=args.replays, budget_s=args.budget_s,
                         progress=lambda line: print(line, flush=True))
    print(bench.format_table(rows))
    figures = bench.summary(rows)
    print("summary: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    saved = True
    if args.json:
        data = {"environment": bench.environment(), "chain": [b.name for b in selection.chain],
                "tuning_sources": list(selection.tuning_sources), "summary": figures,
                "capabilities": selection.capabilities.to_dict(), "rows": rows}
        saved = save_or_rescue(args.json, write_json(data), data, "bench rows")
    if args.plot:
        try:
            bench.plot(rows, args.plot)
        except ImportError:
            print("fp8select: --plot needs matplotlib (pip install 'fp8select[plot]')", file=sys.stderr)
        except OSError as exc:
            print(f"fp8select: error: cannot write the plot to {args.plot!r} ({exc.strerror or exc})", file=sys.stderr)
            saved = False
    failed = [r for r in rows if r.get("correct") is False or "error" in r]
    return 1 if failed or not saved else 0


def _tune_backends(args: argparse.Namespace, selection: Any) -> tuple[str, ...]:
    """``--backends`` as canonical names (``backend/layout`` routes for MoE layers too), each one this machine's
    ``tune`` can measure, else an error before anything is measured (a typo measured nothing and said so only as
    "0 new measurements")."""
    names = tuple(dict.fromkeys(
        "/".join((canonical(head), *(part.strip().lower() for part in rest)))
        for head, *rest in (n.split("/") for n in parse_names(args.backends or ""))))
    valid = {b.name for b in selection.chain} - {"reference"} if args.shapes is not None or args.moe is None else set()
    if args.moe is not None:
        from fp8select.moe_select import moe_chain

        with contextlib.suppress(NoBackendError):  # (tune --moe says so itself)
            moe = [b for b in moe_chain(selection) if b.name != "reference"]
            valid |= {b.name for b in moe} | {f"{b.name}/{layout}" for b in moe for layout in b.layouts}
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise Fp8SelectError(f"--backends: {', '.join(unknown)}: not among what tune measures here "
                             f"({', '.join(sorted(valid)) or 'nothing'})")
    return names


def _tune(args: argparse.Namespace) -> int:
    import torch

    from fp8select.measure import bench
    from fp8select.measure.tune import tune
    from fp8select.measured.sources import find_tables
    from fp8select.measured.table import add_rows, cache_dir, load_table, merge_tables, new_table, table_path

    # An empty --shapes or --moe (an unset variable) is an error, not the default shapes.
    shapes = bench.parse_shapes("deepseek-v3" if args.shapes is None else args.shapes) \
        if args.shapes is not None or args.moe is None else []
    ms = bench.parse_ms(args.m)
    if args.moe is not None:
        parse_moe_shapes(args.moe)  # malformed input fails before anything else
    args.out = args.out and str(Path(args.out).expanduser())  # --out=~/t.json: the shell leaves the ~
    if args.replays < 1 or args.max_configs < 1:
        raise Fp8SelectError(f"--replays/--max-configs: expected positive integers, found {args.replays}/{args.max_configs}")
    _check_budget(args)
    if args.resume and not args.force:
        raise Fp8SelectError("--resume: only with --force (without it, tune measures only what the tables lack, "
                             "the output table's rows included)")
    # Where the results go is checked before anything is measured (a measurement can take long).
    if args.out:
        check_writable(args.out, "the tuning table (--out)")
    else:
        check_writable(cache_dir(detect_capabilities().env), "the tuning table into the cache directory", directory=True,
                       hint="set FP8SELECT_CACHE_DIR to a writable directory, or pass --out FILE")
    if args.json:
        check_writable(args.json, "the timings (--json)")
    if not torch.cuda.is_available():
        raise Fp8SelectError("tune: needs a CUDA GPU, found none")
    selection = resolve()
    caps = selection.capabilities
    device = caps.device_name or "unknown"
    path = args.out or str(table_path(cache_dir(caps.env), device))
    known = new_table(device)
    for _, found in find_tables(caps):
        known = merge_tables(known, found)
    backends = _tune_backends(args, selection)
    print(f"fp8select tune on {device}: chain {' -> '.join(b.name for b in selection.chain)}", flush=True)
    existing = load_table(path, device)
    if existing is None and args.out and os.path.lexists(path):
        raise Fp8SelectError(f"--out {path}: holds no tuning table of {device} (the warning above says why); "
                             "pass another file, or move that one")
    if existing is not None:  # what the output file holds is known too: a run cut short by --budget-s goes on
        known = merge_tables(known, existing)
    done = existing if args.resume else None  # ... and with --force --resume, a forced run too

    def save_so_far(measured: dict[str, Any]) -> None:  # after every shape: an interrupted run keeps what it measured
        with contextlib.suppress(OSError):
            add_rows(path, device, measured)

    table, rows = new_table(device), list[dict[str, Any]]()
    if shapes:
        table, rows = tune(selection, shapes, ms, known=known, force=args.force, done=done, replays=args.replays,
                           max_configs=args.max_configs, budget_s=args.budget_s,
                           backends=backends or None,
                           progress=lambda line: print(line, flush=True), on_shape=save_so_far)
    if args.moe is not None:
        dense = table
        table, moe_rows = tune_moe_command(args, selection, known, done,
                                           lambda moe: save_so_far(merge_tables(dense, moe)), backends)
        table, rows = merge_tables(dense, table), rows + moe_rows
    saved = save_or_rescue(path, lambda target: add_rows(target, device, table), table, "tuning table")
    groups = [*table["groups"], *table.get("moe", ())]
    measured = sum(len(b) for g in groups for b in g["shapes"].values())
    if saved:
        names = ", ".join(g["backend"] + (f"/{g['layout']}" if "layout" in g else "") for g in groups)
        print(f"{measured} new measurements ({names or 'nothing measured'}) written to {path}")
    else:
        print("fp8select: a rescued table is used when FP8SELECT_TUNING_TABLE names it, or once copied to "
              f"{path!r}", file=sys.stderr)
    if args.json:
        data = {"environment": bench.environment(), "table": table, "rows": rows}
        saved = save_or_rescue(args.json, write_json(data), data, "tune rows") and saved
    return 0 if saved else 1
