#!/usr/bin/env bash
# Issue #14: what an int8 lm_head adds to the 1.37B GLA's graphed decode (gla_int8_all keeps lm_head bf16), at the
# e2e vocabulary (32,000) and at a Qwen-sized one (151,936, where lm_head is ~a third of the int8 model's bytes).
# Each `laquant eval speed --suite e2e` run has bf16 beside its recipe: gla_int8_all, then the same recipe with lm_head
# quantized too (written here from recipes/gla_int8_all.yaml, keep without lm_head). Prompt 1,024, no profile.
#   run: bash tools/device_kernels.sh 540 device_lm_head_job.sh   (poll with the same line until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
sed -e 's/^name: gla_int8_all$/name: gla_int8_all_lm_head/' -e 's/^keep: \[embeddings, norms, lm_head\]$/keep: [embeddings, norms]/' \
  recipes/gla_int8_all.yaml > "$W/gla_int8_all_lm_head.yaml"
grep -q "^keep: \[embeddings, norms\]$" "$W/gla_int8_all_lm_head.yaml" || { log "recipe rewrite failed"; touch "$W/job.done"; exit 1; }
for vocab in 32000 151936; do
  CONFIG="{\"hidden_size\": 2048, \"num_hidden_layers\": 24, \"num_heads\": 16, \"vocab_size\": $vocab}"
  for recipe in gla_int8_all "$W/gla_int8_all_lm_head.yaml"; do
    tag=v${vocab}_$(basename "$recipe" .yaml)
    timeout 240 laquant eval speed --suite e2e --recipe "$recipe" --batch 1 64 --prompt 1024 --gen 32 --no-profile \
      --model "config:$CONFIG" --out "$W/e2e_$tag" > "$W/e2e_$tag.log" 2>&1
    log "e2e $tag rc $?"
  done
done
touch "$W/job.done"
