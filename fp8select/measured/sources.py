"""Where a device's measurements come from, and the index the plans read.

For the snapshot's device, in increasing precedence: the tables shipped with fp8select
(``fp8select/data``; their rows checked by the tests, only their header here), the cache
directory's table (written by ``fp8select tune``), and the file named by
``FP8SELECT_TUNING_TABLE``; or instead of all three, a table handed to ``resolve(tuning=...)``.
Rows of a later source replace those of an earlier one for the same backend, versions, shape
and bucket, so a local re-measurement refines the shipped table without discarding it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fp8select.capabilities import Capabilities
from fp8select.measured.model import Measurements
from fp8select.measured.table import (
    ENV_TABLE,
    SHIPPED_DIR,
    TuningCacheWarning,
    backend_versions,
    cache_dir,
    cache_writable,
    load_table,
    table_path,
    validate_header,
    validate_table,
)

__all__ = ["ENV_TUNE", "find_tables", "measurements_for", "wants_load_time_tuning"]

ENV_TUNE = "FP8SELECT_TUNE"
"""``load``: measure each new layer shape at load time where its plan is open (:mod:`.loadtime`); ``off``
(any other value): never. Unset: where it pays (:func:`wants_load_time_tuning`)."""


def wants_load_time_tuning(caps: Capabilities, *, by_default: bool = True) -> bool:
    """Whether ``prepare()`` measures a layer shape whose plan the tables leave open: ``FP8SELECT_TUNE=load``
    yes, any other value no. Unset, where it pays: ``by_default`` (the device's own tables are read), on
    a CUDA device whose cache directory can be written, so that a shape's open buckets are measured once
    per machine and later starts find its rows."""
    value = caps.env.get(ENV_TUNE, "").strip().lower()
    if value:
        return value == "load"
    return by_default and caps.device_kind == "cuda" and cache_writable(caps.env)


def find_tables(caps: Capabilities) -> list[tuple[str, dict[str, Any]]]:
    """The usable tables for the snapshot's device, lowest precedence first, with where each came from."""
    if caps.device_kind == "cpu" or not caps.device_name:
        return []
    shipped = table_path(SHIPPED_DIR, caps.device_name)
    paths = [shipped, table_path(cache_dir(caps.env), caps.device_name)]
    explicit = caps.env.get(ENV_TABLE, "").strip()
    if explicit:
        paths.append(Path(explicit).expanduser())
        if not paths[-1].exists():  # a cache that is not there yet is silent; a file the user named is not
            warnings.warn(f"fp8select tuning table {explicit!r} ({ENV_TABLE}) ignored: no such file",
                          TuningCacheWarning, stacklevel=2)
    found = []
    for path in dict.fromkeys(paths):
        # fp8select's own tables are checked row by row by its tests, so only their header is here
        table = load_table(path, caps.device_name, validate=validate_header if path == shipped else validate_table)
        if table is not None:
            found.append((str(path), table))
    return found


def measurements_for(caps: Capabilities, backends: Iterable[Any],
                     tables: Iterable[Mapping[str, Any]]) -> Measurements | None:
    """The index of ``tables``' dense rows for the backends of a chain (each at its versions here), or None
    when there is nothing to index (no table, or tables of MoE rows only)."""
    tables = [table for table in tables if table["groups"]]
    if not tables:
        return None
    installed = {b.name: backend_versions(caps, getattr(b, "packages", ())) for b in backends}
    return Measurements(caps.device_name or str(tables[-1]["device_name"]), tables, installed)
