#!/usr/bin/env bash
# The copying NCHW kernels (gluon-odd-planes: 1x1 on 7x7 planes; gluon-column-pairs: 3x3 filters
# and strided 1x1 on rows of even width), both off until measured: their GPU tests, then each A/B
# against the kernels that run those layers now (its tuning switch off and on, in one process;
# CUDA graphs, 5 rounds, cuDNN beside), fp16 and bf16, NCHW input and output, batch 32.
#   scripts/ab_nchw_copies.sh OUTDIR [tests|odd|pairs|all]   (default all; each part takes minutes)
#   WORKERS=N: pytest-xdist workers for the tests (default 8)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$1
part=${2:-all}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
common=(--layouts NCHW --precisions fp16,bf16 --modes CBNA,CBA --batch 32 --graph --rounds 5 --baselines cudnn --no-plots)
if [[ $part == tests || $part == all ]]; then
  timeout "${TEST_TIMEOUT:-540}" python -m pytest -m gpu tests/test_gpu.py -q -n "${WORKERS:-8}" -p no:cacheprovider \
    -k "gluon_odd_planes or gluon_column_pairs" 2>&1 | tail -30 | tee "$out/gpu-tests-copies.txt"
fi
if [[ $part == odd || $part == all ]]; then
  timeout "${AB_TIMEOUT:-540}" python -m fusionplan.benchmark.cli --layers r50_19,r50_21 "${common[@]}" \
    --tuning GLUON_ODD_PLANES=0,1 --tuning GLUON_ODD_PLANES_BLOCK_N=0,64,128 --out "$out/ab-odd-planes"
fi
if [[ $part == pairs || $part == all ]]; then
  timeout "${AB_TIMEOUT:-540}" python -m fusionplan.benchmark.cli \
    --layers r50_02,r50_06,r50_08,r50_10,r50_12,r50_14,r50_16,r50_18,r50_20 "${common[@]}" \
    --tuning GLUON_COLUMN_PAIRS=0,1 --tuning GLUON_COLUMN_PAIRS_STAGES=3,4 --out "$out/ab-column-pairs"
fi
