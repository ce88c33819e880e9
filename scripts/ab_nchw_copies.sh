#!/usr/bin/env bash
# The copying NCHW kernels (gluon-odd-planes: 1x1 on 7x7 planes; gluon-odd-windows: 3x3 on 7x7
# planes; gluon-column-pairs: 3x3 filters and strided 1x1 on rows of even width), all off until
# measured: their GPU tests, then the bench
# on their layers, fp16 and bf16, NCHW input and output, batch 32, CUDA graphs, 5 rounds, cuDNN
# beside. The bench times every applicable solver (a 'solver:NAME' column each, the copying ones
# with their default tiles) beside what compile picks now ('fused'); the 'tuning:' columns switch
# the kernel on with each tile width or ring depth. Compiles run first in parallel shards.
#   scripts/ab_nchw_copies.sh OUTDIR [tests|odd|windows|pairs|all]   (default all; each part takes minutes)
#   WORKERS=N: pytest-xdist workers for the tests (default 8); SHARDS=N: compile shards (default 12)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$1
part=${2:-all}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
common=(--layouts NCHW --precisions fp16,bf16 --modes CBNA,CBA --batch 32 --baselines cudnn)

bench() {  # NAME LAYERS [--tuning ...]: compile in shards, then time in one process
  local name=$1 layers=$2 shards=${SHARDS:-12}
  shift 2
  for k in $(seq 0 $((shards - 1))); do
    TORCHINDUCTOR_COMPILE_THREADS=1 timeout "${WARM_TIMEOUT:-240}" python -m fusionplan.benchmark.cli \
      --layers "$layers" "${common[@]}" "$@" --warm-only --shard "$k/$shards" > "$out/warm-$name-$k.log" 2>&1 &
  done
  wait
  timeout "${TIMED_TIMEOUT:-300}" python -m fusionplan.benchmark.cli --layers "$layers" "${common[@]}" "$@" \
    --graph --rounds 5 --no-plots --out "$out/$name"
}

if [[ $part == tests || $part == all ]]; then
  timeout "${TEST_TIMEOUT:-540}" python -m pytest -m gpu tests/test_gpu.py -q -n "${WORKERS:-8}" -p no:cacheprovider \
    -k "gluon_odd_planes or gluon_odd_windows or gluon_column_pairs" 2>&1 | tail -30 | tee "$out/gpu-tests-copies.txt"
fi
if [[ $part == odd || $part == all ]]; then
  bench ab-odd-planes r50_19,r50_21 --tuning GLUON_ODD_PLANES=1 --tuning GLUON_ODD_PLANES_BLOCK_N=64,128
fi
if [[ $part == windows || $part == all ]]; then
  bench ab-odd-windows r50_22 --tuning GLUON_ODD_WINDOWS=1 --tuning GLUON_ODD_WINDOWS_STAGES=2,3,4
fi
if [[ $part == pairs || $part == all ]]; then
  bench ab-column-pairs r50_02,r50_06,r50_08,r50_10,r50_12,r50_14,r50_16,r50_18,r50_20 \
    --tuning GLUON_COLUMN_PAIRS=1 --tuning GLUON_COLUMN_PAIRS_STAGES=3,4
fi
