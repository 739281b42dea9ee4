"""Kimi Linear's and Ling / Ring's MLA decode steps (laquant.models.mla_attention): the absorbed form attends
over the cached latents and must give transformers' expanded keys' logits, on the static cache and on
transformers' own; a quantized kv_b_proj enters with its dequantized weight."""

import pytest
import torch
from test_hybrid import VOCAB, bailing_hybrid, kimi_linear
from test_static_hybrid import _prefilled, transformers_forward

from laquant.adapters import install, new_cache
from laquant.generate import static_cache, static_forward
from laquant.models import mla_attention
from laquant.models.quantizing_rowwise import original_class


def _model(family="kimi_linear", **kw):
    torch.manual_seed(3)
    return {"kimi_linear": kimi_linear, "bailing_hybrid": bailing_hybrid}[family](**kw).float().eval()


def _transformers_forward(model):
    transformers_forward(model, mla_attention.MLA_ATTENTIONS)


def _counted_steps(monkeypatch) -> list:
    """A list that grows by one at each absorbed step."""
    calls = []
    step = mla_attention._absorbed_step
    monkeypatch.setattr(mla_attention, "_absorbed_step", lambda *a: calls.append(1) or step(*a))
    return calls


@pytest.mark.parametrize("family,kw", [("kimi_linear", {}), ("kimi_linear", {"q_lora_rank": 24}),
                                       ("bailing_hybrid", {})])  # Ling: rotary rope part, head-wise output gate
@torch.no_grad()
def test_static_steps_take_the_absorbed_form(family, kw, monkeypatch):
    """Five static decode steps through the absorbed form give the logits and the cached latents of
    transformers' forward on the same static cache; a prompt does not take it."""
    model = _model(family, **kw)
    install(model)
    calls = _counted_steps(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    ids, steps = torch.randint(0, VOCAB, (3, 10), generator=gen), torch.randint(0, VOCAB, (3, 5), generator=gen)
    absorbed = static_cache(_prefilled(model, ids), 16)
    plain = static_cache(_prefilled(model, ids), 16)
    got = [static_forward(model, steps[:, t:t + 1], absorbed) for t in range(5)]
    assert len(calls) == 5 * len(absorbed.kv) > 0
    _prefilled(model, ids)
    assert len(calls) == 5 * len(absorbed.kv)
    _transformers_forward(model)
    want = [static_forward(model, steps[:, t:t + 1], plain) for t in range(5)]
    assert len(calls) == 5 * len(absorbed.kv)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(got[0], got[-1], atol=1e-3)  # the steps differ: a stale step would show
    for i in absorbed.kv:
        torch.testing.assert_close(absorbed.kv[i][0], plain.kv[i][0])
        torch.testing.assert_close(absorbed.kv[i][1], plain.kv[i][1])


@pytest.mark.parametrize("family", ["kimi_linear", "bailing_hybrid"])
@torch.no_grad()
def test_static_steps_run_the_latent_attention_kernel(family, monkeypatch):
    """On the GPU path (Triton's interpreter on the CPU, float32) the absorbed static step's attention over the
    latents is laquant's one kernel, once per MLA layer and step, and the logits stay the absorbed PyTorch ops' (which
    test_static_steps_take_the_absorbed_form holds to transformers' forward)."""
    from conftest import INTERPRETED, require_triton_kernels

    require_triton_kernels()
    if not INTERPRETED:
        pytest.skip("checks the kernel's wiring on the CPU under TRITON_INTERPRET=1 (the GPU test covers CUDA)")
    from laquant.kernels.attention import latent

    model = _model(family)
    install(model)
    gen = torch.Generator().manual_seed(4)
    ids, steps = torch.randint(0, VOCAB, (3, 10), generator=gen), torch.randint(0, VOCAB, (3, 4), generator=gen)
    plain = static_cache(_prefilled(model, ids), 16)
    want = [static_forward(model, steps[:, t:t + 1], plain) for t in range(4)]
    monkeypatch.setattr(mla_attention, "use_triton", lambda x, fmt=None: not (x.requires_grad and
                                                                                torch.is_grad_enabled()))
    calls = []
    kernel = latent.latent_attention_triton
    monkeypatch.setattr(latent, "latent_attention_triton", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    cache = static_cache(_prefilled(model, ids), 16)
    got = [static_forward(model, steps[:, t:t + 1], cache) for t in range(4)]
    assert len(calls) == 4 * len(cache.kv) > 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["kimi_linear", "bailing_hybrid"])
@torch.no_grad()
def test_eager_decode_steps_match_transformers(family, monkeypatch):
    """Decode steps on transformers' own cache (eager decoding), a left-padded batch among them, take the
    absorbed form and give transformers' forward's logits."""
    model = _model(family)
    install(model)
    calls = _counted_steps(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    ids, steps = torch.randint(1, VOCAB, (2, 8), generator=gen), torch.randint(1, VOCAB, (2, 4), generator=gen)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # the second row is left-padded

    def decode():
        cache = new_cache(model)
        out = [model(input_ids=ids, attention_mask=mask[:, :8], past_key_values=cache, use_cache=True).logits[:, -1]]
        for t in range(4):
            out.append(model(input_ids=steps[:, t:t + 1], attention_mask=mask[:, :9 + t], past_key_values=cache,
                             use_cache=True).logits[:, -1])
        return out

    got = decode()
    assert len(calls) == 4
    _transformers_forward(model)
    want = decode()
    assert len(calls) == 4
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


@torch.no_grad()
def test_absorbed_weights_follow_the_projection():
    """The absorbed weights are kv_b_proj's rows per head, and are taken again when the weight changes."""
    model = _model()
    install(model)
    attn = next(m for m in model.modules() if original_class(m).__name__ in mla_attention.MLA_ATTENTIONS)
    w_k, w_v = mla_attention.absorbed_weights(attn, torch.float32)
    w = attn.kv_b_proj.weight.view(attn.num_heads, -1, attn.kv_lora_rank)
    nope = attn.qk_nope_head_dim
    assert torch.equal(w_k, w[:, :nope]) and torch.equal(w_v.transpose(1, 2), w[:, nope:])
    assert mla_attention.absorbed_weights(attn, torch.float32)[0] is w_k  # kept
    attn.kv_b_proj.weight.mul_(2)
    assert torch.equal(mla_attention.absorbed_weights(attn, torch.float32)[0], 2 * w_k)


@torch.no_grad()
def test_a_quantized_projection_enters_dequantized():
    """Under hybrid_int8 kv_b_proj is int8: the absorbed steps use its dequantized weight, so they differ from
    transformers' W8A8 call only by the latents' activation rounding (small against the logits)."""
    import laquant
    from laquant.quant.modules import QuantLinear

    model = _model()
    install(model)
    laquant.calibrate(model, "hybrid_int8", torch.randint(0, VOCAB, (2, 64)), progress=False)
    attn = next(m for m in model.modules() if original_class(m).__name__ in mla_attention.MLA_ATTENTIONS)
    assert isinstance(attn.kv_b_proj, QuantLinear)
    w_k, _ = mla_attention.absorbed_weights(attn, torch.float32)
    assert torch.equal(w_k, attn.kv_b_proj.dequantized_weight().view(attn.num_heads, -1, attn.kv_lora_rank)
                       [:, :attn.qk_nope_head_dim])
    gen = torch.Generator().manual_seed(4)
    ids, steps = torch.randint(0, VOCAB, (2, 9), generator=gen), torch.randint(0, VOCAB, (2, 3), generator=gen)
    absorbed, plain = static_cache(_prefilled(model, ids), 16), static_cache(_prefilled(model, ids), 16)
    got = [static_forward(model, steps[:, t:t + 1], absorbed) for t in range(3)]
    _transformers_forward(model)
    want = [static_forward(model, steps[:, t:t + 1], plain) for t in range(3)]
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        assert (g - w).abs().max() < 2e-2 * w.abs().max()
