#!/usr/bin/env bash
# Train the small (embedded) and large reference GLA models. Run by device_poll.sh in the background.
set -x
W=$1
python3 tools/train.py model --size small --lr 3e-3 --data-dir .devdata \
  --tokenizer laquant/assets/gla-small --out "$W/gla-small" \
&& python3 tools/train.py model --size large --lr 1.5e-3 --data-dir .devdata \
  --tokenizer laquant/assets/gla-small --out "$W/gla-large" \
&& touch "$W/train.done" || touch "$W/train.failed"
