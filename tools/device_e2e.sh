#!/usr/bin/env bash
# End-to-end speed only: the user's path (calibrate, then eval speed on the checkpoint against its
# baseline) and the recipe-on-the-fly form on a 1.37B random config. Needs carry: .whl
set -u
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || { echo "SETUP FAILED"; exit 1; }
laquant calibrate --recipe gla_int8 --samples 16 --seq-len 1024 --no-eval --device cuda --quiet --out /tmp/ck \
  > "$OUT/calibrate.log" 2>&1 || tail -5 "$OUT/calibrate.log"
laquant eval speed /tmp/ck --baseline gla-small --suite e2e --out "$OUT/speed_ck" > "$OUT/speed_ck.log" 2>&1 \
  || tail -5 "$OUT/speed_ck.log"
laquant eval speed --suite e2e --model \
  'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  --out "$OUT/speed_e2e" > "$OUT/speed_e2e.log" 2>&1 || tail -5 "$OUT/speed_e2e.log"
cat "$OUT"/speed_ck/speed.md "$OUT"/speed_e2e/speed.md 2>/dev/null | grep -A8 "## e2e"
