"""MoE experts with int8 weights (weight-only: the activations stay in the model's dtype)."""
