#!/bin/bash
# One device call: compile the sweep's candidates in parallel, sweep (writes the table and the
# results under $OUT), put the table into configs.py, then run the GEMM tests on the GPU against it.
set -x
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
for i in 0 1 2 3 4 5 6 7 8 9; do python3 tools/sweep_gemm.py --warm $i/10 > $OUT/warm_$i.log 2>&1 & done
wait
cat $OUT/warm_*.log | grep -v '^$' | head -20; rm -f $OUT/warm_*.log
python3 tools/sweep_gemm.py --out $OUT 2>&1 | tee $OUT/sweep.log
python3 tools/sweep_gemm.py --apply $OUT/configs_table.py
for d in bf16 fp16 fp32; do
  python3 -m pytest -q -x tests/test_gemm_decode.py -k "$d" > $OUT/test_$d.log 2>&1 &
done
python3 -m pytest -q tests/test_gemm_decode.py tests/test_int8_gemm_kernel.py -k "not gpu_odd" > $OUT/test_rest.log 2>&1
wait
tail -n 15 $OUT/test_*.log
