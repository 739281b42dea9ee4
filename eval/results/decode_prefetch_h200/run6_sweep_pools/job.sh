# one device call (this checkout's tree; the prefetch on for GLA's int8 state at B = 64, so every launch below walks ahead):
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
timeout 150 python3 tools/sweep_kernels.py state_decode --kernels gla --batches 64 --blocks 8 16 --pools 24 \
  --out $OUT/sweep_gla_b64_pools24.jsonl > $OUT/sweep.log 2>&1
