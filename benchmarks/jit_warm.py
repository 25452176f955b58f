"""Fill the JIT caches (DeepGEMM, FlashInfer, Triton) for a set of shapes, in parallel processes.

    python -m benchmarks.jit_warm --shapes deepseek-v3 --backends deepgemm,flashinfer --procs 8 --out warm.json

One worker process per (backend, shape) (:func:`fp8select.jit_processes.compile_in_processes`, at most
``--procs`` at once) resolves with that backend pinned, prepares a random weight of the shape and calls
it at both ends of every M bucket, so later measurements in other processes find every kernel compiled:
the compilers run on the CPU cores side by side instead of one after another inside a timed run.
Writes per worker the seconds it took (with its process start), which is also about the warm-up
cost an engine pays on a cold cache.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks._cuda import require_cuda


def main(argv: list[str] | None = None) -> None:
    from fp8select.buckets import M_BUCKETS
    from fp8select.jit_processes import JitJob, compile_in_processes
    from fp8select.measure.bench import parse_shapes
    from fp8select.warmup import bucket_ms

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="deepseek-v3")
    parser.add_argument("--backends", default="deepgemm,flashinfer")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    require_cuda("jit_warm")
    ms = tuple(bucket_ms(M_BUCKETS))
    jobs = [JitJob(b, n, k, ms, "bfloat16", "cuda") for b in args.backends.split(",") if b
            for n, k in parse_shapes(args.shapes)]
    start = time.perf_counter()
    results = compile_in_processes(jobs, args.procs)
    wall = time.perf_counter() - start
    summary = {"wall_s": round(wall, 1), "procs": args.procs, "items": results,
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
