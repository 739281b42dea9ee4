#!/usr/bin/env bash
# Re-entrant driver for training the reference models on the lent GPU machine.
# Each call: set up (once), start training in the background (once), wait up to $1 seconds, and
# when training is done run device_eval.sh (parity, perplexity, samples). Whatever exists is packed
# into $OUT as results.tgz.part-* (each under the 16 MiB return limit). Needs carry: .whl .devdata
set -u
WAIT=${1:-500}
W=/tmp/laq                                  # outside the repo: survives while the machine stays warm
mkdir -p "$W"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_AUTOTUNING=1 TOKENIZERS_PARALLELISM=true
if [ ! -f "$W/setup.done" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    && touch "$W/setup.done" || { echo "SETUP FAILED"; exit 1; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/device.txt"
  python3 -c "import torch, triton, transformers, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'fla', fla.__version__)" >> "$W/device.txt" 2>&1
  cat "$W/device.txt"
fi
if [ ! -f "$W/train.started" ]; then
  touch "$W/train.started"
  setsid nohup bash tools/device_train.sh "$W" > "$W/train.log" 2>&1 < /dev/null &
  echo "training started"
fi
# The large model cannot travel back (98 MB): its recipe ablation must run here, as soon as it exists.
if [ -f "$W/gla-large/model.safetensors" ] && [ -f "$W/train.done" ] && [ ! -f "$W/ablation_large.started" ]; then
  touch "$W/ablation_large.started"
  setsid nohup python3 tools/ablation.py "$W/gla-large" --device cuda --max-tokens 32768 --samples 64 \
    --quiet --out "$W/ablation_gla-large" > "$W/ablation_large.log" 2>&1 < /dev/null &
fi
t=0
while [ ! -f "$W/eval.done" ] && [ ! -f "$W/train.failed" ] && [ "$t" -lt "$WAIT" ]; do
  if [ -f "$W/train.done" ] && [ ! -f "$W/eval.started" ]; then
    touch "$W/eval.started"   # evaluation also runs in the background: it can outlast one call
    setsid nohup bash -c "bash tools/device_eval.sh '$W' > '$W/eval.log' 2>&1; touch '$W/eval.done'" \
      < /dev/null > /dev/null 2>&1 &
  fi
  sleep 15; t=$((t + 15))
done
tail -n 12 "$W/train.log"
[ -f "$W/eval.log" ] && tail -n 25 "$W/eval.log"
if [ -f "$W/train.failed" ]; then echo "TRAINING FAILED"; fi
( cd "$W" && tar czf - --exclude='gla-large/model.safetensors' --exclude='*.started' --exclude='*.done' . ) \
  | split -b 15M - "$OUT/results.tgz.part-"
[ -f "$W/eval.done" ] && echo "ALL DONE" || echo "NOT DONE YET"
