"""``npu``: Ascend ``torch_npu.npu_quant_matmul`` with block scales on A5 (arch35)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fp8select.backends.base import BLOCK_128x128, Backend
from fp8select.capabilities import Capabilities
from fp8select.probes import DeviceKind, Package, Probe
from fp8select.verdict import Verdict

ARCH35_NAMES = ("Ascend910_95", "Ascend950")
ARCH35_MIN_SOC = 260


@dataclass(frozen=True)
class AscendArch35(Probe):
    """The Ascend device is an A5 (arch35): by device name, or SoC version >= 260."""

    @property
    def requirement(self) -> str:
        return f"Ascend A5/arch35 (device name {' or '.join(ARCH35_NAMES)}, or SoC version >= {ARCH35_MIN_SOC})"

    def __call__(self, caps: Capabilities) -> Verdict:
        name = caps.device_name or ""
        if any(tag in name for tag in ARCH35_NAMES):
            return self._verdict(True, name)
        if caps.npu_soc_version is not None and caps.npu_soc_version >= ARCH35_MIN_SOC:
            return self._verdict(True, f"SoC version {caps.npu_soc_version}")
        found = name or "an unknown device name (import torch_npu before resolving)"
        if caps.npu_soc_version is not None:
            found += f", SoC version {caps.npu_soc_version}"
        return self._verdict(False, found)


class NpuBackend(Backend):
    name = "npu"
    summary = "torch_npu npu_dynamic_block_quant + npu_quant_matmul on Ascend A5"
    requires: ClassVar[tuple[Probe, ...]] = (DeviceKind(("npu",)), Package("torch_npu"), AscendArch35())
    block_sizes = (BLOCK_128x128,)
    implemented = False
    layout = "npu"
