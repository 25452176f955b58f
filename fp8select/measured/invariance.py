"""Batch invariance as measured: which backends gave the same bits for a row whatever its batch.

A row's output is batch-invariant when it depends only on that row and the weights: bitwise the
same computed alone (M 1) or inside a batch of any M, at any position, run to run. Whether a
kernel is depends on its reduction order (split-K, tiles or algorithms picked per M), so it is
measured on the device (``benchmarks/invariance.py``), never assumed, and kept per backend at the
versions its speed is kept at (:func:`.table.backend_versions`), one file per device model::

    {"schema": 1, "device_name": "NVIDIA H200", "note": "...optional...",
     "records": [{"backend": "deepgemm",
                  "versions": {"cuda": "13.0", "deep_gemm": "2.6.1", "torch": "2.11.0+cu130", "triton": "3.6.0"},
                  "schedule": [{"from_m": 1, "config": null}],
                  "shapes": ["7168,2048"], "m": [2, 2048], "positions": ["first"],
                  "invariant": true, "differs": []}]}

``schedule`` is what ran: the launch configuration from each M on (Triton's; null for a backend
without one). ``shapes``, ``m`` (the inclusive range of M measured) and ``positions`` (of the
compared row in its batch) say what was measured; ``invariant`` that every compared row was
bitwise the row computed alone; ``differs`` where it was not (shape, M, position, largest
relative difference). A record of the MoE experts op names its ``layout`` too (a MoE backend's,
e.g. ``"masked"``), its shapes are ``"E,H,I,k"`` and its configurations MoE ones; there a row is a
token (its experts and weights its own) among tokens routed at random.

A record **qualifies** its backend for invariant plans when it says invariant over M 1 to
:data:`~fp8select.buckets.M_BUCKET_MAX` (larger M run the same kernels on more tiles) at every
position of :data:`POSITIONS`, at exactly the versions installed here: unlike tuning rows, no
other version stands in. A layer of a shape the record was not measured at is planned from it,
and its plan says so. A backend whose ``invariant`` attribute states a proof (the reference)
needs no record (the class whose ``run`` or ``bind`` it runs must state it: a subclass that
overrides them states its own); on an accelerator it serves invariant plans only when chosen explicitly, being
the pure-torch yardstick, far slower than the kernels. Files, lowest precedence first: the
shipped ``fp8select/data/invariance-<device>.json``, the cache directory's; a later file's record
replaces an earlier one of the same backend, versions and schedule. Pure Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fp8select.buckets import M_BUCKET_MAX
from fp8select.capabilities import Capabilities
from fp8select.errors import InvalidInputError
from fp8select.measured.table import (
    SHIPPED_DIR,
    backend_versions,
    cache_dir,
    config_problem,
    device_path,
    load_table,
    versions_text,
)

__all__ = ["ENV_BATCH_INVARIANT", "POSITIONS", "SCHEMA", "Invariance", "Option", "Record", "batch_invariant_from_env",
           "find_records", "invariance_for", "merge_records", "validate_records"]

SCHEMA = 1
ENV_BATCH_INVARIANT = "FP8SELECT_BATCH_INVARIANT"
"""``1`` (true, yes, on): ``resolve()`` makes batch-invariant plans when its ``batch_invariant`` is not given."""
_FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False,
                "": False}
POSITIONS = ("first", "middle", "last")
"""Where in its batch a compared row sits; a qualifying record measured each."""

_RECORD_KEYS = {"backend", "versions", "schedule", "shapes", "m", "positions", "invariant", "differs", "layout"}


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(","))


@dataclass(frozen=True)
class Record:
    """One measurement of one backend at its versions (see the module docstring for the fields)."""

    backend: str
    versions: Mapping[str, str]
    schedule: tuple[tuple[int, Mapping[str, Any] | None], ...]
    shapes: tuple[tuple[int, ...], ...]
    m: tuple[int, int]
    positions: tuple[str, ...]
    invariant: bool
    differs: tuple[Mapping[str, Any], ...] = ()
    source: str = ""
    layout: str | None = None  # a MoE backend's layout (a record of the experts op); None: a dense layer's

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> Record:
        """A record of a file :func:`validate_records` accepted."""
        return cls(data["backend"], dict(data["versions"]),
                   tuple((int(s["from_m"]), s["config"]) for s in data["schedule"]),
                   tuple(_shape(s) for s in data["shapes"]), (int(data["m"][0]), int(data["m"][1])),
                   tuple(data["positions"]), bool(data["invariant"]), tuple(data.get("differs", ())), source,
                   data.get("layout"))

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, **({"layout": self.layout} if self.layout is not None else {}),
                "versions": dict(self.versions),
                "schedule": [{"from_m": m, "config": config} for m, config in self.schedule],
                "shapes": [",".join(map(str, shape)) for shape in self.shapes], "m": list(self.m),
                "positions": list(self.positions), "invariant": self.invariant, "differs": [dict(d) for d in self.differs]}

    @property
    def name(self) -> str:
        """The backend, and for the experts op its layout: ``triton``, ``deepgemm/masked``."""
        return self.backend if self.layout is None else f"{self.backend}/{self.layout}"

    @property
    def key(self) -> str:
        """What a later record replaces this one by: backend (and layout), versions and schedule."""
        return json.dumps([self.name, dict(self.versions), [list(s) for s in self.schedule]], sort_keys=True)

    def config_at(self, m: int) -> Mapping[str, Any] | None:
        """The schedule's configuration for calls of ``m`` rows."""
        return [config for start, config in self.schedule if start <= m][-1]

    def shortfall(self) -> str | None:
        """Why this record does not make its backend invariant for every M and position, or None."""
        if not self.invariant:
            where = ", ".join(f"{d.get('shape', '?').replace(',', 'x')} M {d.get('m', '?')} ({d.get('position', '?')}"
                              + (f", max relative {d['max_rel']:.1e})" if d.get("max_rel") is not None else ")")
                              for d in self.differs[:3])
            return f"measured not batch-invariant{': differs at ' + where if where else ''} ({self.measured()})"
        missing = [p for p in POSITIONS if p not in self.positions]
        if self.m[0] > 1 or self.m[1] < M_BUCKET_MAX or missing:
            return (f"measured invariant only at {self.measured()}; invariant plans need M 1-{M_BUCKET_MAX} at "
                    f"positions {'/'.join(POSITIONS)}")
        return None

    def measured(self) -> str:
        shapes = ", ".join("x".join(map(str, shape)) for shape in self.shapes)
        return f"M {self.m[0]}-{self.m[1]}, positions {'/'.join(self.positions)}, shapes {shapes}"

    def describe(self) -> str:
        configs = "; ".join(f"from M {m}: {_config_text(c)}" for m, c in self.schedule if c is not None)
        return (f"{self.name} measured batch-invariant at {self.measured()}"
                + (f" with {configs}" if configs else "") + (f" ({self.source})" if self.source else ""))


def _config_text(config: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


@dataclass(frozen=True)
class Option:
    """A way to run a layer batch-invariant: ``backend`` with ``schedule`` (configuration from each M
    on), backed by ``why`` (a qualifying record, or the backend's proof); ``shapes`` the measured ones
    (empty for a proof, which holds for every shape)."""

    backend: str
    schedule: tuple[tuple[int, Mapping[str, Any] | None], ...]
    why: str
    shapes: tuple[tuple[int, ...], ...] = ()

    def config_at(self, m: int) -> Mapping[str, Any] | None:
        return [config for start, config in self.schedule if start <= m][-1]

    def backs(self, *shape: int) -> str:
        """``why`` for a layer of this shape ((N, K), or (E, H, I, k) for the experts op), saying when the
        record was measured at other shapes only."""
        if not self.shapes or shape in self.shapes:
            return self.why
        return f"{self.why}; not measured at {'x'.join(map(str, shape))}"


class Invariance:
    """The invariance records that apply to a chain's backends on one device (immutable once built)."""

    def __init__(self, caps: Capabilities, backends: Iterable[Any], files: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """``files``: ``(source, data)`` of valid record files of this device, lowest precedence first."""
        self.device = caps.device_name or caps.device_kind
        self.on_cpu = caps.device_kind == "cpu"
        self.caps = caps
        self.installed = {b.name: backend_versions(caps, getattr(b, "packages", ())) for b in backends}
        latest: dict[str, Record] = {}
        for source, data in files:
            for raw in data["records"]:
                record = Record.from_dict(raw, source)
                latest[record.key] = record
        self.records = tuple(latest.values())

    def options(self, backend: Any, *, explicit: bool = False, layout: str | None = None
                ) -> tuple[tuple[Option, ...], str]:
        """The ways ``backend`` runs invariant here, and when there are none, why not. ``layout``: a MoE
        backend's (the experts op's records; its installed versions read from the backend itself)."""
        proof = _proof(backend)
        if proof:
            if self.on_cpu or explicit:
                return (Option(backend.name, ((1, None),), f"invariant by construction: {proof}"),), ""
            return (), (f"invariant by construction, but the pure-torch path on {self.device}; chosen only explicitly "
                        f"(backend={backend.name!r})")
        versions = self.installed.get(backend.name, {}) if layout is None else \
            backend_versions(self.caps, getattr(backend, "packages", ()))
        mine = [r for r in self.records if r.backend == backend.name and r.layout == layout]
        here = [r for r in mine if dict(r.versions) == versions]
        options = tuple(Option(r.name, r.schedule, r.describe(), r.shapes) for r in here if r.shortfall() is None)
        if options:
            return options, ""
        if here:
            return (), "; ".join(dict.fromkeys(str(r.shortfall()) for r in here))
        found = (f" (recorded at other versions: {'; '.join(_versions_text(r.versions) for r in mine[:2])})"
                 if mine else "")
        return (), f"no batch-invariance record on {self.device} at {_versions_text(versions)}{found}"

    def describe(self, backends: Iterable[Any]) -> list[str]:
        """One line per backend: the record that makes it invariant here, or why none does."""
        lines = []
        for backend in backends:
            options, why = self.options(backend)
            lines.append(f"  {backend.name}: " + ("; ".join(o.why for o in options) if options else f"not used: {why}"))
        return lines


def _proof(backend: Any) -> str | None:
    """A backend's ``invariant`` proof, if the class whose call code it runs states it: a subclass that
    overrides ``run`` or ``bind`` computes otherwise, and states its own proof or none."""
    owner = next((c for c in type(backend).__mro__ if "run" in vars(c) or "bind" in vars(c)), None)
    proof = vars(owner).get("invariant") if owner is not None else None
    return proof if isinstance(proof, str) and proof else None


def _versions_text(versions: Mapping[str, str]) -> str:
    return versions_text(versions) or "no versions"


def _check_record(where: str, r: object) -> str | None:
    if not isinstance(r, dict) or not {"backend", "versions", "schedule", "shapes", "m", "positions", "invariant"} <= set(r) \
            or not set(r) <= _RECORD_KEYS:
        return f"{where}: expected an object with keys {sorted(_RECORD_KEYS)} ('differs' optional), found {r!r:.120}"
    if not isinstance(r["backend"], str) or not r["backend"]:
        return f"{where}.backend: expected a backend name, found {r['backend']!r}"
    moe = "layout" in r
    if moe and (not isinstance(r["layout"], str) or not r["layout"]):
        return f"{where}.layout: expected a MoE backend's layout name, found {r['layout']!r}"
    versions = r["versions"]
    if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items()):
        return f"{where}.versions: expected an object of version strings, found {versions!r}"
    schedule = r["schedule"]
    if (not isinstance(schedule, list) or not schedule or not all(isinstance(s, dict) and set(s) == {"from_m", "config"}
                                                                  for s in schedule)):
        return f"{where}.schedule: expected a list of {{'from_m', 'config'}} objects, found {schedule!r:.120}"
    starts = [s["from_m"] for s in schedule]
    if not all(isinstance(m, int) and not isinstance(m, bool) for m in starts) or starts[0] != 1 or starts != sorted(set(starts)):
        return f"{where}.schedule: expected from_m increasing from 1, found {starts!r}"
    for s in schedule:
        if s["config"] is not None and (not isinstance(s["config"], dict) or config_problem(r["backend"], s["config"], moe)):
            problem = config_problem(r["backend"], s["config"], moe) if isinstance(s["config"], dict) else "not an object"
            return f"{where}.schedule: configuration {s['config']!r:.80}: {problem}"
    shapes, parts = r["shapes"], 4 if moe else 2
    if not isinstance(shapes, list) or not all(isinstance(s, str) and len(s.split(",")) == parts
                                               and all(p.isascii() and p.isdigit() and int(p) > 0 for p in s.split(",")) for s in shapes):
        return f"{where}.shapes: expected a list of {'E,H,I,k' if moe else 'N,K'!r} strings, found {shapes!r:.120}"
    m = r["m"]
    if (not isinstance(m, list) or len(m) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in m)
            or not 1 <= m[0] <= m[1]):
        return f"{where}.m: expected [lo, hi] with 1 <= lo <= hi, found {m!r}"
    if not isinstance(r["positions"], list) or not all(p in POSITIONS for p in r["positions"]):
        return f"{where}.positions: expected a list of {', '.join(POSITIONS)}, found {r['positions']!r}"
    if not isinstance(r["invariant"], bool):
        return f"{where}.invariant: expected true or false, found {r['invariant']!r}"
    if not isinstance(r.get("differs", []), list) or not all(_difference(d) for d in r.get("differs", [])):
        return (f"{where}.differs: expected a list of objects of an N,K 'shape', an int 'm', a 'position' and a "
                f"number or null 'max_rel' (each optional), found {r.get('differs')!r:.120}")
    return None


def _difference(d: object) -> bool:
    """Whether ``d`` is one entry of a record's ``differs`` (what :meth:`Record.shortfall` formats)."""
    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return (isinstance(d, dict) and isinstance(d.get("shape", ""), str) and isinstance(d.get("position", ""), str)
            and (number(d.get("m", 0)) and not isinstance(d.get("m", 0), float))
            and (d.get("max_rel") is None or number(d["max_rel"])))


def validate_records(data: object) -> str | None:
    """Why ``data`` is not a valid records file, or None (pure, never raises)."""
    if not isinstance(data, dict) or not {"schema", "device_name", "records"} <= set(data) \
            or not set(data) <= {"schema", "device_name", "records", "note"}:
        return "expected an object with keys 'schema', 'device_name', 'records' (and optionally 'note')"
    if data["schema"] != SCHEMA or isinstance(data["schema"], bool):
        return f"schema: expected {SCHEMA}, found {data['schema']!r}"
    if not isinstance(data["device_name"], str) or not data["device_name"]:
        return f"device_name: expected a device name, found {data['device_name']!r}"
    if not isinstance(data["records"], list):
        return f"records: expected a list, found {type(data['records']).__name__}"
    for i, record in enumerate(data["records"]):
        problem = _check_record(f"records[{i}]", record)
        if problem is not None:
            return problem
    return None


def merge_records(base: Mapping[str, Any] | None, newer: Iterable[Record], device_name: str,
                  note: str | None = None) -> dict[str, Any]:
    """``base``'s records (a records file, or None) with ``newer`` replacing those of the same key."""
    records = {Record.from_dict(r).key: r for r in (base or {}).get("records", [])}
    records.update({r.key: r.to_dict() for r in newer})
    out: dict[str, Any] = {"schema": SCHEMA, "device_name": device_name, "records": list(records.values())}
    if note or (base or {}).get("note"):
        out["note"] = note or (base or {})["note"]
    return out


def batch_invariant_from_env(env: Mapping[str, str]) -> bool:
    """:data:`ENV_BATCH_INVARIANT` of a snapshot's environment (unset or blank: False); another value
    than 1/0, true/false, yes/no, on/off is an :class:`~fp8select.errors.InvalidInputError`."""
    value = env.get(ENV_BATCH_INVARIANT, "")
    flag = _FLAG_VALUES.get(value.strip().lower())
    if flag is None:
        raise InvalidInputError(f"{ENV_BATCH_INVARIANT}: expected 1 or 0 (true/false, yes/no, on/off), found {value!r}")
    return flag


def find_records(caps: Capabilities) -> list[tuple[str, dict[str, Any]]]:
    """The valid record files of the snapshot's device, lowest precedence first, with where each came from."""
    if not caps.device_name:
        return []
    paths = dict.fromkeys([device_path(SHIPPED_DIR, caps.device_name, "invariance"),
                           device_path(cache_dir(caps.env), caps.device_name, "invariance")])
    found = []
    for path in paths:
        data = load_table(path, caps.device_name, validate=validate_records, what="invariance records")
        if data is not None:
            found.append((f"fp8select/data/{path.name}" if path.parent == SHIPPED_DIR else str(path), data))
    return found


def invariance_for(caps: Capabilities, backends: Iterable[Any]) -> Invariance:
    """The invariance index of a chain on the snapshot's device, from :func:`find_records`."""
    return Invariance(caps, backends, find_records(caps))
