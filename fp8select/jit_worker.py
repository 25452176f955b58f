"""A worker process of :mod:`fp8select.jit_processes`: ``python -m fp8select.jit_worker JOB_JSON``.

Resolves with the job's backend pinned, prepares a random e4m3fn weight of the job's shape and calls
it once at each of the job's Ms: the backend compiles those calls' kernels into its on-disk cache.
Exit status 0 when done; otherwise 1, with the reason as the last line of stderr.
"""

from __future__ import annotations

import json
import sys

import torch

from fp8select.jit_processes import JitJob
from fp8select.kernels.weight_quant import quantize_weight
from fp8select.resolver import resolve


def work(job: JitJob) -> None:
    """The job's calls through a selection pinned to its backend."""
    device = torch.device(job.device)
    generator = torch.Generator(device=device).manual_seed(0)
    weight, scale = quantize_weight(torch.randn(job.n, job.k, device=device, generator=generator) * 0.05)
    layer = resolve(backend=job.backend, plugins=False, verify=False).prepare(weight, scale, tune=False)  # compiles only
    x = torch.randn(max(job.ms), job.k, device=device, generator=generator, dtype=getattr(torch, job.act_dtype))
    with torch.no_grad():
        for m in job.ms:
            layer(x[:m])
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    try:
        fields = json.loads(sys.argv[1])
        work(JitJob(**{**fields, "ms": tuple(fields["ms"])}))
    except Exception as exc:  # noqa: BLE001 - reported to the caller in one line
        sys.stderr.write(f"\n{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}\n")
        sys.exit(1)
