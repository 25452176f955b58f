"""Fill the JIT caches (DeepGEMM, FlashInfer, Triton) for a set of shapes, in parallel processes.

    python -m benchmarks.jit_warm --shapes deepseek-v3 --backends deepgemm,flashinfer --procs 8 --out warm.json

Each worker process resolves with one backend pinned, prepares a layer per assigned shape and
runs :func:`fp8select.warmup` on it (both ends of every M bucket), so later measurements in
other processes find every kernel compiled: the compilers run on the CPU cores side by side
instead of one after another inside a timed run. Writes per worker the seconds each
(backend, shape) took, which is also the warm-up cost an engine pays on a cold cache.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from typing import Any

from benchmarks._cuda import require_cuda


def _work(items: list[tuple[str, int, int]], queue: Any) -> None:

    import fp8select
    from fp8select.measure.bench import random_weight
    from fp8select.warmup import warmup

    results = []
    for backend, n, k in items:
        start = time.perf_counter()
        try:
            sel = fp8select.resolve(backend=backend, plugins=False, verify=False)
            w, s = random_weight(n, k, "cuda")
            report = warmup(sel.prepare(w, s))
            results.append({"backend": backend, "n": n, "k": k, "calls": report.calls, "seconds": round(report.seconds, 2)})
        except Exception as exc:  # noqa: BLE001 - recorded, the next item goes on
            results.append({"backend": backend, "n": n, "k": k, "error": f"{type(exc).__name__}: {exc}"[:300],
                            "seconds": round(time.perf_counter() - start, 2)})
    queue.put(results)


def main(argv: list[str] | None = None) -> None:
    from fp8select.measure.bench import parse_shapes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="deepseek-v3")
    parser.add_argument("--backends", default="deepgemm,flashinfer")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    require_cuda("jit_warm")
    shapes = parse_shapes(args.shapes)
    items = [(b, n, k) for b in args.backends.split(",") if b for n, k in shapes]
    buckets: list[list[tuple[str, int, int]]] = [[] for _ in range(max(1, min(args.procs, len(items))))]
    for i, item in enumerate(items):
        buckets[i % len(buckets)].append(item)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = time.perf_counter()
    procs = [ctx.Process(target=_work, args=(b, queue)) for b in buckets]
    for p in procs:
        p.start()
    results = [row for _ in procs for row in queue.get()]
    for p in procs:
        p.join()
    wall = time.perf_counter() - start
    summary = {"wall_s": round(wall, 1), "procs": len(procs), "items": results,
               "serial_s": round(sum(r["seconds"] for r in results), 1)}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    errors = [r for r in results if "error" in r]
    print(f"jit_warm: {len(results)} (backend, shape) in {wall:.1f} s wall, {summary['serial_s']} s of work; "
          f"{len(errors)} errors", flush=True)
    for r in errors:
        print(f"  {r['backend']} {r['n']}x{r['k']}: {r['error']}", flush=True)


if __name__ == "__main__":
    main()
