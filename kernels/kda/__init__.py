"""Kimi Delta Attention (KDA, Kimi Linear): the gated delta rule with a per-channel decay."""
