"""fp8select's logger: structlog over the stdlib logger ``fp8select``.

The library never configures logging. Where the host configured structlog
(``structlog.configure``), its processors apply. Otherwise each event becomes one stdlib
record on the ``fp8select`` logger whose message is ``event key=value ...`` only: the
host's stdlib handlers add the time and level, so they are not repeated in the message. With
no logging configured at all, nothing below WARNING is printed.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog


def _render(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
    """``fp8select.resolved backend='triton' chain=[...]``: the event, then its keys in order."""
    event = event_dict.pop("event", "")
    return " ".join([str(event), *(f"{key}={value!r}" for key, value in sorted(event_dict.items()))])


_PROCESSORS: tuple[Any, ...] = (
    structlog.stdlib.filter_by_level,  # before any rendering: a disabled level costs next to nothing
    structlog.processors.format_exc_info,
    _render,
)


def get_logger() -> Any:
    stdlib = logging.getLogger("fp8select")
    if structlog.is_configured():
        return structlog.wrap_logger(stdlib)
    return structlog.wrap_logger(stdlib, processors=list(_PROCESSORS), wrapper_class=structlog.stdlib.BoundLogger)
