"""The specialization key's parts, and that an interpreted kernel always goes through Triton."""

from __future__ import annotations

import pytest
import torch

triton_launch = pytest.importorskip("fp8select.kernels.triton_launch")


@pytest.mark.parametrize(("value", "one", "sixteen", "wide"), [
    (1, True, False, False), (0, False, True, False), (16, False, True, False), (48, False, True, False),
    (17, False, False, False), (2**31, False, True, True), (2**31 + 1, False, False, True)])
def test_int_class_tells_apart_what_triton_specializes(value: int, one: bool, sixteen: bool, wide: bool) -> None:
    klass = triton_launch.int_class(value)
    assert (bool(klass & 1), bool(klass & 2), bool(klass & 4)) == (one, sixteen, wide)


def test_tensor_class_is_dtype_and_alignment() -> None:
    flat = torch.zeros(64, dtype=torch.bfloat16)
    assert triton_launch.tensor_class(None) is None
    assert triton_launch.tensor_class(flat) == (torch.bfloat16, True)
    assert triton_launch.tensor_class(flat[1:]) == (torch.bfloat16, False)  # 2 bytes past an aligned base


def test_only_a_compiled_kernel_launches_directly() -> None:
    """Triton's interpreter (and anything but a JIT function) always goes through ``kernel[grid]``."""
    launched: list[tuple[object, ...]] = []

    class InterpretedFunction:  # the interpreter's kernel type, by name
        def __getitem__(self, grid: object) -> object:
            return lambda *args, **kwargs: launched.append((grid, args, tuple(sorted(kwargs))))

    bound = triton_launch.BoundKernel(InterpretedFunction(), {"BLOCK": 16}, {"num_warps": 4})
    assert not bound._direct
    bound((2, 1, 1), ("x",), key=("anything",))
    bound((2, 1, 1), ("x",), key=("anything",))
    assert launched == [((2, 1, 1), ("x",), ("BLOCK", "num_warps"))] * 2
