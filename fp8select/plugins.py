"""Third-party backends through pluggy (project ``fp8select``, entry-point group ``fp8select``).

A plugin module (or object) implements the hook :func:`fp8select_backends`, returning
backend classes or instances, each optionally wrapped in :class:`Placement` to say where it
goes in the priority order (by default just before ``reference``). Entry points are loaded
when :func:`load_plugins` runs (from :func:`fp8select.resolve`), never at import. A plugin
that fails to import, raises in its hook, returns something that is not a backend, or
reuses a taken name is reported (a warning and a rejected verdict) and ignored.
"""

from __future__ import annotations

import importlib.metadata
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from fp8select.backends.base import Backend

PROJECT = "fp8select"
BACKEND_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class Placement:
    """Where a plugin backend goes: before or after a named backend (default: before ``reference``)."""

    backend: Backend | type[Backend]
    before: str | None = None
    after: str | None = None


class PluginWarning(UserWarning):
    """A plugin could not be used; fp8select carries on without it."""


class _Spec:
    @hookspec
    def fp8select_backends(self) -> Sequence[Placement | Backend | type[Backend]]:  # type: ignore[empty-body]
        """Return the backends this plugin provides."""


@dataclass(frozen=True)
class PluginBackend:
    backend: Backend
    plugin: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    reason: str


@dataclass(frozen=True)
class LoadedPlugins:
    backends: tuple[PluginBackend, ...] = ()
    failures: tuple[PluginFailure, ...] = ()


def load_plugins(extra: Iterable[Any] = (), *, entry_points: bool = True, taken: Iterable[str] = ()) -> LoadedPlugins:
    """Load entry-point plugins (and ``extra`` plugin objects) and collect their backends."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(_Spec)
    failures: list[PluginFailure] = []

    def fail(plugin: str, reason: str) -> None:
        failures.append(PluginFailure(plugin, reason))
        warnings.warn(f"fp8select plugin {plugin!r} ignored: {reason}", PluginWarning, stacklevel=3)

    candidates: list[tuple[str, Any]] = []
    if entry_points:
        for ep in importlib.metadata.entry_points(group=PROJECT):
            try:
                candidates.append((ep.name, ep.load()))
            except Exception as exc:  # noqa: BLE001 - any import failure of third-party code
                fail(ep.name, f"failed to load entry point {ep.value!r}: {type(exc).__name__}: {exc}")
    for obj in extra:
        candidates.append((getattr(obj, "__name__", type(obj).__name__), obj))

    names = set(taken)
    found: list[PluginBackend] = []
    for plugin_name, obj in candidates:
        try:
            pm.register(obj, name=plugin_name)
        except Exception as exc:  # noqa: BLE001 - pluggy validation of third-party code
            fail(plugin_name, f"is not a valid plugin: {type(exc).__name__}: {exc}")
            continue
        for impl in pm.hook.fp8select_backends.get_hookimpls():
            if impl.plugin is not obj:
                continue
            try:
                # Whatever third-party code returns: a non-iterable fails in list() and is reported below.
                returned: Any = impl.function()
                items = list(returned) if returned is not None else []
            except Exception as exc:  # noqa: BLE001 - a third-party hook may raise anything
                fail(plugin_name, f"hook fp8select_backends raised {type(exc).__name__}: {exc}")
                continue
            for item in items:
                backend, before, after = _unpack(item)
                if backend is None:
                    fail(plugin_name, f"returned {item!r}, which is not a Backend subclass or instance")
                elif not backend.name:
                    fail(plugin_name, f"backend {type(backend).__name__} has no name")
                elif not isinstance(backend.name, str) or not BACKEND_NAME.fullmatch(backend.name):
                    fail(plugin_name, f"backend name {backend.name!r} is not valid: expected lowercase letters, digits, "
                                      "'-', '_' or '.', starting with a letter or digit (it is used in FP8SELECT_DISABLE lists)")
                elif backend.name in names:
                    fail(plugin_name, f"backend name {backend.name!r} is already taken")
                else:
                    names.add(backend.name)
                    found.append(PluginBackend(backend, plugin_name, before, after))
    return LoadedPlugins(tuple(found), tuple(failures))


def _unpack(item: Any) -> tuple[Backend | None, str | None, str | None]:
    before = after = None
    if isinstance(item, Placement):
        before, after, item = item.before, item.after, item.backend
    if isinstance(item, type) and issubclass(item, Backend):
        try:
            item = item()
        except Exception:  # noqa: BLE001 - a third-party constructor
            return None, None, None
    if isinstance(item, Backend):
        return item, before, after
    return None, None, None


def place(order: Sequence[str], plugins: Sequence[PluginBackend]) -> list[str]:
    """``order`` with each plugin backend inserted where its placement says."""
    result = list(order)
    for p in plugins:
        if p.after is not None and p.after in result:
            result.insert(result.index(p.after) + 1, p.backend.name)
        elif p.before is not None and p.before in result:
            result.insert(result.index(p.before), p.backend.name)
        elif "reference" in result:
            result.insert(result.index("reference"), p.backend.name)
        else:
            result.append(p.backend.name)
    return result
