"""Named capability snapshots of real machines, for the matrix tests (data, no logic)."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from fp8select import Capabilities

ALL_SCALING = ("TensorWise", "RowWise", "BlockWise1x16", "BlockWise1x32", "BlockWise1x128", "BlockWise128x128")
F8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
TRITON = {"triton": "3.5.0"}
DG = {**TRITON, "deep_gemm": "2.1.1"}
SGL = {**TRITON, "sgl_kernel": "0.3.9"}
AITER = {**TRITON, "aiter": "0.1.5"}
AITER_ON = {"FP8SELECT_USE_AITER": "1"}
FI = {**TRITON, "flashinfer": "0.6.1"}
# Entry points found in each package's source at detection (``package_symbols``).
DG_SYMBOLS = {"deep_gemm": ("fp8_gemm_nt",)}
DG_V1 = {**TRITON, "deep_gemm": "1.0.0"}
DG_V1_SYMBOLS = {"deep_gemm": ("gemm_fp8_fp8_bf16_nt",)}
FI_SYMBOLS = {"flashinfer": ("gemm_fp8_nt_groupwise", "fp8_blockscale_gemm_sm90")}
AITER_SYMBOLS = {"aiter": ("gemm_a8w8_blockscale", "gemm_a8w8_blockscale_bpreshuffle", "fused_moe")}
NPU = {"torch_npu": "2.9.0"}
NPU_MOE_ON = {"FP8SELECT_USE_NPU_MOE": "1"}


def _new_api(torch: str) -> bool:
    """torch 2.10 introduced F.scaled_mm and ScalingType."""
    return Version(torch).release >= (2, 10)


def cuda(name: str, cc: tuple[int, int], torch: str, cuda_version: str, **kw: Any) -> Capabilities:
    new_api = _new_api(torch)
    return Capabilities(device_kind="cuda", device_name=name, compute_capability=cc, torch_version=torch,
                        cuda_version=cuda_version, has_scaled_mm=new_api, scaling_types=ALL_SCALING if new_api else (),
                        float8_dtypes=F8, triton_backends=("amd", "nvidia"), **kw)


def rocm(name: str, arch: str, hip: str = "6.4", **kw: Any) -> Capabilities:
    return Capabilities(device_kind="rocm", device_name=name, gfx_arch=arch, torch_version="2.9.1+rocm6.4", hip_version=hip,
                        float8_dtypes=F8, triton_backends=("amd", "nvidia"), **kw)


def xpu(torch: str, **kw: Any) -> Capabilities:
    new_api = _new_api(torch)
    return Capabilities(device_kind="xpu", device_name="Intel(R) Arc(TM) B580 Graphics", torch_version=torch + "+xpu",
                        xpu_version="20250301", has_scaled_mm=new_api, scaling_types=ALL_SCALING if new_api else (),
                        float8_dtypes=F8, **kw)


def npu(name: str | None, soc: int | None, **kw: Any) -> Capabilities:
    return Capabilities(device_kind="npu", device_name=name, npu_soc_version=soc, torch_version="2.9.0", float8_dtypes=F8, **kw)


H100 = dict(name="NVIDIA H100 80GB HBM3", cc=(9, 0))
H200 = dict(name="NVIDIA H200", cc=(9, 0))
B200 = dict(name="NVIDIA B200", cc=(10, 0))
RTX5090 = dict(name="NVIDIA GeForce RTX 5090", cc=(12, 0))
GB10 = dict(name="NVIDIA GB10", cc=(12, 1))
A100 = dict(name="NVIDIA A100-SXM4-80GB", cc=(8, 0))
L40S = dict(name="NVIDIA L40S", cc=(8, 9))

# name -> (snapshot, the backend resolve() must choose)
MATRIX: dict[str, tuple[Capabilities, str]] = {
    "cpu-only": (Capabilities(torch_version="2.13.0+cpu", float8_dtypes=F8, has_scaled_mm=True, scaling_types=ALL_SCALING), "reference"),
    "cpu-only-with-triton": (Capabilities(torch_version="2.13.0+cpu", float8_dtypes=F8, packages=TRITON), "reference"),
    "h100-torch2.9": (cuda(**H100, torch="2.9.1+cu128", cuda_version="12.8", packages=TRITON), "triton"),
    "h100-torch2.10": (cuda(**H100, torch="2.10.0+cu129", cuda_version="12.9", packages=TRITON), "cuda-scaled-mm"),
    "h100-torch2.10-cuda12.8": (cuda(**H100, torch="2.10.0+cu128", cuda_version="12.8", packages=TRITON), "triton"),
    # entry points not recorded (an older snapshot): accepted, checked when a layer is prepared
    "h100-deepgemm": (cuda(**H100, torch="2.10.0+cu129", cuda_version="12.9", packages=DG), "deepgemm"),
    "h100-deepgemm-v1": (cuda(**H100, torch="2.10.0+cu129", cuda_version="12.9", packages=DG_V1,
                              package_symbols=DG_V1_SYMBOLS), "deepgemm"),
    "h100-deepgemm-no-entry-point": (cuda(**H100, torch="2.10.0+cu129", cuda_version="12.9", packages=DG,
                                          package_symbols={"deep_gemm": ()}), "cuda-scaled-mm"),
    "h200-deepgemm": (cuda(**H200, torch="2.11.0+cu130", cuda_version="13.0", packages=DG, package_symbols=DG_SYMBOLS),
                      "deepgemm"),
    "h200-torch2.9": (cuda(**H200, torch="2.9.1+cu128", cuda_version="12.8", packages=TRITON), "triton"),
    "h200-torch2.11": (cuda(**H200, torch="2.11.0+cu130", cuda_version="13.0", packages=TRITON), "cuda-scaled-mm"),
    "h200-torch2.11-no-triton": (cuda(**H200, torch="2.11.0+cu130", cuda_version="13.0"), "cuda-scaled-mm"),
    "h200-torch2.9-no-triton": (cuda(**H200, torch="2.9.1+cu128", cuda_version="12.8"), "reference"),
    "h200-sglkernel": (cuda(**H200, torch="2.11.0+cu130", cuda_version="13.0", packages=SGL), "cutlass"),
    "h200-flashinfer": (cuda(**H200, torch="2.11.0+cu130", cuda_version="13.0", packages=FI, package_symbols=FI_SYMBOLS),
                        "flashinfer"),
    "h200-flashinfer-0.5": (cuda(**H200, torch="2.11.0+cu130", cuda_version="13.0", packages={**TRITON, "flashinfer": "0.5.3"}),
                            "cuda-scaled-mm"),
    "b200": (cuda(**B200, torch="2.11.0+cu130", cuda_version="13.0", packages=TRITON), "triton"),
    "b200-deepgemm": (cuda(**B200, torch="2.11.0+cu130", cuda_version="13.0", packages=DG, package_symbols=DG_SYMBOLS),
                      "deepgemm"),
    "b200-deepgemm-v1": (cuda(**B200, torch="2.11.0+cu130", cuda_version="13.0", packages=DG_V1,
                              package_symbols=DG_V1_SYMBOLS), "triton"),
    "b200-deepgemm-cuda12.8": (cuda(**B200, torch="2.8.0+cu128", cuda_version="12.8", packages=DG), "triton"),
    "b200-flashinfer": (cuda(**B200, torch="2.11.0+cu130", cuda_version="13.0", packages=FI, package_symbols=FI_SYMBOLS),
                        "flashinfer"),
    "b200-flashinfer-0.2.8": (cuda(**B200, torch="2.11.0+cu130", cuda_version="13.0", packages={**TRITON, "flashinfer": "0.2.8"}),
                              "triton"),
    "b200-sglkernel": (cuda(**B200, torch="2.11.0+cu130", cuda_version="13.0", packages=SGL), "cutlass"),
    "rtx5090": (cuda(**RTX5090, torch="2.11.0+cu130", cuda_version="13.0", packages=TRITON), "triton"),
    "rtx5090-deepgemm": (cuda(**RTX5090, torch="2.11.0+cu130", cuda_version="13.0", packages=DG), "triton"),
    "rtx5090-flashinfer": (cuda(**RTX5090, torch="2.11.0+cu130", cuda_version="13.0", packages=FI), "flashinfer"),
    "rtx5090-sglkernel": (cuda(**RTX5090, torch="2.11.0+cu130", cuda_version="13.0", packages=SGL), "triton"),
    "gb10": (cuda(**GB10, torch="2.11.0+cu130", cuda_version="13.0", packages=TRITON), "triton"),
    "gb10-deepgemm": (cuda(**GB10, torch="2.11.0+cu130", cuda_version="13.0", packages=DG, package_symbols=DG_SYMBOLS),
                      "triton"),
    "gb10-flashinfer": (cuda(**GB10, torch="2.11.0+cu130", cuda_version="13.0", packages=FI, package_symbols=FI_SYMBOLS),
                        "flashinfer"),
    "a100": (cuda(**A100, torch="2.11.0+cu130", cuda_version="13.0", packages=TRITON), "reference"),
    "a100-deepgemm": (cuda(**A100, torch="2.11.0+cu130", cuda_version="13.0", packages=DG), "reference"),
    "a100-flashinfer": (cuda(**A100, torch="2.11.0+cu130", cuda_version="13.0", packages=FI), "reference"),
    "l40s": (cuda(**L40S, torch="2.11.0+cu130", cuda_version="13.0", packages=TRITON), "triton"),
    "mi300x": (rocm("AMD Instinct MI300X", "gfx942", packages=TRITON), "triton"),
    "mi300x-aiter-no-flag": (rocm("AMD Instinct MI300X", "gfx942", packages=AITER), "triton"),
    "mi300x-aiter": (rocm("AMD Instinct MI300X", "gfx942", packages=AITER, env=AITER_ON, package_symbols=AITER_SYMBOLS),
                     "aiter"),
    "mi355x": (rocm("AMD Instinct MI355X", "gfx950", packages=TRITON), "triton"),
    "mi355x-aiter": (rocm("AMD Instinct MI355X", "gfx950", packages=AITER, env=AITER_ON), "aiter"),
    "mi355x-aiter-preshuffle": (rocm("AMD Instinct MI355X", "gfx950", hip="7.2.26015", packages=AITER,
                                     env={**AITER_ON, "FP8SELECT_AITER_PRESHUFFLE": "1"}, package_symbols=AITER_SYMBOLS),
                                "aiter"),
    "arc-b580-torch2.11": (xpu("2.11.0", packages={"triton": "3.5.0"}, triton_backends=("intel",)), "triton"),
    "arc-b580-torch2.13": (xpu("2.13.0", packages={"triton": "3.6.0"}, triton_backends=("intel",)), "xpu-scaled-mm"),
    "arc-b580-torch2.11-no-triton": (xpu("2.11.0"), "reference"),
    "arc-b580-torch2.9": (xpu("2.9.0", packages={"triton": "3.5.0"}, triton_backends=("intel",)), "triton"),
    "ascend-950": (npu("Ascend950PR", None, packages=NPU), "npu"),
    "ascend-950-by-soc": (npu(None, 260, packages=NPU), "npu"),
    "ascend-950-npu-moe": (npu("Ascend950PR", None, packages=NPU, env=NPU_MOE_ON), "npu"),
    "ascend-910b": (npu("Ascend910B3", 223, packages=NPU), "reference"),
    "ascend-950-no-torch-npu": (npu("Ascend950PR", None), "reference"),
}
