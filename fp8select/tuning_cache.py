"""The on-disk tuning table: measured backend choices per shape, safe to read and write.

A tuning table records, for one device and one software stack, which backend (and which
launch config) was fastest for each layer shape and M bucket. It is a cache: anything
wrong with it (corrupt, truncated, written on another device or with another torch, an
unknown schema) makes :func:`load_table` return ``None`` with exactly one
:class:`TuningCacheWarning`, so the caller re-tunes or uses defaults; it never raises.
Writers replace the file atomically (a temporary file in the same directory, ``fsync``,
``os.replace``), so concurrent ``tune`` runs on one cache leave one complete table, never a
mix or a half-written file.

Table schema (``SCHEMA`` = 1)::

    {"schema": 1, "fingerprint": str, "device_name": str, "versions": {name: version},
     "entries": {"N,K": {"<m_bucket>": {"backend": str, "config": {...} | null, "us": float}}}}

This module imports neither torch nor triton, so tools can read tables cheaply.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_CACHE_DIR",
    "SCHEMA",
    "TuningCacheWarning",
    "cache_dir",
    "fingerprint",
    "load_table",
    "new_table",
    "save_table",
    "table_path",
    "validate_table",
]

SCHEMA = 1
ENV_CACHE_DIR = "FP8SELECT_CACHE_DIR"
_TOP_KEYS = ("schema", "fingerprint", "device_name", "versions", "entries")


class TuningCacheWarning(UserWarning):
    """A tuning table could not be used (it is ignored; fp8select carries on without it)."""


def cache_dir(env: Mapping[str, str]) -> Path:
    """The directory holding tuning tables.

    ``env`` is the snapshot's environment (``selection.capabilities.env``, which captures every
    ``FP8SELECT_*`` variable) or ``os.environ`` from a tool. ``FP8SELECT_CACHE_DIR`` wins; else
    ``$XDG_CACHE_HOME/fp8select`` when ``env`` has ``XDG_CACHE_HOME``; else ``~/.cache/fp8select``
    (the XDG default). Taking the mapping as an argument keeps this a function of its input.
    """
    override = env.get(ENV_CACHE_DIR, "").strip()
    if override:
        return Path(override).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):  # the XDG spec says relative values are to be ignored
        return Path(xdg) / "fp8select"
    return Path.home() / ".cache" / "fp8select"


def fingerprint(device_name: str, torch_version: str, triton_version: str | None,
                backend_versions: Mapping[str, str]) -> str:
    """A short stable hash of what a measurement depends on: the device and the software stack.

    Two tables with the same fingerprint were measured on the same device model with the
    same torch, triton and vendor packages, so their numbers are interchangeable.
    """
    payload = {
        "device_name": device_name,
        "torch": torch_version,
        "triton": triton_version,
        "backends": dict(sorted((str(k), str(v)) for k, v in backend_versions.items())),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def table_path(directory: Path | str, table_fingerprint: str) -> Path:
    """Where the table for one fingerprint lives in ``directory`` (one file per stack)."""
    return Path(directory) / f"tuning-{table_fingerprint}.json"


def new_table(device_name: str, versions: Mapping[str, str | None]) -> dict[str, Any]:
    """An empty table for this device and stack (``versions`` needs ``torch``; ``triton`` optional).

    The fingerprint is computed from ``versions``: ``torch`` and ``triton`` as such, every other
    entry as a backend package version.
    """
    torch_version = versions.get("torch")
    if not isinstance(torch_version, str) or not torch_version:
        raise ValueError(f"versions: expected a 'torch' version string, found {torch_version!r}")
    others = {k: str(v) for k, v in versions.items() if k not in ("torch", "triton") and v is not None}
    fp = fingerprint(device_name, torch_version, versions.get("triton"), others)
    return {"schema": SCHEMA, "fingerprint": fp, "device_name": device_name,
            "versions": {k: v for k, v in versions.items() if v is not None}, "entries": {}}


def _is_shape_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    parts = key.split(",")
    return len(parts) == 2 and all(p.strip().isdigit() and int(p) > 0 for p in parts)


def _is_bucket_key(key: object) -> bool:
    if not isinstance(key, str) or not key.isdigit():
        return False
    value = int(key)
    return value >= 1 and value & (value - 1) == 0


def validate_table(table: object) -> str | None:
    """Why ``table`` does not follow the schema, or None when it does (pure, never raises)."""
    if not isinstance(table, dict):
        return f"expected a JSON object, found {type(table).__name__}"
    missing = [k for k in _TOP_KEYS if k not in table]
    if missing:
        return f"expected keys {', '.join(_TOP_KEYS)}, missing {', '.join(missing)}"
    if table["schema"] != SCHEMA or isinstance(table["schema"], bool):
        return f"schema: expected {SCHEMA}, found {table['schema']!r}"
    for key in ("fingerprint", "device_name"):
        if not isinstance(table[key], str):
            return f"{key}: expected a string, found {table[key]!r}"
    versions = table["versions"]
    if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items()):
        return f"versions: expected an object of strings, found {versions!r}"
    entries = table["entries"]
    if not isinstance(entries, dict):
        return f"entries: expected an object, found {type(entries).__name__}"
    for shape, buckets in entries.items():
        if not _is_shape_key(shape):
            return f"entries: expected keys 'N,K' with positive integers, found {shape!r}"
        if not isinstance(buckets, dict):
            return f"entries[{shape!r}]: expected an object of M buckets, found {type(buckets).__name__}"
        for bucket, entry in buckets.items():
            where = f"entries[{shape!r}][{bucket!r}]"
            if not _is_bucket_key(bucket):
                return f"entries[{shape!r}]: expected power-of-two M bucket keys, found {bucket!r}"
            if not isinstance(entry, dict):
                return f"{where}: expected an object, found {type(entry).__name__}"
            backend, config, us = entry.get("backend"), entry.get("config", "absent"), entry.get("us")
            if not isinstance(backend, str) or not backend:
                return f"{where}.backend: expected a backend name, found {backend!r}"
            if config is not None and not isinstance(config, dict):
                return f"{where}.config: expected an object or null, found {config!r}"
            if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us < 0:
                return f"{where}.us: expected a finite non-negative number, found {us!r}"
    return None


def save_table(path: Path | str, table: Mapping[str, Any]) -> None:
    """Write ``table`` to ``path`` atomically: readers see the old file or the new one, never a mix.

    The table is validated first (``ValueError`` naming the problem: a bad table is a bug in
    the caller, not a cache problem). The JSON goes to a temporary file in the same
    directory, is flushed and ``fsync``-ed, then ``os.replace``-d over ``path``; concurrent
    writers therefore leave one writer's complete table.
    """
    data = dict(table)
    problem = validate_table(data)
    if problem is not None:
        raise ValueError(f"table: {problem}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


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


def load_table(path: Path | str, expected_fingerprint: str, *, device_name: str | None = None,
               versions: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The table at ``path`` if it is valid and was measured for ``expected_fingerprint``, else None.

    A missing file is a cold cache: None, silently. Anything else that makes the table
    unusable (unreadable, not UTF-8, corrupt or truncated JSON, wrong schema, another device,
    another torch or package version) gives None and exactly one :class:`TuningCacheWarning`
    naming the file and the problem. ``device_name`` / ``versions`` (this process's) only make
    a mismatch's warning say what differs. Never raises.
    """
    try:
        problem, table = _read(Path(path), expected_fingerprint, device_name, versions)
    except Exception as exc:  # noqa: BLE001 - a cache must never crash the process
        problem, table = f"unreadable ({type(exc).__name__}: {exc})", None
    if problem is not None:
        if problem != "missing":
            warnings.warn(f"fp8select tuning table {str(path)!r} ignored: {problem}", TuningCacheWarning, stacklevel=2)
        return None
    return table


def _read(path: Path, expected: str, device_name: str | None,
          versions: Mapping[str, str] | None) -> tuple[str | None, dict[str, Any] | None]:
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
        if exc.pos >= len(text.rstrip()):
            return f"truncated (JSON ends early at character {exc.pos})", None
        return f"corrupt (invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno})", None
    problem = validate_table(table)
    if problem is not None:
        return f"invalid schema ({problem})", None
    if table["fingerprint"] != expected:
        return _mismatch(table, expected, device_name, versions), None
    return None, table


def _mismatch(table: dict[str, Any], expected: str, device_name: str | None,
              versions: Mapping[str, str] | None) -> str:
    """Say why a table's fingerprint differs: another device, another torch, or another stack."""
    if device_name is not None and table["device_name"] != device_name:
        return f"measured on another device (found {table['device_name']!r}, expected {device_name!r})"
    found = table["versions"]
    if versions is not None:
        if "torch" in versions and found.get("torch") != versions["torch"]:
            return f"measured with another torch (found {found.get('torch')!r}, expected {versions['torch']!r})"
        differ = sorted(k for k in set(found) | set(versions) if found.get(k) != versions.get(k))
        if differ:
            detail = ", ".join(f"{k} {found.get(k)!r} != {versions.get(k)!r}" for k in differ)
            return f"measured with other package versions ({detail})"
    return f"fingerprint mismatch (found {table['fingerprint']!r}, expected {expected!r})"
