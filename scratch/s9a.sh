export PYTHONPATH=src:.
nvidia-smi --query-gpu=name --format=csv,noheader
python scratch/guard.py zoo_001,zoo_010,zoo_024,zoo_036,zoo_106,zoo_200 > $OUT/guard.txt 2>&1
tail -8 $OUT/guard.txt
timeout 260 python -m tests.fuzz --mode gpu --seed 101 --cases 800 --layers 0.4 --focus cudnn --workers 14 --time-limit 200 --summary $OUT/fuzz101.json 2> $OUT/fuzz101.log
python - <<'P'
import json, os, collections
d = json.load(open(os.environ["OUT"] + "/fuzz101.json"))
print({k: d[k] for k in ("cases", "runs", "runs_by_solver", "mismatches", "crashes", "seconds")})
for m in d["mismatch_list"][:30]: print(m.get("solver"), m.get("index"), str(m.get("failures", m))[:300])
for c in d["crash_list"][:10]: print("CRASH", str(c)[:300])
P
timeout 120 python -m pytest -q -x tests/gpu/test_vendor.py 2>&1 | tail -4
