#!/usr/bin/env bash
# The whole gpu-marked suite over every GPU of the host, a part per GPU (pytest --part K/N), each part
# recording the tests that ended without failing (pytest --record / --done), so that a run stopped by
# a time limit is taken up where it stopped by the same command:
#   scripts/gpu_suite.sh OUTDIR            (needs pytest-xdist; WORKERS per part, default 16)
#   SUITE_TIMEOUT=500 scripts/gpu_suite.sh OUTDIR; scripts/gpu_suite.sh OUTDIR   (two runs, one suite)
# OUTDIR keeps per part its record (ended-K-of-N.txt) and each run's output (run-R-part-K-of-N.txt:
# a run that ends lists its 20 slowest tests); the last lines say how many tests of each part are
# left. The host's cores set the pace of compiling (lab/NOTES.md section 59); the tests marked slow
# (tile tests, minutes each) run first and go to the workers a test at a time (--maxschedchunk 1), so
# that none is left to run alone at a part's end (section 60).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:?usage: scripts/gpu_suite.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
gpus=${GPUS:-$(nvidia-smi -L | wc -l)}
run=$(( $(find "$out" -name 'run-*-part-1-of-*.txt' | wc -l) + 1 ))
for ((k = 1; k <= gpus; k++)); do
  record="$out/ended-$k-of-$gpus.txt"
  CUDA_VISIBLE_DEVICES=$((k - 1)) timeout "${SUITE_TIMEOUT:-540}" python -m pytest -m gpu tests/gpu -q \
    -n "${WORKERS:-16}" --maxschedchunk 1 -p no:cacheprovider -rfE --durations=20 --part "$k/$gpus" --record "$record" --done "$record" \
    > "$out/run-$run-part-$k-of-$gpus.txt" 2>&1 &
done
wait
for ((k = 1; k <= gpus; k++)); do
  record="$out/ended-$k-of-$gpus.txt"
  failed=$(grep -c '^FAILED\|^ERROR' "$out/run-$run-part-$k-of-$gpus.txt")
  left=$(python -m pytest -m gpu tests/gpu -q -p no:cacheprovider --collect-only --part "$k/$gpus" \
    --done "$record" 2>/dev/null | tail -1)
  echo "part $k of $gpus: $(wc -l < "$record" 2>/dev/null || echo 0) ended without failing, $failed failed this run; left: $left"
done
