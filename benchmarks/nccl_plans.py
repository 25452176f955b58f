"""Two ranks over NCCL end with the same plan for every layer (the distributed part of the plan issue).

    python -m torch.distributed.run --nproc-per-node 2 benchmarks/nccl_plans.py --out plans.json

Each rank resolves with ``group="world"`` (rank 0's tables are broadcast), prepares the same
layers (DeepSeek-V3 shapes, measured in the tables, and a shape no table holds, measured at
load time on rank 0 when ``FP8SELECT_TUNE=load``), and the ranks compare their plans'
fingerprints and one output of each layer. Rank 1 is also given a different local table,
which must not change its plans. Rank 0 writes the result.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

import fp8select
from fp8select.bench import random_weight
from fp8select.tuning.table import new_table

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 4096)]  # the last one is in no table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    if rank == 1:  # a local table that prefers cuBLAS everywhere: rank 0's tables must win
        local = new_table(torch.cuda.get_device_name(0))
        local["groups"] = [{"backend": "cuda-scaled-mm", "versions": {}, "shapes": {
            f"{n},{k}": {str(2**i): {"us": 0.001} for i in range(14)} for n, k in SHAPES}}]
        path = os.path.join(tempfile.mkdtemp(), "rank1.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(local, fh)
        os.environ["FP8SELECT_TUNING_TABLE"] = path
        fp8select.detect_capabilities.cache_clear()
    start = time.perf_counter()
    sel = fp8select.resolve(group="world")
    resolve_s = time.perf_counter() - start
    mine = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in SHAPES:
        w, s = random_weight(n, k, "cuda", gen)
        t0 = time.perf_counter()
        layer = sel.prepare(w, s)
        prepare_s = time.perf_counter() - t0
        x = torch.randn(16, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        y = layer(x).float()
        mine.append({"n": n, "k": k, "fingerprint": layer.main_plan.fingerprint(), "plan": layer.main_plan.summary(),
                     "whys": sorted({r.why for r in layer.main_plan.routes}), "checksum": float(y.double().sum()),
                     "prepare_s": round(prepare_s, 3)})
    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"rank": rank, "sources": list(sel.tuning_sources), "resolve_s": round(resolve_s, 3),
                                      "layers": mine})
    if rank == 0:
        fingerprints = [[lay["fingerprint"] for lay in r["layers"]] for r in everyone]  # type: ignore[index]
        checksums = [[lay["checksum"] for lay in r["layers"]] for r in everyone]  # type: ignore[index]
        same = all(f == fingerprints[0] for f in fingerprints)
        outputs = all(c == checksums[0] for c in checksums)
        result = {"world": dist.get_world_size(), "backend": "nccl", "same_plans": same, "same_outputs": outputs,
                  "tune_env": os.environ.get("FP8SELECT_TUNE"), "ranks": everyone}
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
        print(json.dumps({k: v for k, v in result.items() if k != "ranks"}), flush=True)
        for lay in mine:
            print(lay, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
