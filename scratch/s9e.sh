export PYTHONPATH=src:. PYTHONWARNINGS=ignore
python scratch/guard.py zoo_001,zoo_010,zoo_024,zoo_036,zoo_106,zoo_200 2>&1 | grep zoo_
python scratch/parts.py 2>&1 | grep -v Warn | head -24
timeout 130 python -m tests.fuzz --mode gpu --seed 104 --cases 500 --layers 0.4 --focus cudnn --solvers cudnn,reference --workers 14 --time-limit 90 --summary $OUT/fuzz104.json 2> $OUT/fuzz104.log
python - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/fuzz104.json"))
print({k: d[k] for k in ("cases", "runs", "runs_by_solver", "mismatches", "crashes", "seconds")})
for m in d["mismatch_list"][:10]: print(str(m)[:400])
P
timeout 80 python -m pytest -q -x tests/gpu/test_vendor.py -k "fp16 or fp32" 2>&1 | tail -2
