"""``laquant.serving``: serving the quantized state (prefix state cache, speculative decoding)."""
