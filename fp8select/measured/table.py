"""The tuning table on disk: measured times per backend, each at its own versions.

A table holds the measurements of one device model. Its rows are grouped by backend and by
the versions that backend's speed depends on (:func:`backend_versions`: torch, CUDA or HIP,
Triton, and the backend's own packages), so installing FlashInfer adds a group for
FlashInfer and leaves the Triton and cuBLAS groups valid::

    {"schema": 2, "device_name": "NVIDIA H200", "note": "...optional...",
     "groups": [{"backend": "triton",
                 "versions": {"torch": "2.11.0+cu130", "cuda": "13.0", "triton": "3.6.0"},
                 "shapes": {"2112,7168": {"1": {"us": 12.18, "config": {...}}, "2": {...}}}},
                {"backend": "deepgemm", "versions": {..., "deep_gemm": "2.6.1"}, "shapes": {...}}]}

``shapes`` maps ``"N,K"`` to M buckets (:mod:`fp8select.buckets`) to the whole-op median
time in microseconds and, for backends with launch parameters (Triton), the configuration
measured. An optional ``moe`` list holds MoE experts layers the same way, each entry also naming
its ``layout``, with ``"E,H,I,k"`` shape keys (:mod:`fp8select.measured.moe`); a table without one
is as before (fp8select versions before the ``moe`` key reject a table that has it). A row's optional
``runs`` (2 or more) says its time is the geometric mean of that many timings of the point, other runs'
folded into the measurement's (``benchmarks/merge_tuning.py --fold``); the optional ``folded`` list names
those runs (one string each, its time first).

A table is a cache: :func:`load_table` returns None with exactly one :class:`TuningCacheWarning`
for anything unusable (corrupt, truncated, another device, an unknown schema) and never raises;
:func:`save_table` replaces the file atomically.
:func:`check_table` gives the same checks as a typed error, for tables handed in as mappings.
Pure Python: no torch, no triton.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fp8select.buckets import M_BUCKETS
from fp8select.capabilities import Capabilities
from fp8select.errors import InvalidInputError

__all__ = [
    "ENV_CACHE_DIR",
    "ENV_TABLE",
    "SCHEMA",
    "SHIPPED_DIR",
    "TuningCacheWarning",
    "add_rows",
    "backend_versions",
    "cache_dir",
    "cache_writable",
    "check_table",
    "config_problem",
    "device_path",
    "group_key",
    "load_table",
    "merge_tables",
    "new_table",
    "release",
    "save_table",
    "shape_key",
    "table_path",
    "used_versions",
    "validate_header",
    "validate_table",
    "versions_text",
    "write_json",
]

SCHEMA = 2
ENV_CACHE_DIR = "FP8SELECT_CACHE_DIR"
ENV_TABLE = "FP8SELECT_TUNING_TABLE"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data"
_TOP_KEYS = ("schema", "device_name", "groups")
_OPTIONAL_TOP_KEYS = ("note", "moe", "folded")
_BUCKETS = frozenset(str(b) for b in M_BUCKETS)
_ROW_KEYS = frozenset({"us", "config", "runs"})
_MOE_ROW_KEYS = _ROW_KEYS | {"skewed_us"}
"""A MoE row's keys: the dense row's, and its time under skewed routing (``tune --moe`` where a point has
several routes; :mod:`fp8select.moe_plan` ranks by both)."""


class TuningCacheWarning(UserWarning):
    """A tuning table could not be used (it is ignored; fp8select carries on without it)."""


def shape_key(n: int, k: int) -> str:
    return f"{n},{k}"


def backend_versions(caps: Capabilities, packages: Iterable[str] = ()) -> dict[str, str]:
    """What a backend's measured speed depends on besides the device: torch, CUDA or HIP, Triton
    (fp8select's activation quantizer and kernels) and the backend's own ``packages``."""
    versions = {"torch": caps.torch_version, "cuda": caps.cuda_version, "hip": caps.hip_version,
                "triton": caps.packages.get("triton")}
    versions.update({name: release(v) if (v := caps.packages.get(name)) else None for name in packages})
    return {k: v for k, v in versions.items() if v is not None}


def release(version: str) -> str:
    """A vendor package's version without its local label: "2.6.1+local" and "2.6.1+54e2261" name builds of
    one release, whose rows stay valid (torch's "+cu130" names another build of its kernels and is kept:
    :func:`backend_versions` applies this to vendor packages only)."""
    return version.split("+", 1)[0]


VersionsKey = tuple[tuple[str, str], ...]
"""A row set's versions as a hashable key: ``tuple(sorted(versions.items()))``."""


def used_versions(by_versions: Mapping[VersionsKey, Mapping[Any, Mapping[Any, Any]]],
                  installed: Mapping[str, str]) -> tuple[VersionsKey, bool]:
    """Which of one backend's row sets (shape -> bucket -> row, per versions) plans read, and whether
    those are the installed versions: the set at the versions installed here when a table holds one,
    else the set with the most rows (the dense layers' and the MoE rows' one policy)."""
    here = tuple(sorted(installed.items()))
    if here in by_versions:
        return here, True
    return max(by_versions, key=lambda v: sum(len(b) for b in by_versions[v].values())), False


def versions_text(versions: Mapping[str, str]) -> str:
    """``cuda 13.0, torch 2.11.0+cu130`` (sorted by name; empty for none)."""
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))


def cache_dir(env: Mapping[str, str]) -> Path:
    """The directory holding tuning tables: ``FP8SELECT_CACHE_DIR``, else ``$XDG_CACHE_HOME/fp8select``
    (an absolute ``XDG_CACHE_HOME`` only, as the XDG spec says), else ``~/.cache/fp8select``.

    ``env`` is the snapshot's environment (``Capabilities.env``), which records both variables.
    """
    override = env.get(ENV_CACHE_DIR, "").strip()
    if override:
        return Path(override).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "fp8select"
    return Path.home() / ".cache" / "fp8select"


def cache_writable(env: Mapping[str, str]) -> bool:
    """Whether a table could be written into the cache directory: it, or the nearest existing folder
    that it would be created in, takes new files."""
    folder = cache_dir(env)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def device_path(directory: Path | str, device_name: str, kind: str = "tuning") -> Path:
    """Where a file of one device model lives in ``directory``: ``tuning-nvidia-h200.json`` (a tuning
    table), ``invariance-nvidia-h200.json`` (``kind="invariance"``: :mod:`.invariance`'s records)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"
    return Path(directory) / f"{kind}-{slug}.json"


def table_path(directory: Path | str, device_name: str) -> Path:
    """Where the table of one device model lives in ``directory`` (``tuning-nvidia-h200.json``)."""
    return device_path(directory, device_name)


def new_table(device_name: str, note: str | None = None) -> dict[str, Any]:
    table: dict[str, Any] = {"schema": SCHEMA, "device_name": device_name, "groups": []}
    if note:
        table["note"] = note
    return table


def _positive_int(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 9 and int(text) > 0


def row_problem(backend: str, row: object, moe: bool = False) -> str | None:
    """Why ``row`` is not a measurement, as the end of a message the caller begins with the row's place."""
    if not isinstance(row, dict):
        return f": expected an object, found {type(row).__name__}"
    keys = _MOE_ROW_KEYS if moe else _ROW_KEYS
    if not row.keys() <= keys:
        unknown = sorted(set(row) - keys)
        optional = " and ".join(map(repr, sorted(keys - {"us"})))
        return f": unknown key(s) {', '.join(map(repr, unknown))}; expected 'us' and optionally {optional}"
    for key in ("us", *(["skewed_us"] if "skewed_us" in row else [])):
        us = row.get(key)
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us <= 0:
            return f".{key}: expected a positive finite number of microseconds, found {us!r}"
    runs = row.get("runs")
    if "runs" in row and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 2):
        return f".runs: expected the number of timings averaged, 2 or more, found {runs!r}"
    config = row.get("config")
    if config is not None:
        if not isinstance(config, dict):
            return f".config: expected an object or null, found {config!r}"
        problem = config_problem(backend, config, moe)
        if problem is not None:
            return f".config: {problem}"
    return None


def config_problem(backend: str, config: Mapping[str, Any], moe: bool = False) -> str | None:
    """Why a launch configuration is invalid for ``backend`` (only Triton has them), or None.

    A table's rows share a few dozen configurations: each distinct one is checked once per process."""
    if backend != "triton":
        return f"expected no configuration for backend {backend!r}, found one"
    # keyed with each value's type too: True == 1 and 1.0 == 1, but a configuration takes only ints
    items = tuple((key, type(value), value) for key, value in config.items())
    try:
        return _triton_config_problem(frozenset(items), moe)
    except TypeError:  # a value that cannot be a set member (a list): not a configuration, checked uncached
        return _triton_config_problem.__wrapped__(items, moe)


@functools.lru_cache(maxsize=1024)
def _triton_config_problem(items: Iterable[tuple[str, type, Any]], moe: bool) -> str | None:
    from fp8select.kernels.moe_config import MoeTritonConfig  # pure python
    from fp8select.kernels.triton_config import TritonConfig

    try:
        (MoeTritonConfig if moe else TritonConfig).from_dict({key: value for key, _, value in items})
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def _check_group(where: str, group: object, moe: bool = False) -> str | None:
    if not isinstance(group, dict):
        return f"{where}: expected an object, found {type(group).__name__}"
    keys = ("backend", "layout", "versions", "shapes") if moe else ("backend", "versions", "shapes")
    if set(group) != set(keys):
        return f"{where}: expected keys {', '.join(map(repr, keys))}, found {sorted(map(str, group))}"
    backend, versions, shapes = group["backend"], group["versions"], group["shapes"]
    if not isinstance(backend, str) or not backend:
        return f"{where}.backend: expected a backend name, found {backend!r}"
    if moe and (not isinstance(group["layout"], str) or not group["layout"]):
        return f"{where}.layout: expected a layout name, found {group['layout']!r}"
    if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items()):
        return f"{where}.versions: expected an object of version strings, found {versions!r}"
    if not isinstance(shapes, dict):
        return f"{where}.shapes: expected an object, found {type(shapes).__name__}"
    for shape, buckets in shapes.items():
        parts = shape.split(",") if isinstance(shape, str) else []
        if len(parts) != (4 if moe else 2) or not all(_positive_int(p) for p in parts):
            expected = "'E,H,I,k'" if moe else "'N,K'"
            return f"{where}.shapes: expected keys {expected} with positive integers, found {shape!r}"
        if not isinstance(buckets, dict):
            return f"{where}.shapes[{shape!r}]: expected an object of M buckets, found {type(buckets).__name__}"
        for bucket, row in buckets.items():
            if bucket not in _BUCKETS:
                return f"{where}.shapes[{shape!r}]: expected M buckets 1, 2, 4, ..., 8192, found {bucket!r}"
            problem = row_problem(backend, row, moe)
            if problem is not None:
                return f"{where}.shapes[{shape!r}][{bucket!r}]{problem}"
    return None


def validate_table(table: object) -> str | None:
    """Why ``table`` does not follow the schema, or None when it does (pure, never raises)."""
    problem = validate_header(table)
    if problem is not None:
        return problem
    assert isinstance(table, dict)  # (validate_header says so)
    for section in ("groups", "moe"):
        for i, group in enumerate(table.get(section, [])):
            problem = _check_group(f"{section}[{i}]", group, moe=section == "moe")
            if problem is not None:
                return problem
    return None


def validate_header(table: object) -> str | None:
    """:func:`validate_table` but for the rows: why ``table``'s keys, schema, device name and lists are not
    the schema's, or None. What the tables shipped with fp8select are read with (a tenth of the time; the
    rows are checked whole by the tests, as the package is built), never a table from elsewhere."""
    if not isinstance(table, dict):
        return f"expected a JSON object, found {type(table).__name__}"
    missing = [k for k in _TOP_KEYS if k not in table]
    if missing:
        return f"expected keys {', '.join(_TOP_KEYS)}, missing {', '.join(missing)}"
    unknown = sorted(str(k) for k in set(table) - set(_TOP_KEYS) - set(_OPTIONAL_TOP_KEYS))
    if unknown:
        return f"unknown key(s) {', '.join(unknown)}"
    if table["schema"] != SCHEMA or isinstance(table["schema"], bool):
        return f"schema: expected {SCHEMA}, found {table['schema']!r}"
    if not isinstance(table["device_name"], str) or not table["device_name"]:
        return f"device_name: expected a device name, found {table['device_name']!r}"
    if "note" in table and not isinstance(table["note"], str):
        return f"note: expected a string, found {table['note']!r}"
    if "folded" in table and not (isinstance(table["folded"], list) and all(isinstance(r, str) for r in table["folded"])):
        return f"folded: expected a list of strings, found {table['folded']!r}"
    for key in ("groups", "moe"):
        if not isinstance(table.get(key, []), list):
            return f"{key}: expected a list, found {type(table[key]).__name__}"
    return None


def check_table(table: object, parameter: str = "tuning") -> dict[str, Any]:
    """``table`` as a plain dict when it follows the schema, else :class:`InvalidInputError` naming the problem."""
    if isinstance(table, Mapping):
        table = json.loads(json.dumps(dict(table), allow_nan=True))  # a private, plain copy
    problem = validate_table(table)
    if problem is not None:
        raise InvalidInputError(f"{parameter}: expected a tuning table (schema {SCHEMA}), found a malformed one: {problem}")
    assert isinstance(table, dict)
    return table


def group_key(group: Mapping[str, Any]) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """What identifies a group (or ``moe`` entry) of a table: backend, layout ("" for dense groups), versions."""
    return group["backend"], group.get("layout", ""), tuple(sorted(group["versions"].items()))


def merge_tables(base: Mapping[str, Any], newer: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``newer``'s rows added, ``newer`` winning where both have a row for the same
    backend (and layout), versions, shape and bucket (both tables of one device); dense groups and
    MoE entries alike."""
    merged = json.loads(json.dumps(dict(base)))
    for section in ("groups", "moe"):
        if not newer.get(section):
            continue
        into_list = merged.setdefault(section, [])
        index = {group_key(g): g for g in into_list}
        for group in newer[section]:
            into = index.get(group_key(group))
            if into is None:
                into = index[group_key(group)] = {**json.loads(json.dumps(group)), "shapes": {}}
                into_list.append(into)
            for shape, buckets in group["shapes"].items():
                into["shapes"].setdefault(shape, {}).update(json.loads(json.dumps(buckets)))
    return merged


def save_table(path: Path | str, table: Mapping[str, Any]) -> None:
    """Write ``table`` to ``path`` atomically: readers see the old file or the new one, never a mix.

    The table is checked first (:class:`InvalidInputError`: a bad table is the caller's bug).
    The JSON goes to a temporary file in the same directory, is flushed and ``fsync``-ed, then
    ``os.replace``-d over ``path``; concurrent writers leave one writer's complete table.
    """
    write_json(path, check_table(table, "table"), _table_text)


def add_rows(path: Path | str, device_name: str, table: Mapping[str, Any]) -> None:
    """Merge ``table``'s rows into the tuning table of ``device_name`` at ``path`` and write it (:func:`save_table`).

    The file is read just before it is written, so rows another process added since (a server's load-time
    measurement during a long ``tune``) stay. A file there that holds no usable table of this device (another
    device's, a newer fp8select's schema, corrupt: :func:`load_table` warns why) is moved aside to
    ``<name>.set-aside``, never overwritten."""
    target = Path(path).expanduser()
    existing = load_table(target, device_name)
    if existing is None and os.path.lexists(target):
        aside = target.with_name(target.name + ".set-aside")
        os.replace(target, aside)
        warnings.warn(f"fp8select tuning table {str(target)!r} moved to {str(aside)!r}: it holds no usable table of "
                      f"{device_name}, and the new rows are written in its place", TuningCacheWarning, stacklevel=2)
    save_table(target, merge_tables(existing, table) if existing is not None else table)


def _table_text(table: Mapping[str, Any]) -> str:
    """``table`` as JSON with one line per shape (its M buckets' rows together): half the bytes of one
    line per value, quicker to read, and a diff shows which shapes a measurement changed."""
    def dumps(value: Any) -> str:
        return json.dumps(value, sort_keys=True, allow_nan=False)

    def numeric(key: str) -> tuple[int, ...]:
        return tuple(int(part) for part in key.split(","))

    def buckets_text(buckets: Mapping[str, Any]) -> str:
        return "{" + ", ".join(f"{dumps(b)}: {dumps(buckets[b])}" for b in sorted(buckets, key=numeric)) + "}"

    def group_text(group: Mapping[str, Any]) -> str:
        head = [f"  {dumps(key)}: {dumps(value)}" for key, value in sorted(group.items()) if key != "shapes"]
        shapes = ",\n".join(f"   {dumps(shape)}: {buckets_text(group['shapes'][shape])}"
                             for shape in sorted(group["shapes"], key=numeric))
        return " {\n" + ",\n".join([*head, '  "shapes": {\n' + shapes + "\n  }"]) + "\n }"

    parts = []
    for key, value in sorted(table.items()):
        if key in ("groups", "moe"):
            value_text = "[\n" + ",\n".join(group_text(g) for g in value) + "\n]" if value else "[]"
        else:
            value_text = dumps(value)
        parts.append(f"{dumps(key)}: {value_text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_json(path: Path | str, data: Mapping[str, Any],
               text: Callable[[Mapping[str, Any]], str] | None = None) -> None:
    """Write ``data`` as JSON to ``path`` atomically (:func:`save_table` says how); ``text`` renders it
    (default: indented, keys sorted)."""
    target = Path(os.path.realpath(Path(path).expanduser()))  # through a symlink: its file is written, the link kept
    target.parent.mkdir(parents=True, exist_ok=True)
    rendered = (text or _indented)(data)
    mode = _file_mode(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(rendered)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def _file_mode(target: Path) -> int:
    """The permissions a written file gets: the file's it replaces, else a new file's under the umask (a temporary
    file is made 0600, which other users, a service account reading a table tuned as root say, cannot read)."""
    try:
        return os.stat(target).st_mode & 0o777
    except OSError:
        pass
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = 0o022
    return 0o666 & ~umask


def _indented(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable where the platform allows (POSIX); best effort elsewhere."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_table(path: Path | str, device_name: str | None = None, *,
               validate: Callable[[object], str | None] = validate_table, what: str = "tuning table") -> dict[str, Any] | None:
    """The table at ``path`` if it is valid (and measured on ``device_name``, when given), else None.

    A missing file is a cold cache: None, silently. Anything else that makes the table unusable
    (unreadable, not UTF-8, corrupt or truncated JSON, wrong schema, another device) gives None
    and exactly one :class:`TuningCacheWarning` naming the file and the problem. Never raises.
    ``validate`` and ``what``: another per-device JSON file read the same way (:mod:`.invariance`'s records).
    """
    try:
        problem, table = _read(Path(path), device_name, validate)
    except Exception as exc:  # noqa: BLE001 - a cache must never crash the process
        problem, table = f"unreadable ({type(exc).__name__}: {exc})", None
    if problem is not None:
        if problem != "missing":
            warnings.warn(f"fp8select {what} {str(path)!r} ignored: {problem}", TuningCacheWarning, stacklevel=2)
        return None
    return table


def _read(path: Path, device_name: str | None,
          validate: Callable[[object], str | None]) -> tuple[str | None, dict[str, Any] | None]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return "missing", None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})", None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"corrupt (not UTF-8 at byte {exc.start})", None
    if not text.strip():
        return "truncated (empty file)", None
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            return f"truncated (JSON ends early at character {exc.pos})", None
        return f"corrupt (invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno})", None
    except (RecursionError, ValueError) as exc:
        return f"corrupt ({type(exc).__name__}: {exc})", None
    problem = validate(table)
    if problem is not None:
        return f"invalid schema ({problem})", None
    if device_name is not None and table["device_name"] != device_name:
        return f"measured on another device (found {table['device_name']!r}, expected {device_name!r})", None
    return None, table
