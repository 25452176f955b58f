"""Probes: small pure callables ``Capabilities -> Verdict``.

Each probe is a frozen dataclass, so it is data: it can be printed in ``docs/backends.md``
(``requirement``), compared in tests and evaluated against any snapshot. No probe reads
global state; a probe never raises on odd snapshot values, it rejects.
"""

from fp8select.probes.core import (
    AllOf,
    AnyOf,
    ComputeCapability,
    DeviceKind,
    EnvFlag,
    Float8Dtype,
    Functional,
    GfxArch,
    HasScaledMM,
    Package,
    PackageSymbols,
    Probe,
    ScalingTypes,
    ToolkitVersion,
    TorchVersion,
    TritonTarget,
    evaluate,
)

__all__ = [
    "AllOf",
    "AnyOf",
    "ComputeCapability",
    "DeviceKind",
    "EnvFlag",
    "Float8Dtype",
    "Functional",
    "GfxArch",
    "HasScaledMM",
    "Package",
    "PackageSymbols",
    "Probe",
    "ScalingTypes",
    "ToolkitVersion",
    "TorchVersion",
    "TritonTarget",
    "evaluate",
]
