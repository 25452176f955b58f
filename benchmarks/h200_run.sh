#!/usr/bin/env bash
# H200 measurement runs over two GPUs, with the vendors installed (`source .vendors/setup.sh` first).
#
#   bash benchmarks/h200_run.sh tune OUTDIR           # GPU 0: JIT warm-up, tune (DeepSeek-V3, every backend)
#                                                     # GPU 1: GPU tests, start-up/prepare/NaN checks, numerics
#   bash benchmarks/h200_run.sh bench OUTDIR          # both GPUs: regret of the automatic choice, with the vendors
#                                                     # (DeepSeek-V3 on GPU 0, other models' shapes on GPU 1)
#   bash benchmarks/h200_run.sh no-vendors OUTDIR     # the same without the vendors on the path
#   bash benchmarks/h200_run.sh final-a OUTDIR        # GPU 0: regret with the vendors (DeepSeek-V3, other
#                                                     # models' shapes by the model and measured at load time)
#                                                     # GPU 1: GPU tests, torch.compile, the transformers client
#   bash benchmarks/h200_run.sh final-b OUTDIR        # regret without the vendors, NCCL plans, start-up
#   bash benchmarks/h200_run.sh startup-limits OUTDIR # GPU 0: start-up on empty caches with the vendors, then the
#                                                     # kernels' limits (benchmarks/limits.py); GPU 1: start-up
#                                                     # without them, the GPU tests of the tree (run 10)
#   bash benchmarks/h200_run.sh retune OUTDIR         # Triton rows of DeepSeek-V3 re-tuned (half the shapes per
#                                                     # GPU), the quantizer's program shapes, start-up (run 11)
#   bash benchmarks/h200_run.sh final-limits OUTDIR   # GPU 0: the kernels' limits with the re-tuned table;
#                                                     # GPU 1: start-up, regret with the vendors, GPU tests (run 12)
#   bash benchmarks/h200_run.sh pdl OUTDIR            # GPU 0: decode limits without and with programmatic
#                                                     # dependent launch; GPU 1: Triton rows re-tuned with it,
#                                                     # kernel / compile / GPU tests (run 13)
#   bash benchmarks/h200_run.sh final-pdl OUTDIR      # GPU 0: the kernels' limits with the final table; GPU 1:
#                                                     # regret at decode with the vendors, every GPU test (run 14)
#   bash benchmarks/h200_run.sh final-decode OUTDIR   # GPU 0: decode limits of the final tree; GPU 1: kernel
#                                                     # GPU tests (run 15)
#   bash benchmarks/h200_run.sh anatomy OUTDIR        # GPU 0: decode anatomy (read ceiling, PDL, weight
#                                                     # prefetch); GPU 1: kernel GPU tests (run 16)
#   bash benchmarks/h200_run.sh pdl-rule OUTDIR       # GPU 0: the M <= 16 Triton rows of weights over 2^26
#                                                     # elements re-tuned with PDL for the in-kernel quantizing
#                                                     # GEMMs, merged where faster, decode limits with them;
#                                                     # GPU 1: numerics sweep, every GPU test (run 17)
#   bash benchmarks/h200_run.sh probe OUTDIR          # GPU 0: persistent tile GEMM probe at prefill; GPU 1:
#                                                     # the kernels' limits with the shipped table (run 19)
#   bash benchmarks/h200_run.sh persistent OUTDIR     # GPU 0: prefill sweep with persistent launches, its
#                                                     # winners merged into the table, then the kernels' limits
#                                                     # (decode, quantization, prefill); GPU 1: GPU tests (run 20)
#   bash benchmarks/h200_run.sh final-check2 OUTDIR   # GPU 0: numerics sweep of the final tree; GPU 1: the
#                                                     # kernels' limits again, a second sample (run 21)
#   bash benchmarks/h200_run.sh order OUTDIR          # GPU 0: JIT warm-up, timing order (rounds against
#                                                     # interleaving); GPU 1: every GPU test, persistent probe (run 23)
#   bash benchmarks/h200_run.sh fair OUTDIR           # GPU 0: the DeepSeek-V3 rows re-measured with interleaved timing
#                                                     # (Triton's configurations kept), regret with that table; GPU 1:
#                                                     # every GPU test, the kernels' limits (run 24)
#   bash benchmarks/h200_run.sh final-fair OUTDIR     # GPU 0: the kernels' limits, a second interleaved sample;
#                                                     # GPU 1: every GPU test, regret with the vendors on other
#                                                     # models' shapes, by the model and measured at load (run 26)
#   bash benchmarks/h200_run.sh grid-fair OUTDIR      # the table's five other shapes re-timed interleaved (GPU 0);
#                                                     # then regret on other models' shapes by the model with that
#                                                     # table, with (GPU 0) and without (GPU 1) the vendors (run 27)
#   bash benchmarks/h200_run.sh wgmma OUTDIR          # GPU 0: the DeepSeek-V3 rows of M 256-8192 re-tuned with the
#                                                     # wgmma path, then the kernels' prefill limits with that table;
#                                                     # GPU 1: every GPU test, the scales' layout probe (run 32)
#   bash benchmarks/h200_run.sh wgmma-regret OUTDIR   # regret on DeepSeek-V3 with that table: with the vendors
#                                                     # (GPU 0), without (GPU 1) (run 33)
#   bash benchmarks/h200_run.sh numerics OUTDIR       # GPU 0: numerics sweep of the tree; GPU 1: JIT warm-up, each
#                                                     # vendor's error over 40 seeded activations (FlashInfer's
#                                                     # quantizer against ours), regret with the vendors on other
#                                                     # models' shapes with the shipped table (run 34)
#   bash benchmarks/h200_run.sh fit-check OUTDIR      # GPU 0: regret on other models' shapes with and without the
#                                                     # vendors (borrowed Triton splits fitted), every GPU test;
#                                                     # GPU 1: the numerics sweep's last nine shapes (run 36)
#
# Every step is time-boxed and writes into $WORK (default /tmp/h200work, kept between the calls of
# one machine); each stage ends by packing $WORK into OUTDIR/run.tgz (one file back). The shapes
# of other models are never tuned: they check the plan's model on shapes no table contains.
set -u
stage=${1:?stage}
out=${2:?outdir}
work=${WORK:-/tmp/h200work}
mkdir -p "$work"
TABLE=${TABLE:-$work/tuning.json}
[ -e "$TABLE" ] || TABLE=fp8select/data/tuning-nvidia-h200.json
export PYTHONUNBUFFERED=1 FP8SELECT_CACHE_DIR=/tmp/fp8cache PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OTHER="6144,4096,4096,4096,28672,4096,4096,14336,4608,3584,3584,18944"  # Llama-3-8B, Qwen2.5-7B projections
GRID_A="1024,4096,12288,4096,5120,5120"  # measured besides DeepSeek-V3 so the model has near neighbours
GRID_B="8192,8192,13824,5120"
py=python3
log() { echo "[$(date +%T)] $*" | tee -a "$work/run.log"; }
NO_VENDORS=$PWD:/tmp/projdeps  # PYTHONPATH of the lanes without the vendors: the repository and its own deps
install_project_deps() { $py -m pip install -q --no-index --no-deps --target /tmp/projdeps .vendors/project-deps/*.whl; }

lane0_tune() {
  log "gpu0: jit warm-up"
  CUDA_VISIBLE_DEVICES=0 timeout 120 $py benchmarks/jit_warm.py --shapes "deepseek-v3,$OTHER" \
      --backends deepgemm,flashinfer --procs 14 --out "$work/jit_warm.json" >>"$work/lane0.log" 2>&1
  log "gpu0: tune"
  CUDA_VISIBLE_DEVICES=0 timeout 400 $py -m fp8select tune --shapes deepseek-v3 --force --max-configs 2 --replays 20 \
      --budget-s 370 --out "$work/tuning.json" >>"$work/lane0.log" 2>&1
  log "gpu0: done"
}

bench() {
  log "bench with the vendors on both GPUs"
  CUDA_VISIBLE_DEVICES=0 FP8SELECT_TUNING_TABLE="$TABLE" timeout 270 $py benchmarks/regret.py \
      --shapes deepseek-v3 --label vendors-deepseek --budget-s 240 --out "$work/regret_vendors_deepseek.json" \
      >>"$work/lane0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 FP8SELECT_TUNING_TABLE="$TABLE" timeout 270 $py benchmarks/regret.py \
      --shapes "$OTHER" --label vendors-other --budget-s 240 --out "$work/regret_vendors_other.json" \
      >>"$work/lane1.log" 2>&1 &
  wait
}

grid() {
  log "grid: jit warm-up (gpu0), kernel tests and checks (gpu1)"
  CUDA_VISIBLE_DEVICES=0 timeout 120 $py benchmarks/jit_warm.py --shapes "$GRID_A,$GRID_B" \
      --backends deepgemm,flashinfer --procs 14 --out "$work/jit_warm_grid.json" >>"$work/lane0.log" 2>&1 &
  (CUDA_VISIBLE_DEVICES=1 timeout 60 $py -m pytest -q -m gpu tests/test_kernels_gpu.py -p no:cacheprovider \
      >"$work/kernel_gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 110 $py benchmarks/h200_checks.py --label vendors --out "$work/checks_vendors.json" \
      >>"$work/lane1.log" 2>&1) &
  wait
  log "grid: tune on both GPUs"
  CUDA_VISIBLE_DEVICES=0 timeout 270 $py -m fp8select tune --shapes "$GRID_A" --max-configs 4 --replays 20 \
      --budget-s 250 --out "$work/tuning_grid_a.json" >>"$work/lane0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 270 $py -m fp8select tune --shapes "$GRID_B" --max-configs 4 --replays 20 \
      --budget-s 250 --out "$work/tuning_grid_b.json" >>"$work/lane1.log" 2>&1 &
  wait
}

lane1_checks() {
  log "gpu1: gpu tests"
  CUDA_VISIBLE_DEVICES=1 timeout 200 $py -m pytest -q -m gpu tests/test_gpu.py tests/test_gpu_vendors.py \
      -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
  log "gpu1: kernel gpu tests"
  CUDA_VISIBLE_DEVICES=1 timeout 90 $py -m pytest -q -m gpu tests/test_kernels_gpu.py -p no:cacheprovider \
      >"$work/kernel_gpu_tests.log" 2>&1
  log "gpu1: checks"
  CUDA_VISIBLE_DEVICES=1 timeout 120 $py benchmarks/h200_checks.py --label vendors --out "$work/checks_vendors.json" \
      >>"$work/lane1.log" 2>&1
  log "gpu1: numerics"
  CUDA_VISIBLE_DEVICES=1 timeout 130 $py benchmarks/gpu_check.py --out "$work/gpu_check" --skip-tests --skip-facts \
      --budget-s 100 >>"$work/lane1.log" 2>&1
  log "gpu1: done"
}

no_vendors() {
  # structlog only: the vendors' site directory is left off the path
  install_project_deps
  local table=$TABLE
  log "no vendors: regret on both GPUs"
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NO_VENDORS FP8SELECT_TUNING_TABLE=$table timeout 240 $py benchmarks/regret.py \
      --shapes deepseek-v3 --label novendors-deepseek --budget-s 200 --out "$work/regret_novendors_deepseek.json" \
      >>"$work/lane0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NO_VENDORS FP8SELECT_TUNING_TABLE=$table timeout 240 $py benchmarks/regret.py \
      --shapes "$OTHER" --label novendors-other --budget-s 200 --out "$work/regret_novendors_other.json" \
      >>"$work/lane1.log" 2>&1 &
  wait
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NO_VENDORS timeout 100 $py benchmarks/h200_checks.py --label no-vendors --skip nonfinite,prepare \
      --out "$work/checks_novendors.json" >>"$work/lane0.log" 2>&1
}

final_a() {
  (log "a0: jit warm-up, other models"
   CUDA_VISIBLE_DEVICES=0 timeout 100 $py benchmarks/jit_warm.py --shapes "$OTHER" --backends deepgemm,flashinfer \
       --procs 12 --out "$work/jit_warm_other.json" >>"$work/lane0.log" 2>&1
   log "a0: regret, vendors, deepseek-v3"
   CUDA_VISIBLE_DEVICES=0 timeout 200 $py benchmarks/regret.py --shapes deepseek-v3 --label vendors-deepseek \
       --budget-s 150 --out "$work/regret_vendors_deepseek.json" >>"$work/lane0.log" 2>&1
   log "a0: regret, vendors, other models (model)"
   CUDA_VISIBLE_DEVICES=0 timeout 140 $py benchmarks/regret.py --shapes "$OTHER" --label vendors-other-model \
       --budget-s 100 --out "$work/regret_vendors_other_model.json" >>"$work/lane0.log" 2>&1
   log "a0: regret, vendors, other models (measured at load)"
   CUDA_VISIBLE_DEVICES=0 FP8SELECT_TUNE=load FP8SELECT_CACHE_DIR=/tmp/fp8cache-load timeout 140 $py benchmarks/regret.py \
       --shapes "$OTHER" --label vendors-other-load --budget-s 100 --out "$work/regret_vendors_other_load.json" \
       >>"$work/lane0.log" 2>&1
   log "a0: done") &
  (log "a1: gpu tests"
   CUDA_VISIBLE_DEVICES=1 timeout 200 $py -m pytest -q -n 4 -m gpu tests/test_gpu.py tests/test_gpu_vendors.py \
       -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 60 $py -m pytest -q -m gpu tests/test_kernels_gpu.py -p no:cacheprovider \
       >"$work/kernel_gpu_tests.log" 2>&1
   log "a1: torch.compile"
   CUDA_VISIBLE_DEVICES=1 timeout 150 $py -m pytest -q -n 6 -m gpu tests/test_compile_gpu.py -p no:cacheprovider \
       >"$work/compile_gpu_tests.log" 2>&1
   log "a1: transformers"
   CUDA_VISIBLE_DEVICES=1 timeout 60 $py -m pytest -q -m gpu tests/test_transformers_gpu.py -p no:cacheprovider \
       >"$work/transformers_gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 80 $py examples/transformers_fp8.py --out "$work/transformers_vendors.json" \
       >>"$work/lane1.log" 2>&1
   log "a1: done") &
  wait
}

final_b() {
  install_project_deps
  (log "b0: regret, no vendors, deepseek-v3"
   CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NO_VENDORS timeout 120 $py benchmarks/regret.py --shapes deepseek-v3 \
       --label novendors-deepseek --budget-s 80 --out "$work/regret_novendors_deepseek.json" >>"$work/lane0.log" 2>&1) &
  (log "b1: regret, no vendors, other models"
   CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NO_VENDORS timeout 80 $py benchmarks/regret.py --shapes "$OTHER" \
       --label novendors-other-model --budget-s 50 --out "$work/regret_novendors_other_model.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NO_VENDORS FP8SELECT_TUNE=load FP8SELECT_CACHE_DIR=/tmp/fp8cache-load-nv timeout 80 \
       $py benchmarks/regret.py --shapes "$OTHER" --label novendors-other-load --budget-s 50 \
       --out "$work/regret_novendors_other_load.json" >>"$work/lane1.log" 2>&1) &
  wait
  log "b: nccl plans"
  FP8SELECT_TUNE=load FP8SELECT_CACHE_DIR=/tmp/fp8cache-nccl timeout 90 $py -m torch.distributed.run --nproc-per-node 2 \
      benchmarks/nccl_plans.py --out "$work/nccl_plans.json" >>"$work/nccl.log" 2>&1
  log "b: start-up without vendors, prepare() with the vendors"
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NO_VENDORS timeout 60 $py benchmarks/h200_checks.py --label no-vendors --skip nonfinite,prepare \
      --out "$work/checks_novendors.json" >>"$work/lane0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 60 $py benchmarks/h200_checks.py --label vendors-prepare --skip nonfinite,startup \
      --out "$work/checks_prepare.json" >>"$work/lane1.log" 2>&1 &
  wait
}

verify() {
  local rest="7168,2048,36864,7168,7168,18432"  # the DeepSeek-V3 shapes final-a's time budget left out
  (log "v0: jit warm-up, regret with the vendors on the rest of DeepSeek-V3, GPU tests"
   CUDA_VISIBLE_DEVICES=0 timeout 80 $py benchmarks/jit_warm.py --shapes "$rest" --backends deepgemm,flashinfer \
       --procs 6 --out "$work/jit_warm_rest.json" >>"$work/lane0.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 timeout 150 $py benchmarks/regret.py --shapes "$rest" --label vendors-deepseek-rest \
       --budget-s 120 --out "$work/regret_vendors_deepseek_rest.json" >>"$work/lane0.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 timeout 120 $py -m pytest -q -n 4 -m gpu tests/test_gpu.py -p no:cacheprovider \
       >"$work/gpu_tests.log" 2>&1
   log "v0: done") &
  (log "v1: kernel, compile and transformers GPU tests, the example"
   CUDA_VISIBLE_DEVICES=1 timeout 60 $py -m pytest -q -m gpu tests/test_kernels_gpu.py -p no:cacheprovider \
       >"$work/kernel_gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 120 $py -m pytest -q -n 6 -m gpu tests/test_compile_gpu.py -p no:cacheprovider \
       >"$work/compile_gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 100 $py -m pytest -q -m gpu tests/test_transformers_gpu.py -p no:cacheprovider \
       >"$work/transformers_gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 100 $py examples/transformers_fp8.py --out "$work/transformers_vendors.json" \
       >>"$work/lane1.log" 2>&1
   log "v1: done") &
  wait
}

final_check() {
  (log "c0: GPU tests of the final tree"
   CUDA_VISIBLE_DEVICES=0 timeout 200 $py -m pytest -q -n 4 -m gpu tests/test_gpu.py tests/test_gpu_vendors.py \
       tests/test_kernels_gpu.py -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
   log "c0: done") &
  (log "c1: numerics sweep with the vendors, a load-time measured shape"
   CUDA_VISIBLE_DEVICES=1 timeout 130 $py benchmarks/gpu_check.py --out "$work/gpu_check" --skip-tests --skip-facts \
       --budget-s 100 >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 FP8SELECT_TUNE=load FP8SELECT_CACHE_DIR=/tmp/fp8cache-check timeout 60 $py benchmarks/regret.py \
       --shapes 6144,4096 --m 1,16,256,4096 --label vendors-load-check --out "$work/regret_load_check.json" \
       >>"$work/lane1.log" 2>&1
   log "c1: done") &
  wait
}

startup_limits() {
  install_project_deps
  (log "s0: start-up with the vendors on empty caches; the kernels' limits"
   CUDA_VISIBLE_DEVICES=0 timeout 120 $py benchmarks/h200_checks.py --label vendors --skip nonfinite,prepare \
       --out "$work/checks_vendors.json" >>"$work/lane0.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 timeout 300 $py benchmarks/limits.py --budget-s 240 --out "$work/limits.json" \
       >>"$work/lane0.log" 2>&1
   log "s0: done") &
  (log "s1: start-up without the vendors; GPU tests"
   CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NO_VENDORS timeout 60 $py benchmarks/h200_checks.py --label no-vendors \
       --skip nonfinite,prepare --out "$work/checks_novendors.json" >>"$work/lane1.log" 2>&1
   timeout 60 $py -m pytest -q -m gpu tests/test_verify_chain.py -p no:cacheprovider >"$work/verify_chain_gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 280 $py -m pytest -q -n 4 -m gpu tests/test_gpu.py tests/test_gpu_vendors.py \
       tests/test_kernels_gpu.py tests/test_compile_gpu.py -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
   log "s1: done") &
  wait
}

retune() {
  install_project_deps
  (log "r0: tune triton, DeepSeek-V3 first half; the quantizer's program shapes"
   CUDA_VISIBLE_DEVICES=0 timeout 450 $py -m fp8select tune --shapes 2112,7168,24576,1536,32768,512,7168,16384 \
       --backends triton --force --max-configs 8 --replays 20 --budget-s 420 --out "$work/tuning_a.json" \
       >>"$work/lane0.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 timeout 100 $py benchmarks/quant_sweep.py --out "$work/quant_sweep.json" >>"$work/lane0.log" 2>&1
   log "r0: done") &
  (log "r1: start-up with and without the vendors; tune triton, DeepSeek-V3 second half"
   CUDA_VISIBLE_DEVICES=1 timeout 120 $py benchmarks/h200_checks.py --label vendors --skip nonfinite,prepare \
       --out "$work/checks_vendors.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NO_VENDORS timeout 60 $py benchmarks/h200_checks.py --label no-vendors \
       --skip nonfinite,prepare --out "$work/checks_novendors.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 400 $py -m fp8select tune --shapes 4096,7168,7168,2048,36864,7168,7168,18432 \
       --backends triton --force --max-configs 8 --replays 20 --budget-s 370 --out "$work/tuning_b.json" \
       >>"$work/lane1.log" 2>&1
   log "r1: done") &
  wait
}

final_limits() {
  (log "l0: the kernels' limits with the shipped table"
   CUDA_VISIBLE_DEVICES=0 timeout 300 $py benchmarks/limits.py --budget-s 250 --out "$work/limits.json" \
       >>"$work/lane0.log" 2>&1
   log "l0: done") &
  (log "l1: start-up with the vendors, regret with the vendors, GPU tests"
   CUDA_VISIBLE_DEVICES=1 timeout 120 $py benchmarks/h200_checks.py --label vendors --skip nonfinite,prepare \
       --out "$work/checks_vendors.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 170 $py benchmarks/regret.py --shapes deepseek-v3 --label vendors-deepseek \
       --budget-s 150 --out "$work/regret_vendors_deepseek.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 200 $py -m pytest -q -n 4 -m gpu tests/test_verify_chain.py tests/test_gpu.py tests/test_gpu_vendors.py \
       tests/test_kernels_gpu.py -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
   log "l1: done") &
  wait
}

pdl() {
  (log "p0: decode limits, PDL off then on"
   CUDA_VISIBLE_DEVICES=0 FP8SELECT_TRITON_PDL=0 timeout 150 $py benchmarks/limits.py --phases floor,decode \
       --budget-s 120 --out "$work/limits_decode_nopdl.json" >>"$work/lane0.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 timeout 150 $py benchmarks/limits.py --phases floor,decode --budget-s 120 \
       --out "$work/limits_decode_pdl.json" >>"$work/lane0.log" 2>&1
   log "p0: done") &
  (log "p1: tune triton with PDL (DeepSeek-V3), GPU tests"
   CUDA_VISIBLE_DEVICES=1 timeout 230 $py -m fp8select tune --shapes deepseek-v3 --backends triton --force \
       --max-configs 8 --replays 20 --budget-s 210 --out "$work/tuning_pdl.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 120 $py -m pytest -q -m gpu tests/test_kernels_gpu.py tests/test_compile_gpu.py \
       -p no:cacheprovider >"$work/kernel_compile_gpu_tests.log" 2>&1
   log "p1: done") &
  wait
}

final_pdl() {
  (log "f0: the kernels' limits with the shipped table"
   CUDA_VISIBLE_DEVICES=0 timeout 290 $py benchmarks/limits.py --budget-s 250 --out "$work/limits.json" \
       >>"$work/lane0.log" 2>&1
   log "f0: done") &
  (log "f1: regret with the vendors, GPU tests"
   CUDA_VISIBLE_DEVICES=1 timeout 120 $py benchmarks/regret.py --shapes 4096,7168,7168,2048,32768,512 \
       --m 1,2,4,8,16,64,256,1024 --label vendors-decode --budget-s 100 --out "$work/regret_vendors_decode.json" \
       >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 150 $py -m pytest -q -n 4 -m gpu tests/test_kernels_gpu.py tests/test_verify_chain.py \
       tests/test_gpu.py tests/test_gpu_vendors.py -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 130 $py -m pytest -q -n 6 -m gpu tests/test_compile_gpu.py -p no:cacheprovider \
       >"$work/compile_gpu_tests.log" 2>&1
   log "f1: done") &
  wait
}

final_decode() {
  (CUDA_VISIBLE_DEVICES=0 timeout 140 $py benchmarks/limits.py --phases floor,decode --budget-s 115 \
       --out "$work/limits_decode.json" >>"$work/lane0.log" 2>&1; log "d0: done") &
  (CUDA_VISIBLE_DEVICES=1 timeout 120 $py -m pytest -q -m gpu tests/test_kernels_gpu.py -p no:cacheprovider \
       >"$work/kernel_gpu_tests.log" 2>&1; log "d1: done") &
  wait
}

anatomy() {
  (CUDA_VISIBLE_DEVICES=0 timeout 330 $py benchmarks/decode_anatomy.py --out "$work/anatomy.json" \
       >>"$work/lane0.log" 2>&1; log "d0: done") &
  (CUDA_VISIBLE_DEVICES=1 timeout 240 $py -m pytest -q -m gpu tests/test_kernels_gpu.py -p no:cacheprovider \
       >"$work/kernel_gpu_tests.log" 2>&1; log "d1: done") &
  wait
}

pdl_rule() {
  (CUDA_VISIBLE_DEVICES=0 timeout 250 $py -m fp8select tune --shapes 7168,16384,7168,18432,36864,7168,13824,5120 \
       --m 1,2,4,8,16 --backends triton --force --max-configs 8 --replays 20 --budget-s 225 \
       --out "$work/tuning_big.json" >>"$work/lane0.log" 2>&1
   $py benchmarks/merge_tuning.py fp8select/data/tuning-nvidia-h200.json "$work/tuning_big.json" \
       "$work/tuning_merged.json" >"$work/merge.txt" 2>&1 && cp "$work/tuning_merged.json" fp8select/data/tuning-nvidia-h200.json
   CUDA_VISIBLE_DEVICES=0 timeout 140 $py benchmarks/limits.py --phases floor,decode --budget-s 115 \
       --out "$work/limits_decode.json" >>"$work/lane0.log" 2>&1; log "d0: done") &
  (CUDA_VISIBLE_DEVICES=1 timeout 200 $py benchmarks/gpu_check.py --out "$work/gpu_check" --skip-tests --skip-facts \
       --budget-s 170 >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 280 $py -m pytest -q -n 4 -m gpu tests -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
   log "d1: done") &
  wait
}

probe() {
  (CUDA_VISIBLE_DEVICES=0 timeout 300 $py benchmarks/persistent_probe.py --out "$work/persistent_probe.json" \
       >>"$work/lane0.log" 2>&1; log "d0: done") &
  (CUDA_VISIBLE_DEVICES=1 timeout 330 $py benchmarks/limits.py --budget-s 300 --out "$work/limits.json" \
       >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}

gpu_tests() {  # every GPU test, in the groups that do not share a process with the interpreter tests
  CUDA_VISIBLE_DEVICES=$1 timeout 200 $py -m pytest -q -n 4 -m gpu tests/test_kernels_gpu.py tests/test_verify_chain.py tests/test_bench.py \
      tests/test_gpu.py tests/test_gpu_vendors.py -p no:cacheprovider >"$work/gpu_tests.log" 2>&1
  CUDA_VISIBLE_DEVICES=$1 timeout 130 $py -m pytest -q -n 6 -m gpu tests/test_compile_gpu.py \
      tests/test_transformers_gpu.py -p no:cacheprovider >"$work/compile_gpu_tests.log" 2>&1
}

persistent() {
  (CUDA_VISIBLE_DEVICES=0 timeout 200 $py benchmarks/limits.py --phases floor,prefill --budget-s 170 \
       --out "$work/limits_prefill_sweep.json" >>"$work/lane0.log" 2>&1
   $py benchmarks/distill_limits.py "$work/limits_prefill_sweep.json" "$work/prefill_sweep.json" \
       && $py benchmarks/merge_tuning.py fp8select/data/tuning-nvidia-h200.json "$work/prefill_sweep.json" \
       "$work/tuning_merged.json" --margin 0.02 >"$work/merge.txt" 2>&1 \
       && cp "$work/tuning_merged.json" fp8select/data/tuning-nvidia-h200.json
   CUDA_VISIBLE_DEVICES=0 timeout 290 $py benchmarks/limits.py --budget-s 260 --out "$work/limits.json" \
       >>"$work/lane0.log" 2>&1; log "d0: done") &
  (gpu_tests 1; log "d1: done") &
  wait
}

order() {
  (CUDA_VISIBLE_DEVICES=0 timeout 120 $py benchmarks/jit_warm.py --shapes deepseek-v3 --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm.json" >>"$work/lane0.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 timeout 300 $py benchmarks/order_probe.py --out "$work/order_probe.json" \
       >>"$work/lane0.log" 2>&1; log "d0: done") &
  (gpu_tests 1
   CUDA_VISIBLE_DEVICES=1 timeout 200 $py benchmarks/persistent_probe.py --out "$work/persistent_probe.json" \
       >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}

fair() {
  (CUDA_VISIBLE_DEVICES=0 timeout 100 $py benchmarks/jit_warm.py --shapes deepseek-v3 --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm.json" >>"$work/lane0.log" 2>&1
   cp fp8select/data/tuning-nvidia-h200.json "$work/tuning.json"
   log "d0: tune (re-measure, interleaved)"
   CUDA_VISIBLE_DEVICES=0 timeout 260 $py -m fp8select tune --shapes deepseek-v3 --force --max-configs 1 --replays 30 \
       --budget-s 240 --out "$work/tuning.json" >>"$work/lane0.log" 2>&1
   log "d0: regret"
   CUDA_VISIBLE_DEVICES=0 FP8SELECT_TUNING_TABLE="$work/tuning.json" timeout 190 $py benchmarks/regret.py \
       --shapes deepseek-v3 --label vendors-interleaved --budget-s 160 --out "$work/regret_vendors.json" \
       >>"$work/lane0.log" 2>&1; log "d0: done") &
  (gpu_tests 1; log "d1: limits"
   CUDA_VISIBLE_DEVICES=1 timeout 300 $py benchmarks/limits.py --budget-s 270 --out "$work/limits.json" \
       >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}

final_fair() {
  (CUDA_VISIBLE_DEVICES=0 timeout 300 $py benchmarks/limits.py --budget-s 270 --out "$work/limits.json" \
       >>"$work/lane0.log" 2>&1; log "d0: done") &
  (gpu_tests 1
   CUDA_VISIBLE_DEVICES=1 timeout 100 $py benchmarks/jit_warm.py --shapes "$OTHER" --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm_other.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 timeout 80 $py benchmarks/regret.py --shapes "$OTHER" --label vendors-other-model \
       --budget-s 60 --out "$work/regret_vendors_other_model.json" >>"$work/lane1.log" 2>&1
   CUDA_VISIBLE_DEVICES=1 FP8SELECT_TUNE=load FP8SELECT_CACHE_DIR=/tmp/fp8cache-load timeout 80 $py benchmarks/regret.py \
       --shapes "$OTHER" --label vendors-other-load --budget-s 60 --out "$work/regret_vendors_other_load.json" \
       >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}

wgmma() {
  cp fp8select/data/tuning-nvidia-h200.json "$work/tuning.json"
  (CUDA_VISIBLE_DEVICES=0 timeout 90 $py benchmarks/jit_warm.py --shapes deepseek-v3 --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm.json" >>"$work/lane0.log" 2>&1
   log "d0: tune M 256-8192 (the wgmma path in the search)"
   CUDA_VISIBLE_DEVICES=0 timeout 230 $py -m fp8select tune --shapes deepseek-v3 --m 256,512,1024,2048,4096,8192 --force \
       --max-configs 4 --replays 30 --budget-s 210 --out "$work/tuning.json" >>"$work/lane0.log" 2>&1
   cp "$work/tuning.json" fp8select/data/.tuning.tmp && mv fp8select/data/.tuning.tmp fp8select/data/tuning-nvidia-h200.json
   log "d0: limits (prefill)"
   CUDA_VISIBLE_DEVICES=0 timeout 160 $py benchmarks/limits.py --phases floor,prefill --budget-s 140 \
       --out "$work/limits_prefill.json" >>"$work/lane0.log" 2>&1; log "d0: done") &
  (gpu_tests 1; log "d1: GPU tests"
   CUDA_VISIBLE_DEVICES=1 timeout 100 $py benchmarks/scale_layout_probe.py --out "$work/scale_layout_probe.json" \
       >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}

wgmma_regret() {
  install_project_deps
  (CUDA_VISIBLE_DEVICES=0 timeout 90 $py benchmarks/jit_warm.py --shapes deepseek-v3 --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm.json" >>"$work/lane0.log" 2>&1
   log "d0: regret, vendors, deepseek-v3"
   CUDA_VISIBLE_DEVICES=0 timeout 100 $py benchmarks/regret.py --shapes deepseek-v3 --label vendors-deepseek \
       --budget-s 80 --out "$work/regret_vendors_deepseek.json" >>"$work/lane0.log" 2>&1; log "d0: done") &
  (log "d1: regret, no vendors, deepseek-v3"
   CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NO_VENDORS timeout 100 $py benchmarks/regret.py --shapes deepseek-v3 \
       --label novendors-deepseek --budget-s 80 --out "$work/regret_novendors_deepseek.json" >>"$work/lane1.log" 2>&1
   log "d1: done") &
  wait
}

grid_fair() {
  cp fp8select/data/tuning-nvidia-h200.json "$work/tuning.json"
  (CUDA_VISIBLE_DEVICES=0 timeout 100 $py benchmarks/jit_warm.py --shapes "$GRID_A,$GRID_B" --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm_grid.json" >>"$work/lane0.log" 2>&1
   log "d0: tune the grid (re-measure, interleaved)"
   CUDA_VISIBLE_DEVICES=0 timeout 150 $py -m fp8select tune --shapes "$GRID_A,$GRID_B" --force --max-configs 1 \
       --replays 30 --budget-s 130 --out "$work/tuning.json" >>"$work/lane0.log" 2>&1; log "d0: done") &
  (CUDA_VISIBLE_DEVICES=1 timeout 100 $py benchmarks/jit_warm.py --shapes "$OTHER" --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm_other.json" >>"$work/lane1.log" 2>&1; log "d1: warm") &
  wait
  install_project_deps
  CUDA_VISIBLE_DEVICES=0 FP8SELECT_TUNING_TABLE="$work/tuning.json" timeout 80 $py benchmarks/regret.py --shapes "$OTHER" \
      --label vendors-other-model --budget-s 60 --out "$work/regret_vendors_other_model.json" >>"$work/lane0.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$NO_VENDORS FP8SELECT_TUNING_TABLE="$work/tuning.json" timeout 80 $py \
      benchmarks/regret.py --shapes "$OTHER" --label novendors-other-model --budget-s 60 \
      --out "$work/regret_novendors_other_model.json" >>"$work/lane1.log" 2>&1 &
  wait
}

final_check2() {
  (CUDA_VISIBLE_DEVICES=0 timeout 200 $py benchmarks/gpu_check.py --out "$work/gpu_check" --skip-tests --skip-facts \
       --budget-s 170 >>"$work/lane0.log" 2>&1; log "d0: done") &
  (CUDA_VISIBLE_DEVICES=1 timeout 230 $py benchmarks/limits.py --budget-s 200 --out "$work/limits.json" \
       >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}

numerics() {
  local probe_shapes="4160,640,256,640,576,1536,2112,7168"  # benchmarks/vendor_error_probe.py SHAPES
  (CUDA_VISIBLE_DEVICES=0 timeout 200 $py benchmarks/gpu_check.py --out "$work/gpu_check" --skip-tests --skip-facts \
       --budget-s 170 >>"$work/lane0.log" 2>&1; log "d0: done") &
  (log "d1: jit warm-up, the probe's and other models' shapes"
   CUDA_VISIBLE_DEVICES=1 timeout 110 $py benchmarks/jit_warm.py --shapes "$probe_shapes,$OTHER" \
       --backends deepgemm,flashinfer --procs 14 --out "$work/jit_warm_other.json" >>"$work/lane1.log" 2>&1
   log "d1: vendor error probe"
   CUDA_VISIBLE_DEVICES=1 timeout 120 $py benchmarks/vendor_error_probe.py --budget-s 95 \
       --out "$work/vendor_error_probe.json" >>"$work/lane1.log" 2>&1
   log "d1: regret, vendors, other models (model, shipped table)"
   CUDA_VISIBLE_DEVICES=1 timeout 80 $py benchmarks/regret.py --shapes "$OTHER" --label vendors-other-model \
       --budget-s 60 --out "$work/regret_vendors_other_model.json" >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}
fit_check() {
  local rest="36864,7168,7168,18432,4160,7168,2112,7200,576,1536,256,640,384,1152,7168,896,1000,1000"
  install_project_deps
  (CUDA_VISIBLE_DEVICES=0 timeout 70 $py benchmarks/jit_warm.py --shapes "$OTHER" --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm_other.json" >>"$work/lane0.log" 2>&1
   log "d0: regret on other models' shapes, with and without the vendors"
   CUDA_VISIBLE_DEVICES=0 timeout 80 $py benchmarks/regret.py --shapes "$OTHER" --label vendors-other-model \
       --budget-s 60 --out "$work/regret_vendors_other_model.json" >>"$work/lane0.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$NO_VENDORS timeout 80 $py benchmarks/regret.py --shapes "$OTHER" \
       --label novendors-other-model --budget-s 60 --out "$work/regret_novendors_other_model.json" \
       >>"$work/lane0.log" 2>&1
   gpu_tests 0; log "d0: done") &
  (CUDA_VISIBLE_DEVICES=1 timeout 70 $py benchmarks/jit_warm.py --shapes "$rest" --backends deepgemm,flashinfer \
       --procs 14 --out "$work/jit_warm_rest.json" >>"$work/lane1.log" 2>&1
   log "d1: numerics sweep, shapes 7-15"
   CUDA_VISIBLE_DEVICES=1 timeout 300 $py benchmarks/gpu_check.py --out "$work/gpu_check" --skip-tests --skip-facts \
       --first-shape 6 --budget-s 270 >>"$work/lane1.log" 2>&1; log "d1: done") &
  wait
}

case $stage in
  numerics) numerics ;;
  fit-check) fit_check ;;
  order) order ;;
  fair) fair ;;
  final-fair) final_fair ;;
  grid-fair) grid_fair ;;
  wgmma) wgmma ;;
  wgmma-regret) wgmma_regret ;;
  final-check2) final_check2 ;;
  persistent) persistent ;;
  probe) probe ;;
  pdl-rule) pdl_rule ;;
  anatomy) anatomy ;;
  final-decode) final_decode ;;
  final-pdl) final_pdl ;;
  pdl) pdl ;;
  final-limits) final_limits ;;
  retune) retune ;;
  startup-limits) startup_limits ;;
  final-check) final_check ;;
  verify) verify ;;
  final-a) final_a ;;
  final-b) final_b ;;
  tune) lane0_tune & lane1_checks & wait ;;
  grid) grid ;;
  bench) bench ;;
  no-vendors) no_vendors ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$work/smi.txt" 2>&1
tar czf "$out/run-$stage.tgz" -C "$work" . && log "packed $(du -h "$out/run-$stage.tgz" | cut -f1)"
tail -5 "$work/lane0.log" "$work/lane1.log" 2>/dev/null
