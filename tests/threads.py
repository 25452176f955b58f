"""Calls made from two threads at once, for the tests of what a first call does concurrently."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def slowed(method: Callable[..., T], seconds: float = 0.05) -> Callable[..., T]:
    """``method``, sleeping first: the window in which another thread calls."""
    def slow(*args: Any, **kwargs: Any) -> T:
        time.sleep(seconds)
        return method(*args, **kwargs)
    return slow


def two_threads(call: Callable[[], T], stagger_s: float = 0.02) -> tuple[list[T], list[BaseException]]:
    """``call()`` in two threads, the second started ``stagger_s`` after the first: their results and errors."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(call())
        except BaseException as exc:  # noqa: BLE001 - the caller asserts there were none
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    threads[0].start()
    time.sleep(stagger_s)
    threads[1].start()
    for thread in threads:
        thread.join()
    return results, errors
