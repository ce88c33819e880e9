export PYTHONPATH=src:.
python scratch/guard.py zoo_001,zoo_010,zoo_024,zoo_036,zoo_106,zoo_200 > $OUT/guard.txt 2>&1
tail -8 $OUT/guard.txt
timeout 150 python -m tests.fuzz --mode gpu --seed 103 --cases 400 --layers 0.4 --focus cudnn --solvers cudnn,reference --workers 14 --time-limit 100 --summary $OUT/fuzz103.json 2> $OUT/fuzz103.log
python - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/fuzz103.json"))
print({k: d[k] for k in ("cases", "runs", "runs_by_solver", "mismatches", "crashes", "seconds")})
for m in d["mismatch_list"][:30]: print(str(m)[:400])
P
timeout 100 python -m pytest -q -x tests/gpu/test_vendor.py -k "fp16 or fp32" 2>&1 | tail -3
