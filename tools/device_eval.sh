#!/usr/bin/env bash
# After training: fla-vs-laquant parity on the GPU, perplexities of both models, samples.
set -x
W=$1
LAQUANT_TEST_MODEL="$W/gla-small" python3 -m pytest -q -rs tests/test_fla_parity.py tests/test_decode_kernel.py 2>&1 | tee "$W/gpu_tests.log"
for m in gla-small gla-large; do
  for d in wikitext2 .devdata/eval/gutenberg-heldout/gutenberg_heldout.txt; do
    name=$(basename "$d" .txt)
    laquant eval ppl "$W/$m" --data "$d" --context 2048 --mode prefill decode --device cuda --quiet \
      --json "$W/ppl_${m}_${name}.json" || echo "eval failed: $m $d"
  done
  python3 tools/samples.py "$W/$m" --device cuda > "$W/samples_${m}.txt" || echo "samples failed: $m"
done
# recipe ablation on the GPU (laquant's reference path on CUDA, float32 compute), both models
for m in gla-small gla-large; do
  python3 tools/ablation.py "$W/$m" --device cuda --max-tokens 65536 --quiet \
    --out "$W/ablation_${m}" || echo "ablation failed: $m"
done
# decode-step kernel benchmark against fla (last: the least important if time runs out)
laquant eval speed --suite decode --out "$W/speed" || echo "bench failed"
