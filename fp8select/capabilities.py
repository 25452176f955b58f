"""The capability snapshot: a value of plain facts about a process (:mod:`fp8select.detect` gathers it).

Everything downstream (probes, resolver) is a pure function of the :class:`Capabilities`
value, which round-trips through JSON so a decision can be replayed on any machine.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, NoReturn, TypeVar

from packaging.version import InvalidVersion, Version

from fp8select.errors import CapabilitiesError
from fp8select.guard import safe_repr

DEVICE_KINDS = ("cuda", "rocm", "xpu", "npu", "cpu")

# Bounds that keep every number of a snapshot printable and comparable (a 5000-digit integer is
# not a compute capability; Python refuses to even print it).
CC_LIMIT = 1000
SOC_LIMIT = 2**32

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """A read-only, hashable mapping: the snapshot's ``packages``, ``env``, ``functional`` and
    ``package_symbols``.

    A plain class over a private dict (not ``types.MappingProxyType``, which ``torch.compile``
    refuses to trace through), equal to any mapping with the same items, hashable when its
    values are, and picklable. It copies what it is given, so the caller's dict can change
    afterwards without changing the snapshot.
    """

    __slots__ = ("_data", "_hash")
    _data: dict[K, V]
    _hash: int | None

    def __init__(self, data: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        object.__setattr__(self, "_data", dict(data))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        value = self._hash
        if value is None:
            value = hash(frozenset(self._data.items()))
            object.__setattr__(self, "_hash", value)
        return value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self._data),))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


_TUPLE_FIELDS = ("scaling_types", "float8_dtypes", "triton_backends")
_MAPPING_FIELDS = ("packages", "env", "functional", "package_symbols")
_TEXT_FIELDS = ("device_name", "gfx_arch", "cuda_version", "hip_version", "xpu_version")


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

    A snapshot is immutable and hashable: its mapping fields are :class:`FrozenMap` copies of
    what was passed (a dict is accepted and copied), lists given for tuple fields become
    tuples, and anything malformed raises :class:`~fp8select.errors.CapabilitiesError`.
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
    packages: Mapping[str, str] = field(default_factory=FrozenMap)
    env: Mapping[str, str] = field(default_factory=FrozenMap)
    triton_backends: tuple[str, ...] = ()
    npu_soc_version: int | None = None
    functional: Mapping[str, bool] = field(default_factory=FrozenMap)
    package_symbols: Mapping[str, tuple[str, ...]] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        for key in (*_TUPLE_FIELDS, "compute_capability"):
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        symbols = self.package_symbols
        if isinstance(symbols, Mapping) and all(isinstance(v, (list, tuple)) for v in symbols.values()):
            object.__setattr__(self, "package_symbols", {k: tuple(v) for k, v in symbols.items()})
        _validate(self)
        for key in _MAPPING_FIELDS:
            value = getattr(self, key)
            if not isinstance(value, FrozenMap):
                object.__setattr__(self, key, FrozenMap(value))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        data["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        for key in _TUPLE_FIELDS:
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
        unknown = sorted(safe_repr(k) if not isinstance(k, str) else k for k in set(data) - known)
        if unknown:
            raise CapabilitiesError(f"snapshot: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        kwargs = dict(data)
        cc = kwargs.get("compute_capability")
        if cc is not None:
            if not (isinstance(cc, (list, tuple)) and len(cc) == 2 and all(_is_int(v) for v in cc)):
                _reject("compute_capability", "[major, minor] or null", cc)
            kwargs["compute_capability"] = (int(cc[0]), int(cc[1]))
        for key in _TUPLE_FIELDS:
            if key in kwargs:
                value = kwargs[key]
                if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                    _reject(key, "a list of strings", value)
                kwargs[key] = tuple(value)
        symbols = kwargs.get("package_symbols")
        if symbols is not None:
            if not (isinstance(symbols, Mapping) and all(isinstance(v, (list, tuple)) for v in symbols.values())):
                _reject("package_symbols", "an object of lists of strings", symbols)
            kwargs["package_symbols"] = {k: tuple(v) for k, v in symbols.items()}
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str | bytes) -> Capabilities:
        try:
            data = json.loads(text)
        except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
            raise CapabilitiesError(f"snapshot: not valid JSON ({_json_problem(exc)})") from None
        return cls.from_dict(data)

    def with_overrides(self, overrides: Mapping[str, str]) -> Capabilities:
        """A copy with fields replaced from ``KEY=VALUE`` strings (what-if questions).

        A value is read as JSON when it parses (``[9, 0]``, ``true``, ``null``), else as a
        string; ``packages.NAME`` / ``env.NAME`` / ``functional.NAME`` set one entry and an
        empty value removes it. Versions typed here must be versions: ``torch_version`` and
        ``packages.NAME`` PEP 440 (a package may also be ``unknown``), the toolkit versions
        a release number first (``12.9``, ``6.2.41133-dd7f95766``).
        """
        if not isinstance(overrides, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in overrides.items()):
            raise CapabilitiesError(f"overrides: expected a mapping of KEY to VALUE strings, found {safe_repr(overrides)}")
        data = self.to_dict()
        for key, raw in overrides.items():
            head, _, sub = key.strip().partition(".")
            if head not in data:
                raise CapabilitiesError(f"--set {key}: unknown key; valid keys: {', '.join(data)}")
            if sub:
                if not isinstance(data[head], dict):
                    raise CapabilitiesError(f"--set {key}: {head} has no entries; use --set {head}=VALUE")
                if raw == "":
                    data[head].pop(sub, None)
                elif head in ("functional", "package_symbols"):
                    data[head][sub] = _parse_value(raw)
                else:
                    if head == "packages" and raw != "unknown":
                        _check_version(key, raw, pep440=True)
                    data[head][sub] = raw
            else:
                value = _parse_value(raw)
                if head in ("torch_version", *_TEXT_FIELDS) and value is not None:
                    value = raw
                    if head == "torch_version" or head.endswith("_version"):
                        _check_version(key, raw, pep440=head == "torch_version")
                data[head] = value
        return Capabilities.from_dict(data)

    def fingerprint(self) -> str:
        """A short stable hash of the snapshot (for comparing ranks and keying caches)."""
        return hashlib.sha256(self.to_json(indent=None).encode()).hexdigest()[:16]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reject(key: str, expected: str, found: Any) -> NoReturn:
    raise CapabilitiesError(f"{key}: expected {expected}, found {safe_repr(found)}")


def _json_problem(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, ValueError) and "integer string conversion" in text:
        return "a number longer than 4300 digits"
    return safe_repr(text)[1:-1] if text else type(exc).__name__


def _parse_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # not JSON (or a number too long to read): the text itself
        return raw


_TOOLKIT_VERSION = re.compile(r"\d+(\.\d+)*\S*")


def _check_version(key: str, raw: str, *, pep440: bool) -> None:
    """A version typed in an override must be one; a typo would reject every version gate silently."""
    if pep440:
        try:
            Version(raw)
            return
        except InvalidVersion:
            raise CapabilitiesError(f"--set {key}: expected a PEP 440 version (e.g. 2.11.0 or 2.10.0a0+git1234567), "
                                    f"found {safe_repr(raw)}") from None
    if not _TOOLKIT_VERSION.fullmatch(raw):
        raise CapabilitiesError(f"--set {key}: expected a version starting with its release number (e.g. 12.9), "
                                f"found {safe_repr(raw)}")


def _validate(caps: Capabilities) -> None:
    def expect(ok: bool, key: str, expected: str, found: Any) -> None:
        if not ok:
            _reject(key, expected, found)

    expect(isinstance(caps.device_kind, str) and caps.device_kind in DEVICE_KINDS, "device_kind",
           "one of " + ", ".join(DEVICE_KINDS), caps.device_kind)
    expect(isinstance(caps.torch_version, str) and bool(caps.torch_version.strip()), "torch_version", "a version string",
           caps.torch_version)
    for key in _TEXT_FIELDS:
        value = getattr(caps, key)
        expect(value is None or isinstance(value, str), key, "a string or null", value)
    expect(isinstance(caps.has_scaled_mm, bool), "has_scaled_mm", "true or false", caps.has_scaled_mm)
    cc = caps.compute_capability
    expect(cc is None or (isinstance(cc, tuple) and len(cc) == 2 and all(_is_int(v) and 0 <= v < CC_LIMIT for v in cc)),
           "compute_capability", f"[major, minor] (integers 0 to {CC_LIMIT - 1}) or null", cc)
    for key in _TUPLE_FIELDS:
        value = getattr(caps, key)
        expect(isinstance(value, tuple) and all(isinstance(v, str) for v in value), key, "a list of strings", value)
    for key in ("packages", "env"):
        value = getattr(caps, key)
        expect(isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()),
               key, "an object of strings", value)
    functional = caps.functional
    expect(isinstance(functional, Mapping) and all(isinstance(k, str) and isinstance(v, bool) for k, v in functional.items()),
           "functional", "an object of true/false", functional)
    symbols = caps.package_symbols
    expect(isinstance(symbols, Mapping) and all(isinstance(k, str) and isinstance(v, tuple) and all(isinstance(s, str) for s in v)
                                                for k, v in symbols.items()),
           "package_symbols", "an object of lists of strings", symbols)
    soc = caps.npu_soc_version
    expect(soc is None or (_is_int(soc) and 0 <= soc < SOC_LIMIT), "npu_soc_version", "a non-negative integer or null", soc)


def replace_caps(caps: Capabilities, **changes: Any) -> Capabilities:
    """``dataclasses.replace`` re-exported for tests and what-if tools."""
    return replace(caps, **changes)
