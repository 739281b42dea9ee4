#!/usr/bin/env bash
# Issue #19 on the GPU: the verify step / commit and speculative decoding tests on the kernels, then
# tools/bench_verify.py (verify vs decode, K decodes and the chunked kernel; speculative tokens/s).
# $1: work folder (default $OUT), where the logs and bench_verify/verify.{json,md} land.
W=${1:-$OUT}
python3 -m pytest -q -rs tests/test_verify.py tests/test_speculative.py > "$W/spec_tests.log" 2>&1
python3 tools/bench_verify.py --out "$W/bench_verify" > "$W/bench_verify.log" 2>&1
touch "$W/job.done"
