"""Short depthwise causal convolutions (the conv before q, k, v of the linear-attention mixers)."""
