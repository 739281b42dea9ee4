#!/usr/bin/env bash
# A change to kernels/common/triton_numerics.py (the kernels' rounding) timed against the file before
# it on one GPU (issues #14 / #16 / #19; eval/results/int8_codes_h200.md): the decode kernels with
# every 8-bit state format (tools/bench_stochastic_rounding.py), an int8 decode sweep at the e2e
# model's shape and the e2e decode of the 1.37B GLA, each on the base tree (this tree with
# $BASE_NUMERICS as triton_numerics.py) and this tree; then the GPU tests of every kernel that stores,
# reads or writes int8 codes. The base file travels in an ignored folder:
#   mkdir -p .scratch/base && git show 09ebc75:kernels/common/triton_numerics.py > .scratch/base/triton_numerics.py
#   run: bash tools/device_kernels.sh 560 device_codec_job.sh   (carry [".scratch/base"])
set -u
W=$1
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
log() { echo "$* $(date +%T)" >> "$W/status.log"; }
python3 -c "import torch, triton, transformers; print(torch.cuda.get_device_name(), 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" > "$W/versions.txt" 2>&1
# both trees are copies: a later call re-syncs the working tree under a running job
rm -rf /tmp/new /tmp/base && cp -r . /tmp/new && cp -r . /tmp/base && cp "${BASE_NUMERICS:-.scratch/base/triton_numerics.py}" /tmp/base/kernels/common/triton_numerics.py
cd /tmp/new
run_tree() {  # $1: tree, $2: label
  (cd "$1" && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1 \
    && timeout 300 python3 tools/bench_stochastic_rounding.py --out "$W/sr_$2" > "$W/sr_$2.log" 2>&1)
  log "sr $2 rc $?"
  (cd "$1" && timeout 600 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 --gen 32 \
    --model "$CFG" --out "$W/e2e_$2" > "$W/e2e_$2.log" 2>&1)
  log "e2e $2 rc $?"
}
run_tree /tmp/new new
run_tree /tmp/base base
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1
timeout 300 python3 tools/sweep_kernels.py state_decode \
  > "$W/sweep_e2e_shape.log" 2>&1
log "sweep rc $?"
timeout 900 python3 -m pytest -q -rfs --tb=short tests/test_stochastic_rounding.py tests/test_int8_gemm_kernel.py \
  tests/test_gemm_decode.py tests/test_fused_layer_ops.py tests/test_gpu_model.py tests/test_decode_kernel.py \
  tests/test_delta_kernels.py tests/test_kda_kernels.py tests/test_verify.py tests/test_chunk_kernel.py > "$W/gpu_tests.log" 2>&1
log "gpu tests rc $?"
touch "$W/job.done"
