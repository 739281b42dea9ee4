#!/usr/bin/env bash
# What the int8 MoE experts' last device run left unverified (2026-12-05, eval/results/moe_experts_h200/): the GPU
# tests on the fitted tile rule and the alignment's index masking (the experts' tests and every hybrid GPU test); a
# trained MoE hybrid's perplexity through the GPU kernels against the CPU reference (tools/train.py's qwen3_next
# small_moe trained here on the GPU: the CPU-trained model's 41 MB do not fit a call's carry beside the tree); and
# the graphed decode step of the 2.25B Qwen3-Next-style MoE profiled kernel by kernel at B = 1 and 64 (where a MoE
# layer's ~41 launches go). Results under $1.
#   first, here: python3 tools/train_data_subset.py --data-dir ../shared/data --out .devdata_subset --fraction 0.08
#   run: bash tools/device_kernels.sh 540 device_moe_verify_job.sh   (carry .devdata_subset; poll until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
M="$W/qwen3next-moe-small"
(timeout 400 python3 tools/train.py model --arch qwen3_next --size small_moe --seq-len 256 --batch 16 --steps 1000 \
  --time-budget 120 --data-dir .devdata_subset --tokenizer laquant/assets/gla-small --out "$M" > "$W/train.log" 2>&1
 log "train rc $?"
 for device in cuda cpu; do
   timeout 420 python3 tools/ablation.py "$M" --device $device --context 256 --samples 64 --seq-len 256 \
     --max-tokens 16384 --recipes hybrid_int8 hybrid_int8,experts.format=keep --quiet \
     --out "$W/ablation_moe_$device" > "$W/ablation_moe_$device.log" 2>&1 &
 done
 wait
 log "ablations done"
 rm -f "$M/model.safetensors"
 touch "$W/ablations.done") &
timeout 240 python3 -m pytest -v -rfs --tb=short tests/test_moe_experts.py > "$W/gpu_tests_moe.log" 2>&1
log "moe tests rc $?"
timeout 420 python3 -m pytest -v -rfs --tb=short -m gpu tests/test_hybrid.py tests/test_static_hybrid.py \
  tests/test_graphed_step.py tests/test_generate.py > "$W/gpu_tests_families.log" 2>&1
log "family gpu tests rc $?"
python3 tools/family_configs.py qwen3_next --moe > "$W/moe_fields.json"
for b in 1 64; do
  BATCH=$b TOP=60 timeout 300 python3 tools/profile_hybrid_decode.py "$W/profile_moe_b$b.json" "$W/moe_fields.json" \
    > "$W/profile_moe_b$b.log" 2>&1
  log "profile B=$b rc $?"
done
while [ ! -f "$W/ablations.done" ]; do sleep 5; done
touch "$W/job.done"
