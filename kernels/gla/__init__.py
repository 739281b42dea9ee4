"""Gated linear attention (GLA; Lightning attention and Mamba2-style SSD as its scalar-decay case)."""
