#!/usr/bin/env bash
# Issue #14, the 8-bit state's decode step on its bit patterns: the decode kernels' launch sweep (it
# rewrites kernels/common/state_io.py's tables, copied to $W) and the SASS of the int8 kernels it
# compiled, the GPU tests of the state kernels, then the e2e decode of the 1.14B qwen3_next (bf16 vs
# hybrid_int8) with the B = 64 step's profile, and of the 1.37B GLA (bf16 vs gla_int8_all).
# Run by `bash tools/device_kernels.sh WAIT device_state_decode_job.sh`. $1: work folder.
set -u
W=${1:-$OUT}
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
log start
export TRITON_CACHE_DIR=/tmp/triton_state_sweep
timeout 400 python3 tools/sweep_kernels.py state_decode --write > "$W/sweep_state_decode.log" 2>&1
log "sweep rc $?"
cp kernels/common/state_io.py "$W/state_io.py"
BIN=$(python3 -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin'))")
mkdir -p "$W/sass"
for f in $(find "$TRITON_CACHE_DIR" -name "_delta_decode_kernel.cubin" -o -name "_gla_decode_kernel.cubin"); do
  d=$(dirname "$f")
  if grep -q '"FMT": 3' "$d"/*.json 2>/dev/null; then
    n=$(basename "$d"); cp "$d"/*.json "$W/sass/$n.json"
    "$BIN/nvdisasm" -c "$f" > "$W/sass/$n.sass" 2>&1 || "$BIN/cuobjdump" -sass "$f" > "$W/sass/$n.sass" 2>&1
  fi
done
log "sass done"
unset TRITON_CACHE_DIR
timeout 600 python3 -m pytest -q -rfs --tb=short -m gpu tests/test_delta_kernels.py tests/test_decode_kernel.py \
  tests/test_int4_state.py tests/test_verify.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
CONFIG='{"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 0}'
timeout 600 laquant eval speed --suite e2e --hybrid-recipe hybrid_int8 --batch 1 64 --prompt 1024 --gen 32 \
  --model "qwen3_next:$CONFIG" --out "$W/e2e_hybrid" > "$W/e2e_hybrid.log" 2>&1
log "hybrid e2e rc $?"
BATCH=64 PROMPT=1024 timeout 300 python3 tools/profile_hybrid_decode.py "$W/profile_hybrid_b64.json" \
  eval/results/graphed_hybrid_h200/qwen3_next_2048x16_config.json > "$W/profile_hybrid.log" 2>&1
log "profile rc $?"
timeout 600 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 --gen 32 \
  --model 'config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}' \
  --out "$W/e2e_gla" > "$W/e2e_gla.log" 2>&1
log "gla e2e rc $?"
touch "$W/job.done"
