#!/usr/bin/env bash
# Issues #14 and #19 on the GPU, one session: (1) the GPU tests of the kernels this change touched
# (programmatic dependent launch on the decode step's kernels, the state update as one FMA) and of
# speculative decoding and the prefix cache; (2) the e2e GLA suite with PDL off and on in the same
# session (LAQUANT_PDL=0 and =all; fla's GLAForCausalLM as the peer in the second); (3) tools/bench_verify.py and
# tools/device_serve.sh. Run through tools/device_kernels.sh WAIT device_pdl_job.sh (carry .whl).
set -u
W=${1:?usage: tools/device_pdl_job.sh WORK_DIR}
CFG='config:{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16, "vocab_size": 32000}'
python3 - > "$W/versions.txt" 2>&1 <<'EOF'
import torch, triton, transformers
from laquant.kernels.common.pdl import pdl_enabled
print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__,
      "transformers", transformers.__version__, "pdl", pdl_enabled(torch.device("cuda"), 1))
EOF
if [ -n "${QUICK:-}" ]; then  # the second call of the session: the fixes' GPU tests, then e2e PDL off / on
  timeout 400 python3 -m pytest -q -rfs --tb=short tests/test_verify.py tests/test_speculative.py \
    -k "(test_triton_verify and (delta or kda)) or test_speculative_on_the_gpu" > "$W/gpu_tests_quick.log" 2>&1
  echo "tests quick rc $? $(date +%T)" >> "$W/status.log"
  for pdl in 0 all; do
    LAQUANT_PDL=$pdl timeout 400 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 \
      --gen 32 --model "$CFG" --out "$W/e2e_quick_pdl$pdl" > "$W/e2e_quick_pdl$pdl.log" 2>&1
    echo "e2e quick pdl=$pdl rc $? $(date +%T)" >> "$W/status.log"
  done
  touch "$W/job.done"
  exit 0
fi
timeout 600 python3 -m pytest -q -rfs --tb=short tests/test_verify.py tests/test_gpu_model.py tests/test_fused_layer_ops.py \
  tests/test_gemm_decode.py > "$W/gpu_tests_a.log" 2>&1
echo "tests a rc $? $(date +%T)" >> "$W/status.log"
for pdl in 0 all; do
  peers=""
  [ "$pdl" = all ] && peers="--peers"
  LAQUANT_PDL=$pdl timeout 900 laquant eval speed --suite e2e --recipe gla_int8_all --batch 1 64 --prompt 4096 \
    --gen 32 --model "$CFG" $peers --out "$W/e2e_pdl$pdl" > "$W/e2e_pdl$pdl.log" 2>&1
  echo "e2e pdl=$pdl rc $? $(date +%T)" >> "$W/status.log"
done
timeout 600 python3 -m pytest -q -rfs --tb=short tests/test_speculative.py tests/test_decode_kernel.py \
  tests/test_delta_kernels.py > "$W/gpu_tests_b.log" 2>&1
echo "tests b rc $? $(date +%T)" >> "$W/status.log"
timeout 600 python3 tools/bench_verify.py --out "$W/bench_verify" > "$W/bench_verify.log" 2>&1
echo "bench_verify rc $? $(date +%T)" >> "$W/status.log"
timeout 900 bash tools/device_serve.sh "$W/serve" > "$W/serve.log" 2>&1
echo "serve rc $? $(date +%T)" >> "$W/status.log"
touch "$W/job.done"
