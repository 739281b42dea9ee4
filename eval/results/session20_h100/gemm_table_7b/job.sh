#!/usr/bin/env bash
# The H100's decode GEMM table for a 4096-wide model's shapes (tools/sweep_gemm.py --shapes 7b --wide), in one call
# (~3 minutes once the machine is up): results and the table to apply under $OUT/sweep_7b.
#   run: bash tools/device_h100_sweep_7b.sh   (then python tools/sweep_gemm.py --apply .../sweep_7b/configs_table.py)
set -u
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1 || { echo "SETUP FAILED"; exit 1; }
D="$OUT/sweep_7b"
mkdir -p "$D"
for i in 0 1 2 3 4 5 6 7 8 9 10 11; do
  python3 tools/sweep_gemm.py --shapes 7b --wide --warm $i/12 > "$D/warm_$i.log" 2>&1 &
done
wait
timeout 400 python3 tools/sweep_gemm.py --shapes 7b --wide --out "$D" > "$D/sweep.log" 2>&1
echo "sweep rc $?"
tail -n 3 "$D/sweep.log"
