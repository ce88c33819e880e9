#!/usr/bin/env bash
# The H100 benchmark run behind lab/results/: compile every case in parallel shards first (kernel
# and torch.compile caches are on disk, shared by the processes), then time them in one process.
#   scripts/gpu_bench.sh OUTDIR PRECISION [LAYOUTS] [MODES] [fusionplan-bench options of the timed run...]
# e.g. scripts/gpu_bench.sh /tmp/bench fp16 NHWC,NCHW CBNA,CBA,NA --graph
#      scripts/gpu_bench.sh /tmp/ab fp16 NHWC,NCHW CBNA --graph --tuning GLUON_NCHW_STRIDED_RING_BYTES=98304,163840  (an A/B of every layer)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$1 precision=$2 layouts=${3:-NHWC,NCHW} modes=${4:-CBNA,CBA,NA}
shift $(( $# < 4 ? $# : 4 ))
shards=${SHARDS:-14}
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
common=(--precisions "$precision" --layouts "$layouts" --modes "$modes" --batch 32)
# the timed run's --tuning variants are compiled by the shards too
variants=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == --tuning ]] && variants+=(--tuning "${args[i + 1]}")
done
for k in $(seq 0 $((shards - 1))); do
  TORCHINDUCTOR_COMPILE_THREADS=1 timeout "${WARM_TIMEOUT:-240}" python -m fusionplan.tools.bench.cli "${common[@]}" \
    "${variants[@]}" --warm-only --shard "$k/$shards" > "/tmp/warm-$k.log" 2>&1 &
done
wait
grep -h "wrong result\|Error" /tmp/warm-*.log | head -20
timeout "${TIMED_TIMEOUT:-330}" python -m fusionplan.tools.bench.cli "${common[@]}" --iters "${ITERS:-30}" --out "$out" "$@"
