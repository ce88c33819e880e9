#!/usr/bin/env bash
# The fuzzer on the GPU: random plans on every GPU solver that claims them, then compute-sanitizer
# memcheck over fuzzed plans and racecheck over those of the warp-specialized (Gluon) solvers.
#   scripts/gpu_fuzz.sh OUTDIR [SEED]
#   FUZZ_SECONDS=420 MEMCHECK_CASES=150 RACECHECK_CASES=60 WORKERS=16 LAYERS=0.4 MODELS=0.05 FOCUS= SOLVERS= (the
#   defaults; LAYERS: the share of layer-like cases, which reach the kernels tuned for networks' layers; MODELS: the
#   share of random fused models trained beside eager (fp32 and float64 copies); FOCUS: solvers,
#   comma separated, that every case of the main run is drawn for in turn; SOLVERS: run only these (prefixes,
#   comma separated) in the main run and under memcheck; memcheck focuses on MEMCHECK_FOCUS (and runs
#   only those), else as the main run; racecheck takes the Gluon ones of FOCUS, or RACECHECK_FOCUS)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:?usage: scripts/gpu_fuzz.sh OUTDIR [SEED]}
seed=${2:-1}
mkdir -p "$out"
export PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export FUSIONPLAN_CACHE_DIR=${FUSIONPLAN_CACHE_DIR:-$(mktemp -d)}  # racecheck's report is read against its cubins
triton=triton-conv,triton-stem,triton-pointwise,triton-depthwise,triton-gemm,triton-gemm-nchw,triton-window
gluon=gluon-nchw,gluon-nchw-regs,gluon-stem,gluon-rows,gluon-window,gluon-gemm,gluon-halo,gluon-row-pairs,gluon-plane-chunks
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
} | tee "$out/env.txt"
workers=${WORKERS:-16}
focus_gluon() {  # the Gluon solvers of FOCUS, or all of them
  local picked
  picked=$(tr , '\n' <<< "${FOCUS:-}" | grep '^gluon-' | paste -sd, -)
  echo "${picked:-$gluon}"
}
python -m tests.fuzz --mode gpu --seed "$seed" --cases "${FUZZ_CASES:-100000}" --workers "$workers" --layers "${LAYERS:-0.4}" \
  --models "${MODELS:-0.05}" ${FOCUS:+--focus "$FOCUS"} ${SOLVERS:+--solvers "$SOLVERS"} --time-limit "${FUZZ_SECONDS:-420}" --summary "$out/gpu-fuzz.json" 2> "$out/gpu-fuzz.log"
echo "fuzz exit: $?" | tee -a "$out/env.txt"
if [ "${MEMCHECK_CASES:-150}" -gt 0 ]; then
  timeout "${SANITIZER_SECONDS:-150}" compute-sanitizer --tool memcheck --target-processes all --error-exitcode 3 --print-limit 20 \
    python -m tests.fuzz --mode gpu --seed "$((seed + 1000))" --cases "${MEMCHECK_CASES:-150}" --workers 8 \
    --misuse 0 --focus "${MEMCHECK_FOCUS:-${FOCUS:-$triton,$gluon}}" --solvers "${MEMCHECK_FOCUS:-${SOLVERS:-$triton,$gluon,reference}}" --time-limit "$((${SANITIZER_SECONDS:-150} - 40))" \
    --summary "$out/memcheck-fuzz.json" > "$out/memcheck.log" 2>&1
  echo "memcheck exit: $?" | tee -a "$out/env.txt"
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$out/memcheck.log" | sort | uniq -c | head -20 | tee -a "$out/env.txt"
fi
if [ "${RACECHECK_CASES:-60}" -gt 0 ]; then
  timeout "${SANITIZER_SECONDS:-150}" compute-sanitizer --tool racecheck --target-processes all --error-exitcode 3 --print-limit 20 \
    python -m tests.fuzz --mode gpu --seed "$((seed + 2000))" --cases "${RACECHECK_CASES:-60}" --workers 8 \
    --misuse 0 --solvers gluon- --focus "${RACECHECK_FOCUS:-$(focus_gluon)}" --time-limit "$((${SANITIZER_SECONDS:-150} - 40))" \
    --summary "$out/racecheck-fuzz.json" > "$out/racecheck.log" 2>&1
  echo "racecheck exit: $?" | tee -a "$out/env.txt"
  grep -E "RACECHECK SUMMARY|hazard" "$out/racecheck.log" | sort | uniq -c | head -20 | tee -a "$out/env.txt"
  python lab/probes/sass_at.py "$out/racecheck.log" "$FUSIONPLAN_CACHE_DIR/triton" > "$out/racecheck-sass.txt" 2>&1
fi
python - "$out" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.loads(f.read_text())
    print(f.name, {k: v for k, v in d.items() if not k.endswith("_list")})
    for m in (d["mismatch_list"] + d["crash_list"])[:25]:
        print("  ", m.get("solver"), m.get("how") or m["failures"][0][:240], "|", m["repro"])
PY
