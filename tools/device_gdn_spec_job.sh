#!/usr/bin/env bash
# A prompt-lookup speculative round on a random 1.67B Gated DeltaNet target (16 key / 32 value heads of 128 x 128,
# the delta rule's e2e state shape) quantized with gla_int8, B = 64, verify numerics "prefill", before
# (scratch/base_pkg: the delta rule's one-chunk verify with the per-channel decay split) and after (per-head decay on
# the scores): a round's cost in plain decode steps (tools/bench_verify.py --timing-target).
#   run: bash tools/device_kernels.sh 400 device_gdn_spec_job.sh   (carry scratch)
set -u
. tools/device_job_env.sh "$@"
[ -d "$BASE/laquant/assets" ] || cp -r laquant/assets "$BASE/laquant/assets"
TARGET='{"model_type": "gated_deltanet", "hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "head_dim": 128, "num_v_heads": 32, "expand_v": 1}'
for tag in new base; do
  case $tag in base) p=$BASE: ;; new) p= ;; esac
  PYTHONPATH="$p$PYTHONPATH" timeout 150 python3 tools/bench_verify.py --out "$W/gdn_$tag" \
    --model "$PWD/laquant/assets/gla-small" --no-kernels --draft ngram --draft-tokens 4 8 --spec-batch 64 \
    --new-tokens 128 --verify-numerics prefill --prompt-offsets 0 --timing-target "$TARGET" > "$W/gdn_$tag.log" 2>&1
  log "gdn $tag rc $?"
done
touch "$W/job.done"
