set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc FUSIONPLAN_CACHE_DIR=/tmp/fc
mkdir -p $OUT/r
timeout 100 python bench/conv_variants.py --solver triton-window --layers r50_06,r50_08,r50_12,r50_14,r50_20 --candidates 1 2>&1 | grep -v "^\s*$" | tee $OUT/r/strided.txt
timeout 330 python -m pytest -m gpu tests/test_gpu.py -q -n 8 -p no:cacheprovider -k "window or every_applicable or r50_06 or r50_08 or r50_12 or r50_14 or r50_20" 2>&1 | grep -E "FAILED|passed|failed|Error" | cut -c1-250

