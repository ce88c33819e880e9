python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc FUSIONPLAN_CACHE_DIR=/tmp/fc
timeout 330 python -m fusionplan.benchmark.cli --precisions fp16 --layouts NHWC --modes CBA --batch 1 --baselines cudnn --no-plots --out $OUT/b1 2>&1 | grep -E "geometric|r50_1[0-4]|wrong|Error" | head -20
rm -f $OUT/b1/*.png
timeout 260 python examples/resnet50.py --out $OUT/r50.md 2>&1 | tail -9
