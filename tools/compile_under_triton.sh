#!/usr/bin/env bash
# Every Triton launch of the CPU suite compiled for sm_90 under another Triton release than this machine's (the lent
# GPU's, 3.6.0 in 2026-12), without a GPU: the suite's launches are recorded under this machine's Triton interpreter
# (tools/launch_record.py), then compiled in a virtual environment with that release (tools/compile_offline.py).
# The record is made with this machine's Triton: older interpreters cannot run every kernel the suite runs.
#   bash tools/compile_under_triton.sh 3.6.0 OUT_DIR [pytest args ...]       (~20 minutes on 2 cores)
set -u
[ $# -ge 2 ] || { echo "usage: bash tools/compile_under_triton.sh TRITON_VERSION OUT_DIR [pytest args ...]" >&2; exit 2; }
VERSION=$1 OUT=$2
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=/tmp/laquant-triton-$VERSION
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/python" ]; then
  # this machine's torch and that Triton; laquant's own dependencies leave the Triton in place
  { python3 -m venv "$VENV" \
      && "$VENV/bin/pip" install -q "torch==$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')" \
        "triton==$VERSION" \
      && "$VENV/bin/pip" install -q -e "$ROOT"; } > "$OUT/pip.log" 2>&1 \
    || { echo "installing Triton $VERSION failed: $OUT/pip.log"; rm -rf "$VENV"; exit 1; }
fi
cd "$ROOT"
PYTHONPATH=tools python3 -m pytest -q -p launch_record --record-launches "$OUT/launches.jsonl" "${@:-tests}" \
  > "$OUT/record.log" 2>&1 || { echo "the recording run failed: $OUT/record.log"; exit 1; }
"$VENV/bin/python" -c "import triton; print('triton', triton.__version__)" > "$OUT/compile.txt"
rc=0
PYTHONPATH=tools "$VENV/bin/python" tools/compile_offline.py --recorded "$OUT/launches.jsonl" --jobs 2 \
  >> "$OUT/compile.txt" 2> "$OUT/compile.err" || rc=$?
grep -h "^FAILED" "$OUT/compile.txt"
tail -n 1 "$OUT/compile.txt"
exit $rc
