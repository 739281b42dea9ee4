#!/usr/bin/env bash
# A trained MoE hybrid's perplexity through the int8 experts' GPU kernels against the CPU reference (issue #14's
# "< 0.05%" for the MoE path): trains tools/train.py's qwen3_next small_moe on the GPU (2 min; the CPU-trained
# model's 41 MB do not fit a call beside the tree), then tools/ablation.py with hybrid_int8 (experts int8) and with
# the experts kept, on cuda and on the device machine's CPU, on the same model. Results under $1.
#   first, here: python3 tools/train_data_subset.py --data-dir ../shared/data --out .devdata_subset --fraction 0.08
#   run: bash tools/device_kernels.sh 540 device_moe_accuracy_job.sh   (carry .devdata_subset; poll until JOB DONE)
set -u
. tools/device_job_env.sh "$@"
M="$W/qwen3next-moe-small"
timeout 400 python3 tools/train.py model --arch qwen3_next --size small_moe --seq-len 256 --batch 16 --steps 1000 \
  --time-budget 120 --data-dir .devdata_subset --tokenizer laquant/assets/gla-small --out "$M" > "$W/train.log" 2>&1
log "train rc $?"
for device in cuda cpu; do
  timeout 500 python3 tools/ablation.py "$M" --device $device --context 256 --samples 64 --seq-len 256 \
    --max-tokens 32768 --recipes hybrid_int8 hybrid_int8,experts.format=keep --quiet \
    --out "$W/ablation_moe_$device" > "$W/ablation_moe_$device.log" 2>&1 &
done
wait
log "ablations done"
rm -f "$M/model.safetensors"
touch "$W/job.done"
