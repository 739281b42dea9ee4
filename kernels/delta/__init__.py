"""The gated delta rule (Gated DeltaNet, Qwen3-Next)."""
