"""Log records engines can use: one line per event on the stdlib logger, no repeated time or level."""

from __future__ import annotations

import logging

import pytest
import structlog
import torch

from fp8select import Capabilities, resolve

CPU = Capabilities(torch_version="2.13.0+cpu", float8_dtypes=("float8_e4m3fn",))


def test_stdlib_records_carry_the_event_and_its_keys_only(caplog: pytest.LogCaptureFixture) -> None:
    structlog.reset_defaults()  # as in a host that never configured structlog
    with caplog.at_level(logging.INFO, logger="fp8select"):
        resolve(CPU, plugins=False).prepare(torch.randn(256, 384).to(torch.float8_e4m3fn), torch.rand(2, 3))
    messages = [r.getMessage() for r in caplog.records if r.name == "fp8select"]
    assert [m.split()[0] for m in messages] == ["fp8select.resolved", "fp8select.layer_prepared"]
    prepared = messages[1]
    assert "n=256" in prepared and "k=384" in prepared and "plan='any M: reference'" in prepared
    for message in messages:
        assert "info" not in message.lower().split() and "[info" not in message.lower()
        assert message.startswith("fp8select.")  # no timestamp or level before the event
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "fp8select")


def test_nothing_is_rendered_below_the_logger_level(caplog: pytest.LogCaptureFixture) -> None:
    structlog.reset_defaults()
    with caplog.at_level(logging.WARNING, logger="fp8select"):
        resolve(CPU, plugins=False)
    assert not [r for r in caplog.records if r.name == "fp8select"]
