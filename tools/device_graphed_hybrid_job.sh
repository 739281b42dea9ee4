#!/usr/bin/env bash
# The hybrids' CUDA-graphed decode (laquant/models/static_hybrid.py, written 2026-11-27 on the CPU) on the
# GPU: its GPU tests (and generate's and eval ppl's), issue #14's hybrid e2e (hybrid_int8 against bf16 on the
# 1.14B dense qwen3_next of eval/results/speed_h100_e2e_fused.md, now graphed), where a step's time goes
# (tools/profile_hybrid_decode.py: eager 15-24 ms a step for 0.75-0.88 ms of GPU before), and issue #16's
# 64K-token decodes of the qwen3next-small hybrid (retrained with device_64k_job.sh's seeded command) on the
# graphed loop, one process per recipe side by side. The training runs beside the GPU tests; the timed
# parts run alone. The tree and all of .devdata exceed one call's carry: copy .devdata/train and
# .devdata/calibration into /tmp/devdata in two calls first, then
#   DATA_DIR=/tmp/devdata bash tools/device_kernels.sh 540 device_graphed_hybrid_job.sh
# and poll with JOB=device_graphed_hybrid_job bash tools/device_poll_lc.sh WAIT.
set -u
W=$1
M=/tmp/laq-models
H="$M/qwen3next-small"
mkdir -p "$M"
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
log start
python3 tools/train.py model --arch qwen3_next --size small --lr 3e-3 --batch 16 --steps 522 \
  --data-dir "${DATA_DIR:-.devdata}" --tokenizer laquant/assets/gla-small --out "$H" > "$W/train_hybrid.log" 2>&1 &
TRAIN=$!
timeout 600 python3 -m pytest -q -rfs --tb=short tests/test_static_hybrid.py tests/test_generate.py \
  tests/test_eval_ppl.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
wait $TRAIN
log "hybrid trained rc $?"
timeout 600 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model 'qwen3_next:{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}' \
  --out "$W/e2e_hybrid" > "$W/e2e_hybrid.log" 2>&1
log "hybrid e2e rc $?"
timeout 300 python3 tools/profile_hybrid_decode.py "$W/profile_hybrid_decode.json" > "$W/profile_hybrid_decode.log" 2>&1
log "hybrid decode profile rc $?"
bash tools/hybrid_64k_decodes.sh "$H" "$W"
touch "$W/job.done"
