"""~1B-parameter configs of the transformers hybrid families for `laquant eval speed --suite e2e --model FAMILY:{json}`
(random weights, speed only), each after the layout of a released model of the family (dense MLPs where the family
allows, so that a B = 64 step is not an MoE benchmark). `python3 tools/family_configs.py FAMILY` prints one as JSON;
`--moe` prints the family's MoE config instead (MOE_CONFIGS: the MoE experts' speed).
"""
import json
import sys

LAYERS = 24
TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)


def pattern(unit: list, n: int) -> list:
    """``unit`` repeated to ``n`` layer types."""
    return (unit * (n // len(unit) + 1))[:n]


CONFIGS = {
    # Qwen3-Next-style (the hybrid target of issue #14, 1.14B): Gated DeltaNet layers and gated softmax attention, a
    # dense MLP (no experts), as the earlier e2e runs took it (eval/results/gated_attention_h200/)
    "qwen3_next": dict(
        hidden_size=2048, num_hidden_layers=16, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=2,
        linear_num_key_heads=16, linear_num_value_heads=32, num_experts=0),
    # Nemotron-H-style: Mamba2 blocks and squared-ReLU MLP blocks alternating, attention every sixth block
    "nemotron_h": dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_attention_heads=16, num_key_value_heads=4,
        head_dim=128, mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128, chunk_size=128,
        use_mamba_kernels=False,
        layers_block_type=pattern(["linear_attention", "mlp", "linear_attention", "mlp", "full_attention", "mlp"], 36)),
    # Bamba-style: Mamba2 layers with a SwiGLU MLP each, attention in 3 of 24
    "bamba": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=LAYERS, intermediate_size=5632, num_attention_heads=16,
        num_key_value_heads=4, mamba_n_heads=64, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128,
        mamba_chunk_size=128, attn_layer_indices=[5, 13, 21]),
    # Granite-4-style: Mamba2 layers, a shared SwiGLU MLP beside 8 experts, attention in 3 of 24
    "granitemoehybrid": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=LAYERS, intermediate_size=512, num_attention_heads=16,
        num_key_value_heads=4, mamba_n_heads=64, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128,
        mamba_chunk_size=128, num_local_experts=8, num_experts_per_tok=2, shared_intermediate_size=4096,
        position_embedding_type="rope", layer_types=pattern(["linear_attention"] * 7 + ["full_attention"], LAYERS)),
    # Mamba-2-1.3B-style: Mamba2 blocks alone (48 of them, no MLPs, no attention)
    "mamba2": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=48, num_heads=64, head_dim=64, state_size=128, n_groups=1,
        expand=2, chunk_size=128, **TOKENS),
    # Falcon-H1-style: Mamba2 and attention side by side in every block, then a SwiGLU MLP, muP multipliers at 1
    "falcon_h1": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=LAYERS, intermediate_size=5632, num_attention_heads=16,
        num_key_value_heads=4, head_dim=128, mamba_d_ssm=4096, mamba_n_heads=64, mamba_d_head=64, mamba_n_groups=1,
        mamba_d_state=128, mamba_chunk_size=128, mamba_rms_norm=True, **TOKENS),
    # Zamba2-1.2B-style: Mamba2 layers, one shared attention + MLP block used every sixth layer (LoRA adapters)
    "zamba2": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=38, intermediate_size=8192, num_attention_heads=32,
        num_key_value_heads=32, n_mamba_heads=64, mamba_d_state=128, mamba_ngroups=1, chunk_size=128,
        num_mem_blocks=1, use_shared_attention_adapter=True, adapter_rank=128, use_mem_rope=True,
        layers_block_type=pattern(["linear_attention"] * 5 + ["hybrid"], 38), **TOKENS),
    # Kimi-Linear-style: KDA layers, MLA every fourth, dense SwiGLU MLPs
    "kimi_linear": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=LAYERS, intermediate_size=5632, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, linear_num_heads=16, linear_head_dim=128, num_local_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=1024, num_shared_experts=1,
        layer_types=pattern(["linear_attention"] * 3 + ["full_attention"], LAYERS), mlp_layer_types=["dense"] * LAYERS,
        **TOKENS),
    # MiniMax-Text-01-style: Lightning attention layers, softmax attention every eighth, MoE MLPs (the family has no
    # dense MLP; hybrid_int8 gives the experts int8 weights since 2026-12-05, kept in bf16 before)
    "minimax": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=LAYERS, intermediate_size=1408, num_attention_heads=16,
        num_key_value_heads=4, head_dim=128, num_local_experts=4, num_experts_per_tok=2, block_size=256,
        layer_types=pattern(["linear_attention"] * 7 + ["full_attention"], LAYERS), **TOKENS),
    # OLMo-hybrid-style: gated delta rule layers, attention every fourth
    "olmo_hybrid": dict(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=LAYERS, intermediate_size=5632, num_attention_heads=16,
        num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
        linear_value_head_dim=128, layer_types=pattern(["linear_attention"] * 3 + ["full_attention"], LAYERS),
        **TOKENS),
}

# MoE configs of families whose CONFIGS entry is dense, for the int8 experts' e2e (eval/results/moe_experts_h200/)
MOE_CONFIGS = {
    # Qwen3-Next-style with its MoE in every layer (32 experts of 512, top-4, a shared expert of 512): 2.25B
    # parameters, 1.6B of them experts
    "qwen3_next": dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=2, linear_num_key_heads=16,
        linear_num_value_heads=32, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, decoder_sparse_step=1),
}

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--moe"]
    table = MOE_CONFIGS if "--moe" in sys.argv else CONFIGS
    if len(args) != 1 or args[0] not in table:
        sys.exit(f"usage: family_configs.py FAMILY [--moe], FAMILY one of: {', '.join(table)}")
    print(json.dumps(table[args[0]]))
