"""``python -m fp8select``: ``probe`` prints this machine's snapshot, ``explain`` the decision."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

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
    return parser


def _snapshot(args: argparse.Namespace) -> Capabilities:
    if args.capabilities:
        try:
            with open(args.capabilities, encoding="utf-8") as fh:
                caps = Capabilities.from_json(fh.read())
        except OSError as exc:
            raise Fp8SelectError(f"--capabilities: cannot read {args.capabilities!r}: {exc.strerror}") from None
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
