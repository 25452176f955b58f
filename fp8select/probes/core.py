"""The probe kinds. Each states its requirement and, when rejecting, what it found."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from fp8select.capabilities import Capabilities
from fp8select.verdict import Verdict


class Probe:
    """Base of every probe: ``probe(caps) -> Verdict`` and a human ``requirement``."""

    @property
    def requirement(self) -> str:
        raise NotImplementedError

    def __call__(self, caps: Capabilities) -> Verdict:
        raise NotImplementedError

    def _verdict(self, ok: bool, found: str) -> Verdict:
        if ok:
            return Verdict.accept(f"{self.requirement} (found {found})")
        why = getattr(self, "why", "")
        return Verdict.reject(f"requires {self.requirement}, found {found}" + (f" ({why})" if why else ""))


def evaluate(probes: Sequence[Probe], caps: Capabilities) -> list[Verdict]:
    """Every probe's verdict, in order (none skipped)."""
    return [probe(caps) for probe in probes]


def _release(version: str) -> Version | None:
    """The release part of a version (``2.10.0a0+git`` -> ``2.10.0``), or None if unparsable.

    Pre-release and local builds count as their release: NGC-style ``2.10.0a0`` builds carry
    the 2.10 code, and the gates here are about features, not exact releases.
    """
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def _spec_contains(spec: str, version: str) -> bool:
    release = _release(version)
    return release is not None and SpecifierSet(spec).contains(release, prereleases=True)


def _check_spec(spec: str) -> str:
    try:
        SpecifierSet(spec)
    except InvalidSpecifier as exc:
        raise ValueError(f"invalid version specifier {spec!r}: {exc}") from None
    return spec


@dataclass(frozen=True)
class TorchVersion(Probe):
    """torch's version lies in a ``packaging`` specifier (release part compared)."""

    spec: str
    why: str = ""

    def __post_init__(self) -> None:
        _check_spec(self.spec)

    @property
    def requirement(self) -> str:
        return f"torch{self.spec}"

    def __call__(self, caps: Capabilities) -> Verdict:
        return self._verdict(_spec_contains(self.spec, caps.torch_version), f"torch {caps.torch_version}")


@dataclass(frozen=True)
class ToolkitVersion(Probe):
    """The CUDA / HIP / XPU toolkit torch was built with lies in a specifier."""

    toolkit: str  # "cuda", "hip" or "xpu"
    spec: str
    why: str = ""

    def __post_init__(self) -> None:
        if self.toolkit not in ("cuda", "hip", "xpu"):
            raise ValueError(f"toolkit: expected cuda, hip or xpu, found {self.toolkit!r}")
        _check_spec(self.spec)

    @property
    def requirement(self) -> str:
        label = {"cuda": "CUDA", "hip": "HIP", "xpu": "XPU"}[self.toolkit]
        return f"torch built with {label}{self.spec}"

    def __call__(self, caps: Capabilities) -> Verdict:
        found = getattr(caps, f"{self.toolkit}_version")
        if found is None:
            return self._verdict(False, f"no {self.toolkit} build")
        return self._verdict(_spec_contains(self.spec, found), found)


@dataclass(frozen=True)
class HasScaledMM(Probe):
    """``torch.nn.functional.scaled_mm`` (the public, recipe-based API) exists."""

    @property
    def requirement(self) -> str:
        return "torch.nn.functional.scaled_mm"

    def __call__(self, caps: Capabilities) -> Verdict:
        return self._verdict(caps.has_scaled_mm, "present" if caps.has_scaled_mm else f"absent in torch {caps.torch_version}")


@dataclass(frozen=True)
class ScalingTypes(Probe):
    """Named ``torch.nn.functional.ScalingType`` members are present."""

    members: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return "ScalingType." + "/".join(self.members)

    def __call__(self, caps: Capabilities) -> Verdict:
        missing = [m for m in self.members if m not in caps.scaling_types]
        if not missing:
            return self._verdict(True, "all present")
        have = ", ".join(caps.scaling_types) or "no ScalingType"
        return self._verdict(False, f"{', '.join(missing)} missing (torch {caps.torch_version} has {have})")


@dataclass(frozen=True)
class Float8Dtype(Probe):
    """torch has the named float8 dtype."""

    dtype: str

    @property
    def requirement(self) -> str:
        return f"torch.{self.dtype}"

    def __call__(self, caps: Capabilities) -> Verdict:
        ok = self.dtype in caps.float8_dtypes
        return self._verdict(ok, "present" if ok else f"absent in torch {caps.torch_version}")


@dataclass(frozen=True)
class DeviceKind(Probe):
    """The device kind is one of ``kinds``."""

    kinds: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return "device " + " or ".join(self.kinds)

    def __call__(self, caps: Capabilities) -> Verdict:
        return self._verdict(caps.device_kind in self.kinds, caps.device_kind)


def _sm(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


@dataclass(frozen=True)
class ComputeCapability(Probe):
    """A CUDA compute capability in an exact set, or in ``[minimum, maximum]``.

    Capabilities compare as (major, minor) pairs, so sm121 is not sm120 and sm100 is not sm90.
    """

    allowed: tuple[tuple[int, int], ...] = ()
    minimum: tuple[int, int] | None = None
    maximum: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not self.allowed and self.minimum is None and self.maximum is None:
            raise ValueError("ComputeCapability needs allowed, minimum or maximum")

    @property
    def requirement(self) -> str:
        if self.allowed:
            return "compute capability " + "/".join(_sm(c) for c in self.allowed)
        lo = f">={_sm(self.minimum)}" if self.minimum else ""
        hi = f"<={_sm(self.maximum)}" if self.maximum else ""
        return "compute capability " + ",".join(p for p in (lo, hi) if p)

    def __call__(self, caps: Capabilities) -> Verdict:
        cc = caps.compute_capability
        if cc is None:
            return self._verdict(False, f"none ({caps.device_kind})")
        if self.allowed:
            ok = tuple(cc) in self.allowed
        else:
            ok = (self.minimum is None or cc >= self.minimum) and (self.maximum is None or cc <= self.maximum)
        return self._verdict(ok, _sm(cc))


@dataclass(frozen=True)
class GfxArch(Probe):
    """The ROCm gfx architecture is in a set."""

    archs: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return "gfx arch " + "/".join(self.archs)

    def __call__(self, caps: Capabilities) -> Verdict:
        return self._verdict(caps.gfx_arch in self.archs, caps.gfx_arch or f"none ({caps.device_kind})")


@dataclass(frozen=True)
class Package(Probe):
    """A package is installed (by import name), optionally at a version specifier."""

    name: str
    spec: str = ""
    why: str = ""

    def __post_init__(self) -> None:
        if self.spec:
            _check_spec(self.spec)

    @property
    def requirement(self) -> str:
        return f"package {self.name}{self.spec}"

    def __call__(self, caps: Capabilities) -> Verdict:
        version = caps.packages.get(self.name)
        if version is None:
            return self._verdict(False, "not installed")
        if not self.spec:
            return self._verdict(True, version)
        if version == "unknown":
            return self._verdict(False, "installed without version metadata")
        return self._verdict(_spec_contains(self.spec, version), version)


_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class EnvFlag(Probe):
    """An environment flag (captured in the snapshot) is set to a true value."""

    name: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=1"

    def __call__(self, caps: Capabilities) -> Verdict:
        value = caps.env.get(self.name)
        ok = value is not None and value.strip().lower() in _TRUE
        return self._verdict(ok, f"{self.name}={value}" if value is not None else f"{self.name} unset")


@dataclass(frozen=True)
class TritonTarget(Probe):
    """Triton has a target plugin for this device (``nvidia``, ``amd``, ``intel``)."""

    target: str

    @property
    def requirement(self) -> str:
        return f"Triton's {self.target} backend"

    def __call__(self, caps: Capabilities) -> Verdict:
        ok = self.target in caps.triton_backends
        return self._verdict(ok, "installed" if ok else "backends: " + (", ".join(caps.triton_backends) or "none"))


@dataclass(frozen=True)
class Functional(Probe):
    """A functional probe (a tiny call tried at detection) succeeded.

    Used where a version gate is uncertain. When the snapshot has a result for this probe,
    it decides (a call tried on the device is better evidence than a version guess), and the
    reason says so. Without one, ``otherwise`` decides when given (typically the version
    gate, with its own reason), else ``default``; the reason then says that no functional
    result was present.
    """

    key: str
    description: str
    default: bool = False
    otherwise: Probe | None = None

    @property
    def requirement(self) -> str:
        own = f"functional probe {self.key} ({self.description})"
        return own if self.otherwise is None else f"{own}, or without a result {self.otherwise.requirement}"

    def __call__(self, caps: Capabilities) -> Verdict:
        if self.key not in caps.functional:
            if self.otherwise is not None:
                verdict = self.otherwise(caps)
                return Verdict(verdict.ok, f"{verdict.reason} (no functional result for {self.key} in the snapshot)")
            return self._verdict(self.default, "no functional result in the snapshot")
        ok = caps.functional[self.key]
        own = f"functional probe {self.key} ({self.description})"
        instead = "" if self.otherwise is None else f"; a call tried on the device, instead of {self.otherwise.requirement}"
        if ok:
            return Verdict.accept(f"{own} (found passed{instead})")
        return Verdict.reject(f"requires {own}, found failed{instead}")


@dataclass(frozen=True)
class AllOf(Probe):
    """Every probe accepts; the verdict is the first rejection."""

    probes: tuple[Probe, ...]

    @property
    def requirement(self) -> str:
        return " and ".join(p.requirement for p in self.probes)

    def __call__(self, caps: Capabilities) -> Verdict:
        for probe in self.probes:
            verdict = probe(caps)
            if not verdict.ok:
                return verdict
        return Verdict.accept(", ".join(probe(caps).reason for probe in self.probes))


@dataclass(frozen=True)
class AnyOf(Probe):
    """At least one alternative accepts; a rejection lists why each failed."""

    alternatives: tuple[Probe, ...]
    label: str = field(default="")

    @property
    def requirement(self) -> str:
        return self.label or "one of: " + "; ".join(a.requirement for a in self.alternatives)

    def __call__(self, caps: Capabilities) -> Verdict:
        verdicts = [a(caps) for a in self.alternatives]
        for verdict in verdicts:
            if verdict.ok:
                return verdict
        reasons = "; ".join(v.reason.removeprefix("requires ") for v in verdicts)
        return Verdict.reject(f"requires one of: {reasons}")


@dataclass(frozen=True)
class PackageSymbols(Probe):
    """An installed vendor package exposes one of the entry points an adapter calls.

    Reads ``caps.package_symbols`` (the names found in the package's source text at
    detection, without importing it). When the snapshot has no record for the package (an
    older snapshot, a source that star-imports), the probe accepts and says so: the adapter
    then checks the entry point when a layer is prepared and, if it is missing, declines the
    layer so that it goes to the next backend.
    """

    package: str
    names: tuple[str, ...]
    why: str = ""

    @property
    def requirement(self) -> str:
        return f"package {self.package} exposing {' or '.join(self.names)}"

    def __call__(self, caps: Capabilities) -> Verdict:
        version = caps.packages.get(self.package)
        if version is None:
            return self._verdict(False, f"{self.package} not installed")
        recorded = caps.package_symbols.get(self.package)
        if recorded is None:
            return self._verdict(True, f"{self.package} {version}; entry points not recorded in the snapshot, "
                                       "checked when a layer is prepared")
        present = [n for n in self.names if n in recorded]
        if present:
            return self._verdict(True, f"{self.package} {version} with {', '.join(present)}")
        others = ", ".join(recorded) if recorded else "none of the entry points fp8select looks for"
        return self._verdict(False, f"{self.package} {version} exposing {others}")
