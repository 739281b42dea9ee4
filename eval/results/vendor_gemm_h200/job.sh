#!/usr/bin/env bash
# Issue #14: the vendor's decode-size GEMMs (cuBLAS int8 `_int_mm`, cuBLASLt fp8 rowwise `_scaled_mm`) beside
# laquant's split-K int8 GEMM, at the 1.37B GLA's and the 7B shapes (tools/vendor_gemm_probe.py).
. tools/device_job_env.sh "$@"
python3 tools/vendor_gemm_probe.py --out "$W/gla" --shapes gla --m 1,16,32,64,128 > "$W/gla.log" 2>&1
log "gla rc $?"
python3 tools/vendor_gemm_probe.py --out "$W/7b" --shapes 7b --m 32,64 > "$W/7b.log" 2>&1
log "7b rc $?"
touch "$W/job.done"
