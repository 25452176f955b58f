"""``resolve()``: what an engine calls at start-up, from facts to a settled :class:`Selection`.

:func:`resolve` detects capabilities when none are given, reads
``FP8SELECT_BACKEND`` / ``FP8SELECT_DISABLE`` from the snapshot's environment when the
arguments are not given, loads plugins, calls :func:`fp8select.decision.choose` (the pure
choice), verifies the
chosen chain on the device (:mod:`fp8select.verify_chain`) and reconciles the decision across the
ranks of a process group (:mod:`fp8select.distributed`), and logs one ``fp8select.resolved``
event. It also gives the selection its tuning tables and its load-time measurer, so it sits
above measurement (:mod:`fp8select.measure`) in the import order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Literal, overload

import torch

from fp8select._log import get_logger
from fp8select.backends import DEFAULT_ORDER, Backend
from fp8select.capabilities import Capabilities
from fp8select.decision import ENV_BACKEND, ENV_DISABLE, builtin_backends, choose
from fp8select.detect import detect_capabilities
from fp8select.errors import BackendRejectedError, BatchInvariantError, InvalidDtypeError, InvalidInputError, NoBackendError
from fp8select.inputs import check_max_weight_copies
from fp8select.measure.loadtime import measure_moe_shape, measure_shape
from fp8select.measured.invariance import batch_invariant_from_env, invariance_for
from fp8select.measured.sources import find_tables, measurements_for, wants_load_time_tuning
from fp8select.measured.table import check_table
from fp8select.names import explicit_choice, parse_names
from fp8select.plugins import LoadedPlugins, load_plugins, place, plugin_timeout
from fp8select.selection import Selection
from fp8select.verdict import Candidate
from fp8select.verify import remembered
from fp8select.verify_chain import (
    BACKGROUND_DEVICES,
    all_remembered,
    import_in_background,
    usable_device,
    verify_chain,
    verify_in_background,
)


@overload
def resolve(capabilities: Capabilities | None = None, *, backend: str | None = None,
            disable: Iterable[str] | str = (), order: Sequence[str] | str | None = None,
            plugins: bool | Iterable[Any] = True, verify: bool | None = None, background: Literal[False] = False,
            group: Any = None, on_mismatch: str = "common", tuning: bool | Mapping[str, Any] = True,
            max_weight_copies: int | None = 1, batch_invariant: bool | None = None) -> Selection: ...


@overload
def resolve(capabilities: Capabilities | None = None, *, backend: str | None = None,
            disable: Iterable[str] | str = (), order: Sequence[str] | str | None = None,
            plugins: bool | Iterable[Any] = True, verify: bool | None = None, background: Literal[True],
            group: Any = None, on_mismatch: str = "common", tuning: bool | Mapping[str, Any] = True,
            max_weight_copies: int | None = 1, batch_invariant: bool | None = None) -> Future[Selection]: ...


def resolve(capabilities: Capabilities | None = None, *, backend: str | None = None,
            disable: Iterable[str] | str = (), order: Sequence[str] | str | None = None,
            plugins: bool | Iterable[Any] = True, verify: bool | None = None, background: bool = False,
            group: Any = None, on_mismatch: str = "common", tuning: bool | Mapping[str, Any] = True,
            max_weight_copies: int | None = 1, batch_invariant: bool | None = None) -> Selection | Future[Selection]:
    """Choose the block-FP8 linear backend for this machine (or for ``capabilities``).

    ``backend`` forces a choice (an error if it is rejected, never a silent substitute);
    ``disable`` removes backends from consideration; ``order`` replaces the default priority
    order (names; plugin backends are placed into the default order only). When ``backend``
    / ``disable`` are not given, ``FP8SELECT_BACKEND`` / ``FP8SELECT_DISABLE`` from the
    snapshot's environment apply. ``plugins``: True loads entry-point plugins, False none,
    an iterable of plugin objects uses those (and no entry points).

    ``verify`` runs one small problem through every backend of the chosen chain on the
    snapshot's device and compares it with an fp64 reference (:mod:`fp8select.verify`); one
    that raises or is numerically wrong is rejected with that reason (event
    ``fp8select.verify_failed``) and the next accepted backend is taken, except that an
    explicit choice that fails raises :class:`BackendRejectedError`. ``verify=True`` runs every
    check (the snapshot's device must be usable here); ``False`` none; ``None`` (the default)
    verifies where it can: the snapshot's device is a GPU (a CPU's only backends are the
    pure-torch reference and the Triton interpreter) and this process can use it (a replayed
    snapshot of another machine is not verified, and its notes say so). With verification on,
    functional probes for uncertain version gates also run
    (:func:`fp8select.verify.run_functional_probes`), and a built-in backend that passed before
    on this device model with the same versions is not run again (:func:`fp8select.verify.remembered`,
    kept in the cache directory), except with ``verify=True``.

    ``background``: False (the default) returns the settled :class:`Selection`, verified. True
    returns a ``concurrent.futures.Future`` of it at once and verifies on a side thread while
    the caller goes on (loading its weights; :mod:`fp8select.verify_chain`); with nothing left to
    verify (every pass remembered) the side thread imports the chain's vendor packages instead,
    the largest part of a warm start's ``prepare``. ``result()`` gives the selection, or raises
    what resolving raised. Not with a ``group``.

    ``group``: a ``torch.distributed`` process group (or ``"world"`` for the default one);
    the ranks exchange fingerprints and choices (:func:`fp8select.distributed.agree`), and
    when they differ ``on_mismatch="common"`` takes the best backend every rank accepts while
    ``"raise"`` raises :class:`~fp8select.errors.RankMismatchError` with each rank's verdicts.
    Every rank must call ``resolve`` with a group (it is a collective).

    ``tuning``: True reads the measurements of this device (:mod:`fp8select.measured.sources`: the
    tables shipped with fp8select, the cache directory's, ``FP8SELECT_TUNING_TABLE``); each layer
    prepared from the selection then plans, per M bucket, the fastest backend of the chain
    (:mod:`fp8select.plan`). False uses none (the plan follows the priority order); a mapping
    is used as the only table (checked like a file: :class:`~fp8select.errors.InvalidInputError`
    when malformed). With ``group``, rank 0's tables are broadcast, so every rank makes the same
    plans. ``max_weight_copies``: how many copies of a weight beyond the checkpoint's a layer may
    hold (1 by default; 0 for none, None for no bound).

    ``batch_invariant``: True makes every layer's plan keep each output row a function of that
    row and the weights alone, bitwise the same for any M, any position in the batch and run to
    run: one backend and one configuration schedule for every M, among the backends that a
    measured record for the installed versions says are invariant on this device
    (:mod:`fp8select.measured.invariance`), the fastest by the plan's estimates. None (the default)
    reads ``FP8SELECT_BATCH_INVARIANT`` from the snapshot's environment. When no backend of the
    chain qualifies, :class:`~fp8select.errors.BatchInvariantError` names each one's reason.
    """
    _check_arguments(capabilities, verify, plugins, group, on_mismatch, tuning)
    check_max_weight_copies(max_weight_copies)
    if batch_invariant is not None and not isinstance(batch_invariant, bool):
        raise InvalidDtypeError(f"batch_invariant: expected True, False or None, found {batch_invariant!r}")
    if not isinstance(background, bool):
        raise InvalidDtypeError(f"background: expected True or False, found {background!r}")
    if background and group is not None:
        raise InvalidInputError("background: a process group resolves collectively, before returning; "
                                "pass background=False with a group")
    given = check_table(tuning) if isinstance(tuning, Mapping) else None
    caps = detect_capabilities() if capabilities is None else capabilities
    invariant = batch_invariant if batch_invariant is not None else batch_invariant_from_env(caps.env)
    if group is None:
        selection, later = _resolve_here(caps, backend, disable, order, plugins, verify, background=background)
        selection = _with_tuning(replace(selection, max_weight_copies=max_weight_copies), tuning, given)
        selection = _with_invariance(selection, invariant)
        if not background or later is None:
            return selection
        return later(selection)
    from fp8select.distributed import agree

    outcome: Selection | BaseException
    try:
        outcome, _ = _resolve_here(caps, backend, disable, order, plugins, verify)
    except Exception as exc:  # noqa: BLE001 - reported to the other ranks, then re-raised by agree
        outcome = exc
    agreed = agree(outcome, None if isinstance(group, str) else group, on_mismatch=on_mismatch)
    return _with_invariance(_with_tuning(replace(agreed, max_weight_copies=max_weight_copies, group=group), tuning,
                                         given, group), invariant)


def _with_invariance(selection: Selection, invariant: bool) -> Selection:
    """``selection`` making batch-invariant plans by this device's records, when ``invariant``; a
    :class:`BatchInvariantError` when no backend it could plan with (the explicit one, else the chain's)
    has an option."""
    if not invariant:
        return selection
    index = invariance_for(selection.capabilities, selection.chain)
    considered = [b for b in selection.chain if selection.explicit in (None, b.name)]
    verdicts = [(b.name, index.options(b, explicit=b.name == selection.explicit)) for b in considered]
    if not any(options for _, (options, _) in verdicts):
        caps = selection.capabilities
        raise BatchInvariantError(f"any layer on {caps.device_name or caps.device_kind}",
                                  [Candidate(i, name, False, why) for i, (name, (_, why)) in enumerate(verdicts, 1)])
    return replace(selection, batch_invariant=True, invariance=index)


def _with_tuning(selection: Selection, tuning: bool | Mapping[str, Any], given: dict[str, Any] | None,
                 group: Any = None) -> Selection:
    """``selection`` with the device's measurements attached, and whether its layers measure shapes the
    tables leave open at load time (by default only with the device's own tables and no explicit choice);
    with a group, rank 0's tables and answer on every rank (one measurement, the same plans on every rank)."""
    caps = selection.capabilities
    selection = replace(selection, load_time_measure=measure_shape, load_time_measure_moe=measure_moe_shape)
    if tuning is False:
        return replace(selection, tune_at_load=wants_load_time_tuning(caps, by_default=False))

    def local() -> dict[str, Any]:
        return {"tables": [("given", given)] if given is not None else find_tables(caps),
                "tune": wants_load_time_tuning(caps, by_default=given is None and not selection.explicit)}

    if group is None:
        found = local()
        tables = found["tables"]
    else:
        from fp8select.distributed import measure_on_one_rank

        found = measure_on_one_rank(local, None if isinstance(group, str) else group)
        tables = [(f"{source} (rank 0)", table) for source, table in found["tables"]]
    selection = replace(selection, tune_at_load=bool(found["tune"]))
    if not tables:
        return selection
    return replace(selection, measurements=measurements_for(caps, selection.chain, [t for _, t in tables]),
                   tuning_sources=tuple(source for source, _ in tables), tables=tuple(table for _, table in tables))


def _check_arguments(capabilities: object, verify: object, plugins: object, group: object, on_mismatch: object,
                     tuning: object = True) -> None:
    """Typed errors for arguments of the wrong kind (before anything is detected or loaded)."""
    if capabilities is not None and not isinstance(capabilities, Capabilities):
        raise InvalidDtypeError(f"capabilities: expected a Capabilities snapshot or None, found {type(capabilities).__name__} "
                                "(use Capabilities.from_dict / from_json for JSON data)")
    if verify is not None and not isinstance(verify, bool):
        raise InvalidDtypeError(f"verify: expected True, False or None, found {verify!r}")
    if isinstance(plugins, (str, bytes)) or not (isinstance(plugins, bool) or plugins is None or isinstance(plugins, Iterable)):
        raise InvalidDtypeError(f"plugins: expected True, False or an iterable of plugin objects, found {plugins!r}")
    if isinstance(group, str) and group != "world":
        raise InvalidInputError(f"group: expected a torch.distributed process group, 'world' or None, found {group!r}")
    if not (isinstance(tuning, bool) or isinstance(tuning, Mapping)):
        raise InvalidDtypeError(f"tuning: expected True, False or a tuning table mapping, found {tuning!r}")
    if on_mismatch not in ("common", "raise"):
        raise InvalidInputError(f"on_mismatch: expected 'common' or 'raise', found {on_mismatch!r}")


def _names(value: object, parameter: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return parse_names(value)
    items = list(value) if isinstance(value, Iterable) else None  # once: a generator is consumed by reading it
    if items is None or not all(isinstance(v, str) for v in items):
        raise InvalidDtypeError(f"{parameter}: expected backend names (a comma-separated string or a list of strings), "
                                f"found {value!r}")
    return parse_names(items)


def _resolve_here(caps: Capabilities, backend: str | None, disable: Iterable[str] | str, order: Sequence[str] | str | None,
                  plugins: bool | Iterable[Any], verify: bool | None, *,
                  background: bool = False) -> tuple[Selection, Callable[[Selection], Future[Selection]] | None]:
    """This process's decision: choose, then verify (``verify``: as :func:`resolve` says); logs
    ``fp8select.resolved``.

    With ``background``, a chain on a CUDA (or CPU) device that is not all remembered is verified
    on a side thread instead (:mod:`fp8select.verify_chain`), and one with nothing left to verify has
    its vendors imported and warmed up there: the second value starts that on the finished selection
    and returns its future (None without ``background``)."""
    if backend is not None and not isinstance(backend, str):
        raise InvalidDtypeError(f"backend: expected a backend name or None, found {backend!r}")
    timeout_s = plugin_timeout(caps.env) if plugins is not False and plugins is not None else None
    disabled, disabled_source = _names(disable, "disable"), "argument"
    names_arg = _names(order, "order") if order is not None else None
    if names_arg == ():
        raise InvalidInputError(f"order: expected at least one backend name, found {order!r}")
    device = _verification_device(caps, verify)
    if device is not None:
        from fp8select.verify import run_functional_probes

        caps = run_functional_probes(caps)
    backends = builtin_backends()
    loaded = _load(plugins, backends, timeout_s)
    origins: dict[str, str] = {}
    for pb in loaded.backends:
        backends[pb.backend.name] = pb.backend
        origins[pb.backend.name] = f"plugin:{pb.plugin}"
    names = names_arg if names_arg is not None else tuple(place(DEFAULT_ORDER, loaded.backends))

    # Names as typed: case, surrounding blanks and aliases (deep_gemm) do not matter; "auto" or blank is no choice.
    explicit, explicit_source = explicit_choice(backend), "argument"
    if explicit is None and explicit_choice(caps.env.get(ENV_BACKEND)) is not None:
        explicit, explicit_source = explicit_choice(caps.env.get(ENV_BACKEND)), "environment"
    if not disabled and parse_names(caps.env.get(ENV_DISABLE, "")):
        disabled, disabled_source = parse_names(caps.env[ENV_DISABLE]), "environment"

    log = get_logger()
    try:
        selection = Selection.of(choose(caps, backends, names, explicit=explicit, explicit_source=explicit_source,
                                        disabled=disabled, disabled_source=disabled_source, origins=origins,
                                        failures=[(f.plugin, f.reason) for f in loaded.failures]))
        later = None
        if device is not None:
            known = {} if verify is True else remembered(caps)  # read once: the steady start-up path
            if background and device.type in BACKGROUND_DEVICES and not all_remembered(selection, known):
                later = functools.partial(verify_in_background, explicit=explicit, explicit_source=explicit_source,
                                          log=log, device=device)
            else:
                selection = verify_chain(selection, explicit, explicit_source, log, known=known, device=device)
        elif verify is None and caps.device_kind != "cpu":
            selection = replace(selection, notes=(*selection.notes, "not verified: the snapshot's device is not this "
                                                  "process's, or not usable here (verify=True runs the checks)"))
        if background and later is None:  # nothing left to verify: import (and warm up) the vendors meanwhile
            later = functools.partial(import_in_background, log=log, device=device)
    except (BackendRejectedError, NoBackendError) as exc:
        log.warning("fp8select.resolved", backend=None, source=explicit_source if explicit else "auto",
                    rejected={c.name: c.reason for c in exc.candidates if not c.accepted})
        raise
    log.info("fp8select.resolved", backend=selection.backend.name, source=selection.source,
             chain=[b.name for b in selection.chain],
             rejected={c.name: c.reason for c in selection.verdicts if not c.accepted},
             fingerprint=caps.fingerprint(), verified="in background" if later is not None else device is not None)
    return selection, later


SAME_DEVICE = ("device_kind", "device_name", "compute_capability", "gfx_arch")
"""The facts by which a snapshot describes this process's device (``verify=None`` verifies only then)."""


def _verification_device(caps: Capabilities, verify: bool | None) -> torch.device | None:
    """The device to verify on, None for no verification: ``verify=True`` needs the snapshot's device
    (a typed error when it is not usable here); ``None`` verifies a GPU when the snapshot describes
    this process's device (detected here, or a snapshot of this machine) and it is usable."""
    if verify is False or (verify is None and caps.device_kind == "cpu"):
        return None
    if verify is None:
        here = detect_capabilities()
        if any(getattr(here, f) != getattr(caps, f) for f in SAME_DEVICE):
            return None
    try:
        return usable_device(caps)
    except InvalidInputError:
        if verify:
            raise
        return None


def _load(plugins: bool | Iterable[Any], backends: Mapping[str, Backend], timeout_s: float | None = None) -> LoadedPlugins:
    if plugins is True:
        return load_plugins(taken=backends, timeout_s=timeout_s)
    if plugins is False or plugins is None:
        return LoadedPlugins()
    return load_plugins(plugins, entry_points=False, taken=backends, timeout_s=timeout_s)
