"""The resolver: a pure choice over a snapshot, and ``resolve()`` which gathers its inputs.

:func:`choose` is a pure function of (capabilities, candidates in priority order, explicit
choice, disabled set). :func:`resolve` detects capabilities when none are given, reads
``FP8SELECT_BACKEND`` / ``FP8SELECT_DISABLE`` from the snapshot's environment when the
arguments are not given, loads plugins, calls :func:`choose` and logs one
``fp8select.resolved`` event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fp8select._log import get_logger
from fp8select.backends import BUILTIN_BACKENDS, DEFAULT_ORDER, Backend
from fp8select.capabilities import Capabilities, detect_capabilities
from fp8select.errors import BackendRejectedError, NoBackendError, UnknownBackendError
from fp8select.plugins import LoadedPlugins, load_plugins, place
from fp8select.selection import Candidate, Selection

ENV_BACKEND = "FP8SELECT_BACKEND"
ENV_DISABLE = "FP8SELECT_DISABLE"


def builtin_backends() -> dict[str, Backend]:
    """A fresh instance of every built-in backend, by name."""
    return {cls.name: cls() for cls in BUILTIN_BACKENDS}


def parse_names(value: str | Iterable[str]) -> tuple[str, ...]:
    """``"a, b"`` or ``["a", "b"]`` -> ``("a", "b")`` (blank entries dropped)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(s.strip() for s in items if isinstance(s, str) and s.strip())


def choose(caps: Capabilities, backends: Mapping[str, Backend], order: Sequence[str], *,
           explicit: str | None = None, explicit_source: str = "argument",
           disabled: Sequence[str] = (), disabled_source: str = "argument",
           origins: Mapping[str, str] | None = None, failures: Sequence[tuple[str, str]] = ()) -> Selection:
    """Evaluate every candidate in ``order`` against ``caps`` and pick one (pure)."""
    valid = tuple(order)
    for name in valid:
        if name not in backends:
            raise UnknownBackendError(name, sorted(backends), parameter="order")
    if explicit is not None and explicit not in backends:
        raise UnknownBackendError(explicit, valid, parameter="backend" if explicit_source == "argument" else ENV_BACKEND)
    for name in disabled:
        if name not in backends:
            raise UnknownBackendError(name, valid, parameter="disable" if disabled_source == "argument" else ENV_DISABLE)
    origins = origins or {}
    candidates: list[Candidate] = []
    names = list(valid) + ([explicit] if explicit is not None and explicit not in valid else [])
    for rank, name in enumerate(names, 1):
        if name in disabled:
            how = "disable=" if disabled_source == "argument" else f"{ENV_DISABLE}="
            candidates.append(Candidate(rank, name, False, f"disabled by {how}{','.join(disabled)}", origins.get(name, "builtin")))
            continue
        verdict = backends[name].check(caps)
        candidates.append(Candidate(rank, name, verdict.ok, verdict.reason, origins.get(name, "builtin")))
    for offset, (plugin, reason) in enumerate(failures, len(candidates) + 1):
        candidates.append(Candidate(offset, f"plugin:{plugin}", False, reason, "plugin"))

    accepted = [backends[c.name] for c in candidates if c.accepted]
    if explicit is not None:
        verdict = next(c for c in candidates if c.name == explicit)
        if not verdict.accepted:
            raise BackendRejectedError(explicit, explicit_source, candidates)
        chosen, source = backends[explicit], explicit_source
    elif accepted:
        chosen, source = accepted[0], "auto"
    else:
        raise NoBackendError(f"this machine ({caps.device_kind}, torch {caps.torch_version})", candidates)
    chain = (chosen, *[b for b in accepted if b is not chosen])
    return Selection(chosen, tuple(candidates), source, caps, chain, tuple(disabled))


def resolve(capabilities: Capabilities | None = None, *, backend: str | None = None,
            disable: Iterable[str] | str = (), order: Sequence[str] | None = None,
            plugins: bool | Iterable[Any] = True) -> Selection:
    """Choose the block-FP8 linear backend for this machine (or for ``capabilities``).

    ``backend`` forces a choice (an error if it is rejected, never a silent substitute);
    ``disable`` removes backends from consideration; ``order`` replaces the default priority
    order (names; plugin backends are placed into the default order only). When ``backend``
    / ``disable`` are not given, ``FP8SELECT_BACKEND`` / ``FP8SELECT_DISABLE`` from the
    snapshot's environment apply. ``plugins``: True loads entry-point plugins, False none,
    an iterable of plugin objects uses those (and no entry points).
    """
    caps = capabilities if capabilities is not None else detect_capabilities()
    backends = builtin_backends()
    loaded = _load(plugins, backends)
    origins: dict[str, str] = {}
    for pb in loaded.backends:
        backends[pb.backend.name] = pb.backend
        origins[pb.backend.name] = f"plugin:{pb.plugin}"
    names = tuple(order) if order is not None else tuple(place(DEFAULT_ORDER, loaded.backends))

    explicit, explicit_source = backend, "argument"
    if explicit is None and caps.env.get(ENV_BACKEND, "").strip():
        explicit, explicit_source = caps.env[ENV_BACKEND].strip(), "environment"
    disabled, disabled_source = parse_names(disable), "argument"
    if not disabled and caps.env.get(ENV_DISABLE, "").strip():
        disabled, disabled_source = parse_names(caps.env[ENV_DISABLE]), "environment"

    log = get_logger()
    try:
        selection = choose(caps, backends, names, explicit=explicit, explicit_source=explicit_source,
                           disabled=disabled, disabled_source=disabled_source, origins=origins,
                           failures=[(f.plugin, f.reason) for f in loaded.failures])
    except (BackendRejectedError, NoBackendError) as exc:
        log.warning("fp8select.resolved", backend=None, source=explicit_source if explicit else "auto",
                    rejected={c.name: c.reason for c in exc.candidates if not c.accepted})
        raise
    log.info("fp8select.resolved", backend=selection.backend.name, source=selection.source,
             chain=[b.name for b in selection.chain],
             rejected={c.name: c.reason for c in selection.verdicts if not c.accepted},
             fingerprint=caps.fingerprint())
    return selection


def _load(plugins: bool | Iterable[Any], backends: Mapping[str, Backend]) -> LoadedPlugins:
    if plugins is True:
        return load_plugins(taken=backends)
    if plugins is False or plugins is None:
        return LoadedPlugins()
    return load_plugins(plugins, entry_points=False, taken=backends)
