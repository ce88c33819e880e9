#!/usr/bin/env bash
# The GPU correctness run: environment, the gpu-marked suite (parallel: many kernels compile),
# one compute-sanitizer memcheck run, and the driver's fused-vs-unfused timing.
#   scripts/gpu_check.sh [OUTDIR]        (needs pytest-xdist for -n)
#   PART=2/6 scripts/gpu_check.sh ...   (the second of six parts of the suite: pytest --part)
#   RECORD=F scripts/gpu_check.sh ...   (F lists each test that ended without failing, as it ends;
#                                        run again with the same F, the suite goes on where it stopped)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-gpu-check-out}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version(), 'cuda', torch.version.cuda)"
} | tee "$out/env.txt"
workers=${WORKERS:-12}
timeout "${SUITE_TIMEOUT:-480}" python -m pytest -m gpu tests/gpu -q -n "$workers" --maxschedchunk 1 -p no:cacheprovider \
  ${PART:+--part "$PART"} ${RECORD:+--record "$RECORD" --done "$RECORD"} \
  --junitxml="$out/gpu-tests.xml" 2>&1 | tail -40 | tee "$out/gpu-tests.txt"
echo "suite exit: ${PIPESTATUS[0]}" | tee -a "$out/gpu-tests.txt"
