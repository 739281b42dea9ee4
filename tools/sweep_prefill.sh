export PYTHONPATH=/tmp/site
[ -f /tmp/laqk/setup.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . && mkdir -p /tmp/laqk && touch /tmp/laqk/setup.done; }
for bt in 16 32 64; do for bv in 32 64 128; do for w in 4 8; do
  timeout 60 python3 tools/sweep_kernels.py prefill 4096 $bt $bv $w 2>&1 | grep -E "prefill|Error" | tail -1
done; done; done
