"""Verifying a selection's chain on the device: before ``resolve()`` returns, or as a future.

:func:`verify_chain` runs each backend of the chain through :func:`fp8select.verify.verify_backend`
(or takes a pass remembered for these versions) and turns failures into rejected verdicts.
On a machine whose caches are empty (fp8select's, Triton's, DeepGEMM's and FlashInfer's),
verifying means importing the vendors and compiling each backend's kernels once: 16 s without
the vendors and 46 s with them on the H200. An engine resolves at start-up and then loads its
checkpoint, which takes longer than that, so ``resolve(..., background=True)`` returns a
``concurrent.futures.Future`` of the verified selection at once (:func:`verify_in_background`):
the engine loads its weights and then takes ``future.result()``. A selection is always a
settled value; only the future waits.
The thread runs on the caller's device (its index taken where ``resolve()`` was called, not
the thread's default device 0) and on its own CUDA stream, so the caller's streams never
wait for it. A ``fork`` waits for it first (a child process has no copy of the thread).
Capture CUDA graphs after taking the result: while the thread runs, its allocations would break
a capture in progress.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import replace
from typing import Any, TypeVar

import torch

from fp8select.capabilities import Capabilities
from fp8select.decision import Decision
from fp8select.errors import BackendRejectedError, InvalidInputError, NoBackendError
from fp8select.guard import call_foreign
from fp8select.verdict import Verdict
from fp8select.verify import device_for, remember, remembered, verification_key, verify_backend

D = TypeVar("D", bound=Decision)
"""A decision or a subclass of it (a Selection): returned as the type it was given."""

__all__ = ["BACKGROUND_DEVICES", "all_remembered", "import_in_background", "load_vendors", "usable_device",
           "verify_chain", "verify_in_background"]

BACKGROUND_DEVICES = ("cuda", "cpu")
"""Device types verified on a side thread (CUDA: on the caller's device and a stream of its own).
Others (XPU, NPU) are verified before ``resolve(..., background=True)`` returns its (completed)
future: their per-thread device and stream rules are not tested here."""


def usable_device(caps: Capabilities) -> torch.device:
    """The device a chain for ``caps`` is verified on, with its index (the caller's current CUDA
    device); a clear error when this process cannot use the snapshot's device."""
    device = device_for(caps)
    try:
        torch.empty(1, device=device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    except Exception as exc:  # noqa: BLE001 - torch raises several kinds for a missing device
        raise InvalidInputError(f"verify: expected the snapshot's device {device} to be usable in this process, "
                                f"found {type(exc).__name__}: {exc}; pass verify=False to replay another machine's "
                                "snapshot") from None
    return device


def _keys(selection: D) -> dict[str, str | None]:
    """Backend name -> its verification key (None for a plugin backend: its versions are unknown)."""
    origin = {c.name: c.origin for c in selection.verdicts}
    return {b.name: verification_key(b, selection.capabilities) if origin.get(b.name) == "builtin" else None
            for b in selection.chain}


def all_remembered(selection: D, known: Mapping[str, str]) -> bool:
    """Whether every backend of the chain passed before with these versions (``known``: the remembered
    passes, :func:`fp8select.verify.remembered`), so that verifying is instant."""
    return all(key is not None and key in known for key in _keys(selection).values())


def verify_chain(selection: D, explicit: str | None, explicit_source: str, log: Any, *,
                 known: Mapping[str, str] | None = None, device: torch.device | None = None) -> D:
    """``selection`` with every backend of its chain verified; failures become rejected verdicts.

    The whole chain is verified, not only the choice: the layer calls a fallback for the
    calls the primary declines (an M cuBLAS rejects, say), so a broken fallback would give
    wrong numbers just as surely. ``known``: the remembered passes (None: read them; empty: run
    every check).
    """
    caps = selection.capabilities
    device = device if device is not None else usable_device(caps)
    candidates = list(selection.verdicts)
    index = {c.name: i for i, c in enumerate(candidates)}
    known = remembered(caps) if known is None else known
    keys = _keys(selection)
    ran = _run_each([b for b in selection.chain if keys[b.name] is None or keys[b.name] not in known], selection, device)
    newly: dict[str, str] = {}
    passed = []
    notes = []
    for backend in selection.chain:
        key = keys[backend.name]
        if key is not None and backend.name not in ran:
            verdict = Verdict.accept(f"verified before with these versions ({known[key]})")
            notes.append(f"verification of {backend.name}: {verdict.reason}")
        else:
            verdict, seconds = ran[backend.name]
            if verdict.ok and key is not None and not verdict.reason.startswith("not verified"):
                newly[key] = verdict.reason
            notes.append(f"verification of {backend.name}: {verdict.reason} ({seconds:.1f} s)")
        if verdict.ok:
            passed.append(backend)
            continue
        log.warning("fp8select.verify_failed", backend=backend.name, reason=verdict.reason,
                    fingerprint=caps.fingerprint())
        i = index[backend.name]
        candidates[i] = replace(candidates[i], accepted=False, reason=verdict.reason)
    if newly:
        remember(caps, newly)
    if explicit is not None and selection.backend not in passed:
        raise BackendRejectedError(explicit, explicit_source, candidates)
    if not passed:
        raise NoBackendError(f"this machine ({caps.device_kind}, torch {caps.torch_version}): "
                             "every accepted backend failed verification", candidates)
    return replace(selection, backend=passed[0], verdicts=tuple(candidates), chain=tuple(passed),
                   notes=(*selection.notes, *notes))


def _run_each(backends: list[Any], selection: D, device: torch.device) -> dict[str, tuple[Verdict, float]]:
    """Each backend's verdict and seconds, one after the other.

    Not at once on several threads: vendor packages import each other (sgl-kernel and FlashInfer)
    and have import cycles, and Python's import locks then fail one thread's import with a
    ``_DeadlockError`` (seen on the H200: FlashInfer rejected). An import that fails that way,
    because the host imported the same package on another thread at that moment, is retried once.
    """
    out = {}
    for backend in backends:
        start = time.perf_counter()
        verdict = verify_backend(backend, selection.capabilities, device)
        if not verdict.ok and "_DeadlockError" in verdict.reason:
            verdict = verify_backend(backend, selection.capabilities, device)
        out[backend.name] = (verdict, time.perf_counter() - start)
    return out


def verify_in_background(selection: D, explicit: str | None, explicit_source: str, log: Any,
                         device: torch.device) -> Future[D]:
    """A future of ``selection`` with its chain verified (:func:`verify_chain`) on a side thread; logs
    ``fp8select.verified`` when that finishes. The future raises what the verification raised
    (:class:`~fp8select.errors.NoBackendError` when every backend failed it, ``BackendRejectedError``
    when an explicit choice did)."""
    def work() -> D:
        start = time.perf_counter()
        try:
            verified = verify_chain(selection, explicit, explicit_source, log, device=device)
        except (NoBackendError, BackendRejectedError):
            log.warning("fp8select.verified", backend=None, seconds=round(time.perf_counter() - start, 3))
            raise
        log.info("fp8select.verified", backend=verified.backend.name, chain=[b.name for b in verified.chain],
                 rejected=[b.name for b in selection.chain if b not in verified.chain],
                 seconds=round(time.perf_counter() - start, 3))
        return verified

    return _in_background(work, device, _VERIFY_THREAD)


def import_in_background(selection: D, log: Any, device: torch.device | None = None) -> Future[D]:
    """A future of ``selection`` once the vendor packages of its chain are imported, on a side thread:
    what ``resolve(..., background=True)`` returns when there is nothing left to verify (every pass
    remembered). Importing a vendor is most of a warm start's ``prepare`` (FlashInfer's registers its
    custom ops: about 1 s on the H200 host); an engine that loads its weights before taking
    ``future.result()`` pays it meanwhile. With ``device`` (this process's, where the chain would be
    verified) each chain backend then warms up there (:meth:`~fp8select.backends.base.Backend.warm_up`:
    DeepGEMM starts its JIT compiler). A package that fails to import, or a warm-up that fails, is
    logged (``fp8select.import_failed``, ``fp8select.warm_up_failed``) and left to ``prepare``, which
    says why; the future never raises."""
    modules, warm = _vendor_setup(selection.chain, device)
    if not modules and not warm:
        done: Future[D] = Future()
        done.set_result(selection)
        return done

    def work() -> D:
        load_vendors(selection.chain, selection.capabilities, device, log)
        return selection

    return _in_background(work, device if warm and device is not None else torch.device("cpu"), _IMPORT_THREAD)


def load_vendors(backends: Any, caps: Capabilities, device: torch.device | None, log: Any) -> None:
    """The once-per-process setup of ``backends``' vendors, here and now: their packages not yet imported,
    then (with ``device``) each backend's :meth:`~fp8select.backends.base.Backend.warm_up` there. A package
    that fails to import, or a warm-up that fails, is logged (``fp8select.import_failed``,
    ``fp8select.warm_up_failed``) and left to ``prepare``, which says why; nothing raises."""
    import importlib

    modules, warm = _vendor_setup(backends, device)
    for module in modules:
        outcome = call_foreign(importlib.import_module, module)  # a vendor's import may raise anything
        if outcome.error is not None:
            log.warning("fp8select.import_failed", module=module, error=outcome.error)
    for backend in warm:
        warmed = call_foreign(backend.warm_up, caps, device)
        if warmed.error is not None:
            log.warning("fp8select.warm_up_failed", backend=backend.name, error=warmed.error)


def _vendor_setup(backends: Any, device: torch.device | None) -> tuple[list[str], list[Any]]:
    """The packages of ``backends`` not yet imported, and (with ``device``) the backends with a warm-up (MoE
    backends have none)."""
    import sys

    from fp8select.backends.base import Backend

    modules = list(dict.fromkeys(m for b in backends for m in getattr(b, "packages", ()) if m not in sys.modules))
    return modules, [b for b in backends
                     if device is not None and getattr(type(b), "warm_up", Backend.warm_up) is not Backend.warm_up]


def _in_background(work: Callable[[], D], device: torch.device, name: str) -> Future[D]:
    """A future of ``work()``, run on a side thread named ``name`` (:func:`_run`), which a fork waits for."""
    future: Future[D] = Future()
    future.set_running_or_notify_cancel()
    _install_fork_hook()
    _RUNNING.add(future)
    # Not a daemon: an interpreter that exits meanwhile lets the kernels finish first.
    threading.Thread(target=_run, args=(future, work, device), name=name).start()
    return future


def _run(future: Future[D], work: Callable[[], D], device: torch.device) -> None:
    """``work()`` into ``future``, on ``device`` and a CUDA stream of its own (the caller's streams never wait)."""
    try:
        if device.type == "cuda":
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
                result = work()
                torch.cuda.current_stream().synchronize()
        else:
            result = work()
    except BaseException as exc:  # noqa: BLE001 - handed to whoever holds the future
        future.set_exception(exc)
    else:
        future.set_result(result)
    finally:
        _RUNNING.discard(future)


# Running verifications and imports, for the fork hook: process state by nature (threads are), weakly held.
_RUNNING: weakref.WeakSet[Future[Any]] = weakref.WeakSet()
_VERIFY_THREAD, _IMPORT_THREAD = "fp8select-verify", "fp8select-imports"
_FORK_HOOK = threading.Lock()
_fork_hook_installed = False


def _wait_for_all() -> None:
    if threading.current_thread().name in (_VERIFY_THREAD, _IMPORT_THREAD):
        return  # a fork from the side thread itself
    for future in list(_RUNNING):
        wait([future])


def _install_fork_hook() -> None:
    """Before a fork, wait for every running verification (installed at the first one, not on import)."""
    global _fork_hook_installed
    with _FORK_HOOK:
        if not _fork_hook_installed and hasattr(os, "register_at_fork"):
            os.register_at_fork(before=_wait_for_all)
            _fork_hook_installed = True
