set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc FUSIONPLAN_CACHE_DIR=/tmp/fc
mkdir -p $OUT/r
timeout 280 python -m pytest -m gpu tests/test_gpu.py -q -n 10 -p no:cacheprovider -k "window or every_applicable or r50_10 or r50_16 or r50_22 or r50_00" 2>&1 | grep -E "FAILED|passed|failed|Error" | cut -c1-250
V="timeout 150 python bench/conv_variants.py"
$V --layers r50_10,r50_16 --candidates 1 2>&1 | grep -v "^\s*$" | tee $OUT/r/window.txt
