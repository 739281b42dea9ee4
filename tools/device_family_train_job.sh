#!/usr/bin/env bash
# Train the kimi_linear (KDA + MLA) and nemotron_h (Mamba2 + attention + MLP blocks) reference models
# concurrently on one GPU, 300 s of steps each, then run both recipe ablations (prefill and decode
# mode, on the kernels), concurrently too (run by device_kernels.sh WAIT device_family_train_job.sh;
# carry .devdata/train .devdata/calibration). A failed step marks job.failed (and NAME.failed); the
# other model's steps still run. The weights are deleted at the end: the numbers come back, the
# seeded runs can be repeated.
W=$1
set -x
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
  torch.cuda.get_device_name())" > "$W/versions.txt" 2>&1
declare -A ARCH=([kimilinear-small]=kimi_linear [nemotronh-small]=nemotron_h)
# the batches keep both runs' activations under the card's memory together: laquant's differentiable
# references save ~2.5 GB (KDA, per-channel decay) and ~1.7 GB (Mamba2) per 2048-token sequence
declare -A BATCH=([kimilinear-small]=8 [nemotronh-small]=16)
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
for name in "${!ARCH[@]}"; do
  python3 tools/train.py model --arch "${ARCH[$name]}" --size small --lr 3e-3 --batch "${BATCH[$name]}" --time-budget 300 \
    --data-dir .devdata --tokenizer laquant/assets/gla-small --out "$W/$name" > "$W/train_$name.log" 2>&1 \
    || touch "$W/job.failed" "$W/$name.failed" &
done
wait
for name in "${!ARCH[@]}"; do
  [ -f "$W/$name.failed" ] && continue
  python3 tools/ablation.py "$W/$name" --device cuda --max-tokens 32768 --samples 64 --quiet \
    --recipes hybrid_int8 hybrid_int8_fp8 gla_w8a8 hybrid_attention_w8a8 gla_gates_int8 gla_fp8_state gla_bf16_state \
    --out "$W/ablation_${name}_h100" > "$W/ablation_$name.log" 2>&1 || touch "$W/job.failed" "$W/$name.failed" &
done
wait
rm -f "$W"/*-small/model.safetensors
touch "$W/job.done"
