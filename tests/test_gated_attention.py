"""Qwen3-Next's gated softmax attention on a static decode step (laquant.models.gated_attention): the q/k
norm + rotary + cache-write spec against transformers' own modules, the Triton kernel against the spec
(interpreted on CPU, float32; bf16 on the GPU), the gated product with sigmoid, and the layer's static step
against transformers' forward inside qwen3_next and Qwen3.5 models."""

import pytest
import torch
from test_hybrid import VOCAB, _model
from test_static_hybrid import _prefilled, transformers_forward
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm, apply_rotary_pos_emb

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from laquant.adapters import install
from laquant.generate import static_cache, static_forward
from laquant.kernels.attention import qk_norm_rope
from laquant.kernels.attention.qk_norm_rope import qk_norm_rope_step
from laquant.kernels.rowwise.reference import glu
from laquant.models import gated_attention

triton = require_triton_kernels()
from laquant.kernels.attention.qk_norm_rope import qk_norm_rope_step_triton  # noqa: E402
from laquant.kernels.rowwise.fused import glu_triton  # noqa: E402

DTYPE = torch.float32 if INTERPRETED else torch.bfloat16


def _inputs(B, Hq, Hkv, D, R, batch_cos, gen, dtype, device="cpu"):
    """q and its gate interleaved per head as q_proj writes them, k and v column slices of one projection
    (strided views, as the model hands them over), the norms' formula weights, cos / sin, a cache."""
    qg = (torch.randn(B, Hq, 2 * D, generator=gen) * 2).to(device, dtype)
    kv = (torch.randn(B, 2 * Hkv * D + 5, generator=gen) * 2).to(device, dtype)
    k, v = kv[:, :Hkv * D].view(B, Hkv, D), kv[:, Hkv * D:2 * Hkv * D].view(B, Hkv, D)
    wq, wk = (1.0 + torch.randn(D, generator=gen) * 0.3).to(device), (1.0 + torch.randn(D, generator=gen) * 0.3).to(device)
    angles = torch.rand(B if batch_cos else 1, R // 2, generator=gen) * 6
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().to(device, dtype), angles.sin().to(device, dtype)
    S = 11
    keys = torch.randn(B, Hkv, S, D, generator=gen).to(device, dtype)
    values = torch.randn(B, Hkv, S, D, generator=gen).to(device, dtype)
    pos = torch.tensor([7], device=device)
    return qg[..., :D], qg[..., D:], k, v, wq, wk, cos, sin, keys, values, pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,Hq,Hkv,D,R,batch_cos", [(3, 6, 2, 64, 16, False), (2, 4, 4, 32, 32, True),
                                                    (1, 3, 1, 48, 12, True)])
def test_spec_is_transformers_modules(dtype, B, Hq, Hkv, D, R, batch_cos):
    """qk_norm_rope_step gives, bit for bit, what Qwen3NextAttention's ops give on the CPU: q_norm and k_norm
    (Qwen3NextRMSNorm, 1 + w), apply_rotary_pos_emb (partial) and the cache update at the position; the
    other positions of the cache are untouched."""
    gen = torch.Generator().manual_seed(B * 100 + D)
    q, gate, k, v, wq, wk, cos, sin, keys, values, pos = _inputs(B, Hq, Hkv, D, R, batch_cos, gen, dtype)
    qn, kn = Qwen3NextRMSNorm(D, eps=1e-6), Qwen3NextRMSNorm(D, eps=1e-6)
    with torch.no_grad():
        qn.weight.copy_(wq - 1.0)
        kn.weight.copy_(wk - 1.0)
    want_q, want_k = apply_rotary_pos_emb(qn(q[:, :, None].transpose(1, 2)).transpose(1, 2),
                                          kn(k[:, :, None].transpose(1, 2)).transpose(1, 2),
                                          cos[:, None], sin[:, None])
    keys0, values0 = keys.clone(), values.clone()
    query, gate_out = qk_norm_rope_step(q, gate, k, v, 1.0 + qn.weight.float(), 1.0 + kn.weight.float(), 1e-6, cos, sin,
                                        keys, values, pos)
    assert torch.equal(query, want_q) and query.is_contiguous()
    assert torch.equal(keys[:, :, 7:8], want_k) and torch.equal(values[:, :, 7], v)
    others = [i for i in range(keys.shape[2]) if i != 7]
    assert torch.equal(keys[:, :, others], keys0[:, :, others]) and torch.equal(values[:, :, others], values0[:, :, others])
    assert torch.equal(gate_out, gate.reshape(B, -1)) and gate_out.is_contiguous()


@pytest.mark.parametrize("B,Hq,Hkv,D,R,batch_cos", [(3, 6, 2, 64, 16, False), (2, 4, 4, 32, 32, True),
                                                    (5, 3, 1, 48, 12, True), (1, 16, 2, 128, 32, False),
                                                    (2, 16, 2, 256, 64, False)])  # Qwen3-Next-80B's heads
def test_kernel_matches_the_spec(B, Hq, Hkv, D, R, batch_cos):
    """The kernel on strided q / gate / k / v views, a partial rotary and odd head counts and widths (48 is no
    power of two) against the spec: the query heads, the gate and the whole cache."""
    gen = torch.Generator().manual_seed(B + Hq + D)
    args = _inputs(B, Hq, Hkv, D, R, batch_cos, gen, DTYPE, DEVICE)
    ref_args = [a.clone() if i in (8, 9) else a for i, a in enumerate(args)]
    want_q, want_g = qk_norm_rope_step(*ref_args[:6], 1e-6, *ref_args[6:])
    got_q, got_g = qk_norm_rope_step_triton(*args[:6], 1e-6, *args[6:])
    assert torch.equal(got_g, want_g)
    tol = 1e-6 if INTERPRETED else 1e-2
    assert rel_err(got_q.float().cpu(), want_q.float().cpu()) < tol
    assert rel_err(args[8].float().cpu(), ref_args[8].float().cpu()) < tol
    assert torch.equal(args[9], ref_args[9])  # values are copied, not computed
    if not INTERPRETED:  # bf16: every product and sum rounded where PyTorch rounds; only the mean's summation
        # order differs, so nearly every element is equal (without the roundings 5-23% differed)
        assert (got_q != want_q).float().mean() < 0.01


def test_kernel_refuses_bad_input():
    gen = torch.Generator().manual_seed(0)
    q, gate, k, v, wq, wk, cos, sin, keys, values, pos = _inputs(2, 4, 2, 32, 16, False, gen, DTYPE, DEVICE)
    with pytest.raises(ValueError, match="group"):
        qk_norm_rope_step_triton(q[:, :3], gate[:, :3], k, v, wq, wk, 1e-6, cos, sin, keys, values, pos)
    with pytest.raises(ValueError, match="even R"):
        qk_norm_rope_step_triton(q, gate, k, v, wq, wk, 1e-6, cos[:, :15], sin[:, :15], keys, values, pos)
    with pytest.raises(TypeError, match="float32"):
        qk_norm_rope_step_triton(q, gate, k, v, wq.to(torch.float16), wk, 1e-6, cos, sin, keys, values, pos)
    with pytest.raises(ValueError, match="pos"):
        qk_norm_rope_step_triton(q, gate, k, v, wq, wk, 1e-6, cos, sin, keys, values, pos.int())


@pytest.mark.parametrize("shape", [(3, 5, 200), (7, 96)])
def test_sigmoid_gated_product(shape):
    """glu with sigmoid is transformers' ``o * torch.sigmoid(gate)``; the kernel matches it."""
    gate, up = torch.randn(*shape) * 3, torch.randn(*shape)
    assert torch.equal(glu(gate, up, "sigmoid"), up * torch.sigmoid(gate))
    got = glu_triton(gate.to(DEVICE, DTYPE), up.to(DEVICE, DTYPE), activation="sigmoid")
    want = glu(gate.to(DEVICE, DTYPE), up.to(DEVICE, DTYPE), "sigmoid")
    assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-6 if INTERPRETED else 1e-2)
    if not INTERPRETED:  # the sigmoid rounded to bf16 before the product, as PyTorch rounds it
        assert (got != want).float().mean() < 1e-3
    with pytest.raises(ValueError, match="activation"):
        glu_triton(gate.to(DEVICE, DTYPE), up.to(DEVICE, DTYPE), activation="relu")


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@torch.no_grad()
def test_static_steps_take_the_fused_layer(family, monkeypatch):
    """Decode steps on the static cache run each softmax layer through the spec (on the CPU) and give
    transformers' forward's logits and cache, bit for bit; a step on the dynamic cache does not take it."""
    model = _model(family)
    install(model)
    calls = []
    monkeypatch.setattr(qk_norm_rope, "qk_norm_rope_step",
                        lambda *a, **kw: calls.append(1) or qk_norm_rope_step(*a, **kw))
    gen = torch.Generator().manual_seed(1)
    ids, steps = torch.randint(0, VOCAB, (2, 9), generator=gen), torch.randint(0, VOCAB, (2, 4), generator=gen)
    fused = static_cache(_prefilled(model, ids), 16)
    plain = static_cache(_prefilled(model, ids), 16)
    got = [static_forward(model, steps[:, t:t + 1], fused) for t in range(4)]
    assert len(calls) == 4 * len(fused.kv) > 0
    model(input_ids=steps[:, :1], past_key_values=_prefilled(model, ids), use_cache=True)
    assert len(calls) == 4 * len(fused.kv)
    transformers_forward(model, gated_attention.GATED_ATTENTIONS)
    want = [static_forward(model, steps[:, t:t + 1], plain) for t in range(4)]
    assert len(calls) == 4 * len(fused.kv)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    for i in fused.kv:
        assert torch.equal(fused.kv[i][0], plain.kv[i][0]) and torch.equal(fused.kv[i][1], plain.kv[i][1])


def _prompt_inputs(B, T, Hq, Hkv, D, R, batch_cos, gen, dtype, device="cpu"):
    """A prompt's q and gate interleaved per head as q_proj writes them, k a column slice of a wider projection
    (strided views), the formula weights, cos / sin ``[B or 1, T, R]``."""
    qg = (torch.randn(B, T, Hq, 2 * D, generator=gen) * 2).to(device, dtype)
    kv = (torch.randn(B, T, 2 * Hkv * D + 5, generator=gen) * 2).to(device, dtype)
    k = kv[..., :Hkv * D].view(B, T, Hkv, D)
    wq, wk = ((1.0 + torch.randn(D, generator=gen) * 0.3).to(device) for _ in range(2))
    angles = torch.rand(B if batch_cos else 1, T, R // 2, generator=gen) * 6
    angles = torch.cat([angles, angles], -1)
    return qg[..., :D], qg[..., D:], k, wq, wk, angles.cos().to(device, dtype), angles.sin().to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_spec_is_transformers_modules(dtype):
    """qk_norm_rope_reference gives, bit for bit, what Qwen3NextAttention's ops give a prompt on the CPU: q_norm and
    k_norm, the transposes, apply_rotary_pos_emb (partial), the gate's reshape."""
    from laquant.kernels.attention.qk_norm_rope import qk_norm_rope_reference

    gen = torch.Generator().manual_seed(5)
    q, gate, k, wq, wk, cos, sin = _prompt_inputs(2, 7, 6, 2, 64, 16, True, gen, dtype)
    qn, kn = Qwen3NextRMSNorm(64, eps=1e-6), Qwen3NextRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        qn.weight.copy_(wq - 1.0)
        kn.weight.copy_(wk - 1.0)
        want_q, want_k = apply_rotary_pos_emb(qn(q).transpose(1, 2), kn(k).transpose(1, 2), cos, sin)
    query, key, gate_out = qk_norm_rope_reference(q, gate, k, wq, wk, 1e-6, cos, sin)
    assert torch.equal(query, want_q) and torch.equal(key, want_k) and query.is_contiguous() and key.is_contiguous()
    assert torch.equal(gate_out, gate.reshape(2, 7, -1)) and gate_out.is_contiguous()


@pytest.mark.parametrize("B,T,Hq,Hkv,D,R,batch_cos", [(2, 5, 6, 2, 64, 16, False), (1, 9, 4, 4, 32, 32, True),
                                                      (3, 3, 3, 1, 48, 12, True), (1, 33, 16, 2, 128, 32, False)])
def test_prompt_kernel_matches_the_spec(B, T, Hq, Hkv, D, R, batch_cos):
    """The prompt kernel on strided q / gate / k views, partial rotary, odd head counts and widths, cos per sequence or
    shared: the query and key heads in attention's layout and the gate."""
    from laquant.kernels.attention.qk_norm_rope import qk_norm_rope_reference, qk_norm_rope_triton

    gen = torch.Generator().manual_seed(B + T + D)
    args = _prompt_inputs(B, T, Hq, Hkv, D, R, batch_cos, gen, DTYPE, DEVICE)
    want_q, want_k, want_g = qk_norm_rope_reference(*args[:5], 1e-6, *args[5:])
    got_q, got_k, got_g = qk_norm_rope_triton(*args[:5], 1e-6, *args[5:])
    assert torch.equal(got_g, want_g) and got_q.shape == (B, Hq, T, D) and got_k.shape == (B, Hkv, T, D)
    tol = 1e-6 if INTERPRETED else 1e-2
    assert rel_err(got_q.float().cpu(), want_q.float().cpu()) < tol
    assert rel_err(got_k.float().cpu(), want_k.float().cpu()) < tol
    with pytest.raises(ValueError, match="cos and sin"):
        qk_norm_rope_triton(*args[:5], 1e-6, args[5][:, :1], args[6][:, :1])


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@torch.no_grad()
def test_prompts_take_the_fused_layer(family, monkeypatch):
    """On the GPU (here: the prompt kernel interpreted, the rest on its references) a prompt and eager decode steps on
    the dynamic cache run each gated attention through one q / k kernel around transformers' cache update and
    attention: the logits and the cache's keys are transformers' forward's to float32 rounding."""
    from laquant.adapters import cache_kwargs, new_cache

    if not INTERPRETED:  # the model is on the CPU: the kernel runs here only under the interpreter
        pytest.skip("a CPU check of the GPU path; on a GPU, test_gpu_prompts_match_transformers")
    model = _model(family)
    install(model)
    calls = []
    real = qk_norm_rope.qk_norm_rope_triton
    monkeypatch.setattr(qk_norm_rope, "qk_norm_rope_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(gated_attention, "use_triton", lambda x, state_format=None: True)
    gen = torch.Generator().manual_seed(3)
    ids, steps = torch.randint(0, VOCAB, (2, 9), generator=gen), torch.randint(0, VOCAB, (2, 2), generator=gen)

    def run():
        cache = new_cache(model)
        out = [model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True).logits]
        out += [model(input_ids=steps[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits
                for t in range(2)]
        return torch.cat(out, 1), cache

    got, got_cache = run()
    layers = sum(type(m).__name__ in gated_attention.GATED_ATTENTIONS for m in model.modules())
    assert len(calls) == 3 * layers > 0
    transformers_forward(model, gated_attention.GATED_ATTENTIONS)
    want, want_cache = run()
    assert len(calls) == 3 * layers and rel_err(got, want) < 1e-5
    for a, b in zip(got_cache.layers, want_cache.layers):
        if getattr(b, "keys", None) is not None and b.keys.numel():
            assert rel_err(a.keys, b.keys) < 1e-5 and torch.equal(a.values, b.values)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@torch.no_grad()
def test_gpu_static_steps_match_transformers(family):
    """bf16 on the GPU: the kernels' static steps against transformers' forward on its own static cache:
    the logits agree to bf16's rounding over 6 steps, and the greedy tokens are the same."""
    model = _model(family).to("cuda", torch.bfloat16)
    install(model)
    gen = torch.Generator().manual_seed(2)
    ids, steps = torch.randint(0, VOCAB, (3, 13), generator=gen), torch.randint(0, VOCAB, (3, 6), generator=gen)
    ids, steps = ids.cuda(), steps.cuda()
    fused, plain = static_cache(_prefilled(model, ids), 24), static_cache(_prefilled(model, ids), 24)
    got = [static_forward(model, steps[:, t:t + 1], fused) for t in range(6)]
    transformers_forward(model, gated_attention.GATED_ATTENTIONS)
    want = [static_forward(model, steps[:, t:t + 1], plain) for t in range(6)]
    for g, w in zip(got, want):
        assert rel_err(g.float(), w.float()) < 2e-2
    for i in fused.kv:
        assert rel_err(fused.kv[i][0].float(), plain.kv[i][0].float()) < 2e-2
        assert torch.equal(fused.kv[i][1], plain.kv[i][1])


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
@torch.no_grad()
def test_gpu_prompts_match_transformers(family):
    """bf16 on the GPU: a prompt through the prompt kernel against transformers' forward: the logits and the cached
    keys agree to bf16's rounding, the values equal."""
    from laquant.adapters import cache_kwargs, new_cache

    model = _model(family).to("cuda", torch.bfloat16)
    install(model)
    ids = torch.randint(0, VOCAB, (3, 77), generator=torch.Generator().manual_seed(4)).cuda()

    def run():
        cache = new_cache(model)
        return model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True).logits, cache

    got, got_cache = run()
    transformers_forward(model, gated_attention.GATED_ATTENTIONS)
    want, want_cache = run()
    assert rel_err(got.float(), want.float()) < 2e-2
    for a, b in zip(got_cache.layers, want_cache.layers):
        if getattr(b, "keys", None) is not None and b.keys.numel():
            assert rel_err(a.keys.float(), b.keys.float()) < 2e-2 and torch.equal(a.values, b.values)
