"""fp8select's logger: structlog over the stdlib logger ``fp8select``.

The library never configures logging; the host's configuration (stdlib or structlog)
decides where events go, and with none nothing below WARNING is printed.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog


def get_logger() -> Any:
    return structlog.wrap_logger(logging.getLogger("fp8select"))
