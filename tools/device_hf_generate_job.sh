#!/usr/bin/env bash
# transformers' generate with a CUDA graph per decode step (laquant.models.graphed_step): its GPU tests and the
# generate / static-cache tests around it, the host profile of eager steps (tools/profile_host.py), then the 1.37B GLA
# e2e (bf16 vs gla_int8_all, fla's GLAForCausalLM as the peer: carry .whl) with the graphs on and with
# LAQUANT_GRAPH_STEPS=0 (e2e_gla_nographs), and the 1.14B qwen3_next e2e (its generate is eager). Results under $1.
#   run: bash tools/device_kernels.sh 560 device_hf_generate_job.sh
set -u
. tools/device_job_env.sh "$@"
timeout 600 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_graphed_step.py tests/test_generate.py \
  tests/test_static_hybrid.py tests/test_speculative.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
timeout 600 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 --gen 32 --peers \
  --model "config:$CONFIG" --out "$W/e2e_gla" > "$W/e2e_gla.log" 2>&1
log "gla e2e rc $?"
LAQUANT_GRAPH_STEPS=0 timeout 600 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 \
  --gen 32 --model "config:$CONFIG" --out "$W/e2e_gla_nographs" > "$W/e2e_gla_nographs.log" 2>&1
log "gla e2e nographs rc $?"
bash tools/device_hybrid_e2e.sh "$W"
touch "$W/job.done"
