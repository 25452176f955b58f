"""The capability snapshot: plain facts about this process, gathered once.

:func:`detect_capabilities` is the only code in fp8select that reads torch device APIs,
package metadata and the environment. It never imports a vendor package (only
``importlib.util.find_spec``, ``importlib.metadata`` and the source text of the few files
that name a vendor's entry points, :data:`PACKAGE_SYMBOLS`) and never initialises a device
that the process has not asked for. Everything downstream (probes, resolver) is a pure
function of the :class:`Capabilities` value, which round-trips through JSON so a decision
can be replayed on any machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from fp8select.errors import CapabilitiesError

DEVICE_KINDS = ("cuda", "rocm", "xpu", "npu", "cpu")

# Import names fp8select cares about, and the distribution names each may be installed under.
KNOWN_PACKAGES: Mapping[str, tuple[str, ...]] = {
    "triton": ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"),
    "deep_gemm": ("deep_gemm", "deep-gemm"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sgl_kernel": ("sgl-kernel", "sglang-kernel", "sgl_kernel"),
    "aiter": ("amd-aiter", "aiter"),
    "torch_npu": ("torch-npu", "torch_npu"),
}

# Entry points the vendor adapters call, by import name: (files relative to the package directory
# whose source text names them, the names looked for). Read as text at detection, never imported,
# so a snapshot can say "deep_gemm 1.x is installed but has no fp8_gemm_nt" without importing it.
PACKAGE_SYMBOLS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "deep_gemm": (("__init__.py",), ("fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt")),
    "flashinfer": (("gemm/__init__.py", "gemm.py"), ("gemm_fp8_nt_groupwise", "fp8_blockscale_gemm_sm90")),
    "sgl_kernel": (("__init__.py",), ("fp8_blockwise_scaled_mm",)),
    "aiter": (("ops/gemm_op_a8w8.py",), ("gemm_a8w8_blockscale", "gemm_a8w8_blockscale_bpreshuffle")),
}

# Environment variables copied into the snapshot (besides every FP8SELECT_* variable).
ENV_NAMES = ("TRITON_INTERPRET", "XDG_CACHE_HOME")
ENV_PREFIX = "FP8SELECT_"

FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


@dataclass(frozen=True)
class Capabilities:
    """What this process can do, as plain JSON-able facts.

    The field names are the snapshot's JSON keys; tools and bug reports rely on them.
    ``packages`` maps an import name to its version (absent when not installed);
    ``env`` holds the relevant environment variables; ``triton_backends`` the Triton
    target plugins installed (``nvidia``, ``amd``, ``intel``); ``npu_soc_version`` the
    Ascend SoC version number when known; ``functional`` results of tiny calls tried at
    detection where a version gate alone is uncertain; ``package_symbols`` the entry points
    (of those in :data:`PACKAGE_SYMBOLS`) each vendor package's source names, absent when
    not scanned (an old snapshot, an unreadable or star-importing source).
    """

    device_kind: str = "cpu"
    device_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    gfx_arch: str | None = None
    torch_version: str = "0"
    cuda_version: str | None = None
    hip_version: str | None = None
    xpu_version: str | None = None
    has_scaled_mm: bool = False
    scaling_types: tuple[str, ...] = ()
    float8_dtypes: tuple[str, ...] = ()
    packages: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    triton_backends: tuple[str, ...] = ()
    npu_soc_version: int | None = None
    functional: Mapping[str, bool] = field(default_factory=dict)
    package_symbols: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        for key in ("scaling_types", "float8_dtypes", "triton_backends"):
            data[key] = list(data[key])
        for key in ("packages", "env", "functional"):
            data[key] = dict(sorted(data[key].items()))
        data["package_symbols"] = {k: list(v) for k, v in sorted(self.package_symbols.items())}
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capabilities:
        if not isinstance(data, Mapping):
            raise CapabilitiesError(f"snapshot: expected a JSON object, found {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(data) - known)
        if unknown:
            raise CapabilitiesError(f"snapshot: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        kwargs = dict(data)
        cc = kwargs.get("compute_capability")
        if cc is not None:
            if not (isinstance(cc, (list, tuple)) and len(cc) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in cc)):
                raise CapabilitiesError(f"compute_capability: expected [major, minor] or null, found {cc!r}")
            kwargs["compute_capability"] = (int(cc[0]), int(cc[1]))
        for key in ("scaling_types", "float8_dtypes", "triton_backends"):
            if key in kwargs:
                value = kwargs[key]
                if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                    raise CapabilitiesError(f"{key}: expected a list of strings, found {value!r}")
                kwargs[key] = tuple(value)
        symbols = kwargs.get("package_symbols")
        if symbols is not None:
            if not (isinstance(symbols, Mapping) and all(isinstance(v, (list, tuple)) for v in symbols.values())):
                raise CapabilitiesError(f"package_symbols: expected an object of lists of strings, found {symbols!r}")
            kwargs["package_symbols"] = {k: tuple(v) for k, v in symbols.items()}
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> Capabilities:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            raise CapabilitiesError(f"snapshot: not valid JSON ({exc})") from None
        return cls.from_dict(data)

    def with_overrides(self, overrides: Mapping[str, str]) -> Capabilities:
        """A copy with fields replaced from ``KEY=VALUE`` strings (what-if questions).

        A value is read as JSON when it parses (``[9, 0]``, ``true``, ``null``), else as a
        string; ``packages.NAME`` / ``env.NAME`` / ``functional.NAME`` set one entry and an
        empty value removes it.
        """
        data = self.to_dict()
        for key, raw in overrides.items():
            head, _, sub = key.partition(".")
            if head not in data:
                raise CapabilitiesError(f"--set {key}: unknown key; valid keys: {', '.join(data)}")
            if sub:
                if not isinstance(data[head], dict):
                    raise CapabilitiesError(f"--set {key}: {head} has no entries; use --set {head}=VALUE")
                if raw == "":
                    data[head].pop(sub, None)
                else:
                    data[head][sub] = _parse_value(raw) if head in ("functional", "package_symbols") else raw
            else:
                value = _parse_value(raw)
                if head in ("torch_version", "device_name", "cuda_version", "hip_version", "xpu_version", "gfx_arch") and value is not None:
                    value = raw
                data[head] = value
        return Capabilities.from_dict(data)

    def fingerprint(self) -> str:
        """A short stable hash of the snapshot (for comparing ranks and keying caches)."""
        return hashlib.sha256(self.to_json(indent=None).encode()).hexdigest()[:16]


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _validate(caps: Capabilities) -> None:
    def expect(ok: bool, key: str, expected: str, found: Any) -> None:
        if not ok:
            raise CapabilitiesError(f"{key}: expected {expected}, found {found!r}")

    expect(caps.device_kind in DEVICE_KINDS, "device_kind", "one of " + ", ".join(DEVICE_KINDS), caps.device_kind)
    expect(isinstance(caps.torch_version, str) and bool(caps.torch_version), "torch_version", "a version string", caps.torch_version)
    for key in ("device_name", "gfx_arch", "cuda_version", "hip_version", "xpu_version"):
        value = getattr(caps, key)
        expect(value is None or isinstance(value, str), key, "a string or null", value)
    expect(isinstance(caps.has_scaled_mm, bool), "has_scaled_mm", "true or false", caps.has_scaled_mm)
    cc = caps.compute_capability
    expect(cc is None or (isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(v, int) for v in cc)),
           "compute_capability", "[major, minor] or null", cc)
    for key in ("scaling_types", "float8_dtypes", "triton_backends"):
        value = getattr(caps, key)
        expect(isinstance(value, tuple) and all(isinstance(v, str) for v in value), key, "a list of strings", value)
    for key in ("packages", "env"):
        value = getattr(caps, key)
        expect(isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
               key, "an object of strings", value)
    expect(isinstance(caps.functional, Mapping) and all(isinstance(v, bool) for v in caps.functional.values()),
           "functional", "an object of true/false", caps.functional)
    symbols = caps.package_symbols
    expect(isinstance(symbols, Mapping) and all(isinstance(k, str) and isinstance(v, tuple) and all(isinstance(s, str) for s in v)
                                                for k, v in symbols.items()),
           "package_symbols", "an object of lists of strings", symbols)
    soc = caps.npu_soc_version
    expect(soc is None or (isinstance(soc, int) and not isinstance(soc, bool)), "npu_soc_version", "an integer or null", soc)


@functools.lru_cache(maxsize=1)
def detect_capabilities() -> Capabilities:
    """Gather this process's capabilities once (cached; call ``detect_capabilities.cache_clear()`` to redo)."""
    import torch
    import torch.nn.functional as F

    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX) or k in ENV_NAMES}
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
        "env": env,
        "triton_backends": _triton_backends(),
    }
    facts.update(_device_facts(torch))
    return Capabilities(**facts)


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


def replace_caps(caps: Capabilities, **changes: Any) -> Capabilities:
    """``dataclasses.replace`` re-exported for tests and what-if tools."""
    return replace(caps, **changes)
