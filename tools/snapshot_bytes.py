"""Bytes of one prefix-cache snapshot per state format, for GLA head shapes (issue #19's "4x more
snapshots with fp8 than fp32"): one layer of a random GLA of each shape (a snapshot's bytes grow with
the layers, the ratios do not; the weights do not matter), its 64-token block stored by
``PrefixStateCache``. Device-independent, runs on the CPU in seconds:

    python tools/snapshot_bytes.py > eval/results/snapshot_bytes.txt
"""

import torch

from laquant.models import GLAConfig, GLAForCausalLM
from laquant.serving.replay import snapshot_memory

SHAPES = [("gla-small (K=32, V=64)", 256, 4), ("gla-large (K=64, V=128)", 512, 4),
          ("the e2e 1.37B GLA, 16 heads (K=64, V=128)", 2048, 16), ("the serve 1.3B GLA, 4 heads (K=256, V=512)", 2048, 4)]
FORMATS = ["fp32", "bf16", "fp8_row", "int8_row", "int4_row", "fp8_head", "fp8_tensor"]

if __name__ == "__main__":
    torch.set_num_threads(1)
    print("| head shape | " + " | ".join(FORMATS) + " |")
    print("|---|" + "---|" * len(FORMATS))
    for name, hidden, heads in SHAPES:
        cfg = GLAConfig(hidden_size=hidden, num_hidden_layers=1, num_heads=heads, vocab_size=512, bos_token_id=0,
                        eos_token_id=0)
        rows = snapshot_memory(GLAForCausalLM(cfg).eval(), FORMATS, 64, 1 << 30)
        print(f"| {name} | " + " | ".join(f"{r['snapshot_bytes']:,} B ({r['vs_fp32']:.3f}x)" for r in rows) + " |")
