export PYTHONPATH=src:. PYTHONWARNINGS=ignore
python -m tests.fuzz --mode gpu --seed 101 --index 519 --layers 0.4 --focus cudnn 2>&1 | tail -25 | cut -c1-300
F=cudnn,triton-gemm,triton-gemm-nchw,gluon-rows
timeout 380 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 3 --print-limit 20 \
  python -m tests.fuzz --mode gpu --seed 2101 --cases 600 --workers 8 --misuse 0 --layers 0.4 --focus $F --solvers $F,reference \
  --time-limit 320 --summary $OUT/memcheck-seed2101.json > $OUT/memcheck.log 2>&1
echo "memcheck exit: $?"
grep -E "ERROR SUMMARY|Invalid|out of bounds" $OUT/memcheck.log | sort | uniq -c | head -20
python - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/memcheck-seed2101.json"))
print({k: d[k] for k in ("cases", "runs", "runs_by_solver", "mismatches", "crashes", "seconds")})
for m in d["mismatch_list"][:10]: print(str(m)[:300])
P
