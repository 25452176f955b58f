"""Detection: the one place that reads this process's torch device APIs, package metadata and environment.

:func:`detect_capabilities` gathers them into a :class:`~fp8select.capabilities.Capabilities`
value. It never imports a vendor package (only ``importlib.util.find_spec``,
``importlib.metadata`` and the source text of the few files that name a vendor's entry points,
:data:`PACKAGE_SYMBOLS`) and never initialises a device that the process has not asked for.
The device, torch and package facts are gathered once per process (:func:`forget_detected`
forgets them, after installing a package say); the environment is read on every call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fp8select.capabilities import Capabilities, FrozenMap

__all__ = ["ENV_NAMES", "ENV_PREFIX", "FLASHINFER_MOE_SOURCE", "KNOWN_PACKAGES", "PACKAGE_SYMBOLS", "detect_capabilities",
           "forget_detected", "read_env"]

# Import names fp8select cares about, and the distribution names each may be installed under.
KNOWN_PACKAGES: Mapping[str, tuple[str, ...]] = {
    "triton": ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"),
    "deep_gemm": ("deep_gemm", "deep-gemm"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sgl_kernel": ("sgl-kernel", "sglang-kernel", "sgl_kernel"),
    "aiter": ("amd-aiter", "aiter"),
    "torch_npu": ("torch-npu", "torch_npu"),
}

FLASHINFER_MOE_SOURCE = "data/csrc/fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding.cu"
"""FlashInfer's CUTLASS MoE host-module source (defines ``FusedMoeRunner``): ``cutlass_fused_moe`` compiles
it at first use, so a package without it cannot run that entry point (backends/moe.py, ``FlashInferMoe``)."""

# Entry points the vendor adapters call, by import name: (files relative to the package directory
# whose source text names them, the names looked for). Read as text at detection, never imported,
# so a snapshot can say "deep_gemm 1.x is installed but has no fp8_gemm_nt" without importing it.
PACKAGE_SYMBOLS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "deep_gemm": (("__init__.py",), ("fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt", "m_grouped_fp8_gemm_nt_contiguous",
                                     "m_grouped_fp8_gemm_nt_masked")),
    "flashinfer": (("gemm/__init__.py", "gemm.py", "fused_moe/__init__.py", FLASHINFER_MOE_SOURCE),
                   ("gemm_fp8_nt_groupwise", "fp8_blockscale_gemm_sm90", "cutlass_fused_moe", "FusedMoeRunner")),
    "sgl_kernel": (("__init__.py",), ("fp8_blockwise_scaled_mm", "fp8_blockwise_scaled_grouped_mm", "prepare_moe_input")),
    "aiter": (("ops/gemm_op_a8w8.py", "fused_moe.py"), ("gemm_a8w8_blockscale", "gemm_a8w8_blockscale_bpreshuffle",
                                                       "fused_moe")),
}

# Environment variables copied into the snapshot (besides every FP8SELECT_* variable).
ENV_NAMES = ("TRITON_INTERPRET", "XDG_CACHE_HOME")
ENV_PREFIX = "FP8SELECT_"

FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")

@functools.lru_cache(maxsize=1)
def _detected_facts() -> Capabilities:
    """Everything but the environment: device, torch and package facts (expensive, gathered once)."""
    import torch
    import torch.nn.functional as F

    scaling = getattr(F, "ScalingType", None)
    packages = _installed_packages()
    facts: dict[str, Any] = {
        "torch_version": str(torch.__version__),
        "cuda_version": torch.version.cuda,
        "hip_version": getattr(torch.version, "hip", None),
        "xpu_version": getattr(torch.version, "xpu", None),
        "has_scaled_mm": hasattr(F, "scaled_mm"),
        "scaling_types": tuple(scaling.__members__) if scaling is not None else (),
        "float8_dtypes": tuple(n for n in FLOAT8_NAMES if hasattr(torch, n)),
        "packages": packages,
        "package_symbols": _package_symbols(packages),
        "triton_backends": _triton_backends(),
    }
    facts.update(_device_facts(torch))
    return Capabilities(**facts)


@functools.lru_cache(maxsize=8)
def _with_env(facts: Capabilities, env: FrozenMap[str, str]) -> Capabilities:
    return replace(facts, env=env)


def read_env() -> FrozenMap[str, str]:
    """The environment variables a snapshot holds (every ``FP8SELECT_*`` and :data:`ENV_NAMES`), read now.

    Values that are not valid UTF-8 (bytes the OS passed as surrogates) get U+FFFD in their
    place, so a snapshot always prints and serialises.
    """
    return FrozenMap({_text(k): _text(v) for k, v in sorted(os.environ.items())
                      if k.startswith(ENV_PREFIX) or k in ENV_NAMES})


def _text(value: str) -> str:
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def detect_capabilities() -> Capabilities:
    """This process's capabilities.

    The device, torch and package facts are gathered once per process and cached (they do not
    change while it runs); the environment (every ``FP8SELECT_*`` variable, ``TRITON_INTERPRET``
    and ``XDG_CACHE_HOME``) is read on every call, so ``FP8SELECT_BACKEND`` set after a first
    ``resolve()`` applies to the next one. Calls with an unchanged environment return the same
    object; :func:`forget_detected` forgets the cached facts (after installing a package, say).
    """
    return _with_env(_detected_facts(), read_env())


def forget_detected() -> None:
    """Forget the facts :func:`detect_capabilities` cached: the next call gathers them again."""
    _detected_facts.cache_clear()
    _with_env.cache_clear()


def _device_facts(torch: Any) -> dict[str, Any]:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if getattr(torch.version, "hip", None):
            arch = str(getattr(props, "gcnArchName", "") or "").split(":")[0] or None
            return {"device_kind": "rocm", "device_name": props.name, "gfx_arch": arch}
        return {"device_kind": "cuda", "device_name": props.name, "compute_capability": (props.major, props.minor)}
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return {"device_kind": "xpu", "device_name": xpu.get_device_properties(0).name}
    npu = getattr(torch, "npu", None)  # present only once the host process imported torch_npu
    if npu is not None and npu.is_available():
        facts: dict[str, Any] = {"device_kind": "npu", "device_name": str(npu.get_device_name(0))}
        get_soc = getattr(npu, "get_soc_version", None)
        if callable(get_soc):
            try:
                facts["npu_soc_version"] = int(get_soc())
            except (RuntimeError, TypeError, ValueError):
                pass
        return facts
    if os.path.exists("/dev/davinci_manager"):
        # An Ascend device node without torch_npu imported: the kind is known, the model is not
        # (importing torch_npu is the host's decision, not ours).
        return {"device_kind": "npu"}
    return {"device_kind": "cpu"}


def _installed_packages() -> dict[str, str]:
    import importlib.metadata as md
    import importlib.util

    found: dict[str, str] = {}
    for module, dists in KNOWN_PACKAGES.items():
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        version = "unknown"
        for dist in dists:
            try:
                version = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
        found[module] = version
    return found


def _package_symbols(packages: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Which of :data:`PACKAGE_SYMBOLS`' names each installed vendor package's source text names.

    Text only (``find_spec`` locates the package, nothing is imported). A package whose files
    cannot be read, or that names none of them but star-imports (the names may come through),
    is left out: unknown, and the adapter checks the entry point when a layer is prepared.
    """
    import importlib.util
    import re

    found: dict[str, tuple[str, ...]] = {}
    for module, (files, names) in PACKAGE_SYMBOLS.items():
        if module not in packages:
            continue
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        text = ""
        for location in locations:
            for name in files:
                try:
                    with open(os.path.join(location, name), encoding="utf-8", errors="replace") as handle:
                        text += handle.read() + "\n"
                except OSError:
                    continue
        present = tuple(n for n in names if re.search(rf"\b{re.escape(n)}\b", text))
        if text and (present or not re.search(r"import\s+\*", text)):
            found[module] = present
    return found


def _triton_backends() -> tuple[str, ...]:
    import importlib.util

    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    names: set[str] = set()
    for location in spec.submodule_search_locations:
        backends = os.path.join(location, "backends")
        if os.path.isdir(backends):
            names.update(d for d in os.listdir(backends) if os.path.isdir(os.path.join(backends, d)) and not d.startswith("_"))
    return tuple(sorted(names))
