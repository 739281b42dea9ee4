"""Softmax attention around the linear layers of a hybrid: the decode token's q/k preparation (qk_norm_rope),
its attention over a static cache (decode) and MLA's absorbed attention over the cached latents (latent)."""
