"""laquant's GLA model: fla's checkpoint format, CPU path, prefill/decode agreement, reload."""

import json

import pytest
import torch

from conftest import rel_err
from laquant.errors import LaquantError
from laquant.loading import load_model
from laquant.models import GLAConfig, GLAForCausalLM


def _random_model(**overrides):
    cfg = dict(hidden_size=96, num_hidden_layers=2, num_heads=3, vocab_size=300)
    cfg.update(overrides)
    model = GLAForCausalLM(GLAConfig(**cfg)).eval()
    # make the gates and norms non-trivial so a bug in either shows up
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in name else 0.0))
    return model


@torch.no_grad()
@pytest.mark.parametrize("overrides", [{}, {"num_kv_heads": 1}, {"clamp_min": -0.05}])
def test_decode_token_by_token_equals_prefill(overrides):
    model = _random_model(**overrides)
    ids = torch.randint(0, 300, (2, 41))
    full = model(input_ids=ids).logits
    cache = model.new_cache()
    steps = torch.cat([model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
                       for t in range(41)], 1)
    assert rel_err(steps, full) < 1e-5
    assert cache.seen_tokens == 41
    assert cache.state_bytes() == 2 * 2 * 3 * 16 * 32 * 4  # layers * B * H * K * V * fp32


@torch.no_grad()
def test_chunked_prefill_then_continue_with_cache():
    model = _random_model()
    ids = torch.randint(0, 300, (1, 90))
    full = model(input_ids=ids).logits
    out = model(input_ids=ids[:, :53], use_cache=True)
    rest = model(input_ids=ids[:, 53:], past_key_values=out.past_key_values, use_cache=True).logits
    assert rel_err(torch.cat([out.logits, rest], 1), full) < 1e-5


@torch.no_grad()
def test_the_cache_under_either_name():
    """``cache`` (transformers' name from 5.24 on) and ``past_key_values`` (before) are the same argument; the
    output's cache is under the installed transformers' field."""
    from laquant.adapters import cache_kwargs, returned_cache

    model = _random_model()
    ids = torch.randint(0, 300, (1, 30))
    full = model(input_ids=ids).logits
    a, b = model.new_cache(), model.new_cache()
    out_a = model(input_ids=ids[:, :17], cache=a, use_cache=True)
    out_b = model(input_ids=ids[:, :17], past_key_values=b, use_cache=True)
    assert returned_cache(out_a) is a and returned_cache(out_b) is b
    rest_a = model(input_ids=ids[:, 17:], **cache_kwargs(model, a), use_cache=True).logits
    rest_b = model(input_ids=ids[:, 17:], past_key_values=b, use_cache=True).logits
    assert torch.equal(rest_a, rest_b) and rel_err(torch.cat([out_a.logits, rest_a], 1), full) < 1e-5
    assert cache_kwargs(model, a) == {"cache": a}
    with pytest.raises(ValueError, match="two caches"):
        model(input_ids=ids, cache=model.new_cache(), past_key_values=model.new_cache())


@torch.no_grad()
def test_transformers_generate_feeds_one_new_token_a_step():
    """transformers' generate hands the cache back under its own name (``cache`` from 5.24 on): the model
    must take it, or every step recomputes the whole sequence from a fresh state (same tokens, quadratic
    time; it did with transformers 5.24)."""
    model = _random_model()
    ids = torch.randint(0, 300, (2, 7))
    lengths = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
                                           with_kwargs=True)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    hook.remove()
    assert lengths == [7, 1, 1, 1, 1]
    ref = ids
    for _ in range(5):
        ref = torch.cat([ref, model(input_ids=ref).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(out, ref)


def test_parameter_names_follow_fla():
    names = set(_random_model().state_dict())
    for expected in ["model.embeddings.weight", "model.layers.0.attn_norm.weight", "model.layers.0.attn.q_proj.weight",
                     "model.layers.0.attn.gk_proj.0.weight", "model.layers.0.attn.gk_proj.1.bias",
                     "model.layers.0.attn.g_norm_swish_gate.weight", "model.layers.0.mlp.gate_proj.weight",
                     "model.layers.0.mlp_norm.weight", "model.norm.weight", "lm_head.weight"]:
        assert expected in names


def test_loss_is_shifted_cross_entropy():
    model = _random_model()
    ids = torch.randint(0, 300, (2, 17))
    out = model(input_ids=ids, labels=ids)
    ref = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 300), ids[:, 1:].reshape(-1))
    assert torch.allclose(out.loss, ref)


@torch.no_grad()
def test_save_and_reload_through_transformers(tmp_path, tiny_model_dir):
    """save_pretrained writes a checkpoint that laquant's loader and transformers' Auto classes both
    read back to the same logits, with the config it was given."""
    import shutil

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    import laquant  # noqa: F401  (registers model_type "gla")

    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (1, 25))
    logits = model(input_ids=ids).logits
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, saved / name)
    written = json.loads((saved / "config.json").read_text())
    assert written["model_type"] == "gla" and written["architectures"] == ["GLAForCausalLM"]
    assert {k: written[k] for k in ("hidden_size", "num_hidden_layers", "num_heads", "vocab_size")} == \
        {"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 2, "vocab_size": 8192}
    weights, state = load_file(saved / "model.safetensors"), model.state_dict()
    assert weights.keys() == state.keys() and all(torch.equal(weights[k], state[k]) for k in state)

    reloaded, _ = load_model(saved)
    auto = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    assert type(auto).__name__ == "GLAForCausalLM"
    assert torch.equal(reloaded(input_ids=ids).logits, logits)
    assert torch.equal(auto(input_ids=ids).logits, logits)


def test_unsupported_fla_options_are_refused(tmp_path, tiny_model_dir):
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["attnres_block_size"] = 2  # fla's attention residuals (every other fla 0.6 GLA option is supported)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LaquantError, match="attnres_block_size"):
        load_model(tmp_path / "m")


@torch.no_grad()
@pytest.mark.parametrize("recipe", [None, "gla_int8"])
def test_generate_equals_the_greedy_decode_loop(tiny_model_dir, recipe):
    import laquant

    model, _ = load_model(tiny_model_dir)
    if recipe is not None:
        laquant.calibrate(model, recipe, torch.randint(0, 8192, (2, 96)), progress=False)
    ids = torch.randint(0, 8192, (2, 9))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False)
    cache, tokens = model.new_cache(), [ids]
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
    for _ in range(7):
        tokens.append(logits.argmax(-1, keepdim=True))
        logits = model(input_ids=tokens[-1], past_key_values=cache, use_cache=True).logits[:, -1]
    assert torch.equal(out, torch.cat(tokens, 1))


def _padded_mask(ids: torch.Tensor, side: str) -> torch.Tensor:
    mask = torch.ones_like(ids)
    if side == "left":
        mask[0, :4], mask[2, :1] = 0, 0
    else:
        mask[0, -4:], mask[2, -1:] = 0, 0
    return mask


def _delta_model():
    from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    cfg = GatedDeltaNetConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16, expand_v=1.5,
                              num_v_heads=4, vocab_size=300)
    return GatedDeltaNetForCausalLM(cfg).eval()


@torch.no_grad()
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("make", [lambda: _random_model(), lambda: _random_model(use_short_conv=True),
                                  _delta_model], ids=["gla", "gla-conv", "gated-deltanet"])
def test_a_padded_batch_runs_as_each_sequence_alone(make, side):
    """A batch padded on either side (``attention_mask``): each sequence's logits at its tokens, and the state and
    short-conv inputs it leaves in the cache, are those of the sequence alone (the padding is no token: zero keys,
    log-decays and conv inputs); without the mask they are not."""
    torch.manual_seed(0)
    model = make()
    ids = torch.randint(1, 300, (3, 11))
    mask = _padded_mask(ids, side)
    cache = model.new_cache()
    logits = model(ids, attention_mask=mask, cache=cache, use_cache=True).logits
    assert cache.token_mask is None  # the padding was this call's only
    unmasked = model.new_cache()
    model(ids, cache=unmasked, use_cache=True)
    for row in range(3):
        real = mask[row].bool()
        alone_cache = model.new_cache()
        alone = model(ids[row:row + 1, real], cache=alone_cache, use_cache=True).logits[0]
        assert rel_err(logits[row, real], alone) < 1e-5
        for mine, theirs in zip(cache.states, alone_cache.states):
            assert rel_err(mine.load()[row], theirs.load()[0]) < 1e-5
        for key in cache.conv:
            assert rel_err(cache.conv[key][row], alone_cache.conv[key][0]) < 1e-5
        if row == 0:  # the mask is not a no-op: unmasked, the padding enters the state
            assert rel_err(unmasked.states[0].load()[row], alone_cache.states[0].load()[0]) > 1e-3
    torch.testing.assert_close(model(ids, attention_mask=mask).logits, logits)  # a cacheless call too


@torch.no_grad()
def test_hf_generate_on_a_left_padded_batch_gives_each_sequence_its_own_tokens():
    torch.manual_seed(0)
    model = _random_model(use_short_conv=True, bos_token_id=0, eos_token_id=0)
    ids = torch.randint(1, 300, (3, 9))
    mask = _padded_mask(ids, "left")
    out = model.generate(ids.masked_fill(mask == 0, 0), attention_mask=mask, max_new_tokens=6, do_sample=False,
                         pad_token_id=0)
    for row in range(3):
        alone = model.generate(ids[row:row + 1, mask[row].bool()], max_new_tokens=6, do_sample=False)
        assert torch.equal(out[row, -6:], alone[0, -6:])


@torch.no_grad()
def test_a_padding_mask_that_cannot_be_honoured_is_an_error():
    model = _random_model()
    ids = torch.randint(1, 300, (2, 6))
    holes = torch.tensor([[1, 0, 1, 1, 1, 1], [1] * 6])
    with pytest.raises(ValueError, match="before or after its tokens"):
        model(ids, attention_mask=holes)
    cache = model.new_cache()
    model(ids, cache=cache, use_cache=True)
    left = torch.tensor([[0] * 8 + [1] * 4, [1] * 12])
    with pytest.raises(ValueError, match="must start the sequences"):
        model(ids, attention_mask=left, cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(ids, attention_mask=left[:, :3])
    model(ids, attention_mask=torch.ones(2, 6, dtype=torch.long))  # all ones: no padding
    hybrid = _random_model(attn={"layers": [1], "num_heads": 3})
    with pytest.raises(ValueError, match="softmax attn layers"):
        hybrid(ids, attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]))


@pytest.mark.parametrize("recipe,affine", [(None, True), ("gla_int8_all", True), ("gla_int8_all", False)])
@torch.no_grad()
def test_decode_steps_apply_the_output_norm_in_the_decode_kernel(recipe, affine, monkeypatch):
    """The GPU wiring, on the CPU under Triton's interpreter (float32): a decode step on the kernels runs GLA's
    gated output norm inside the decode kernel (with ``o_proj``'s codes where it is W8A8, which the GEMM then
    takes), and its logits and state equal those of the step that runs the norm's own kernel after it (a norm
    without a weight too: ``elementwise_affine`` off)."""
    from conftest import INTERPRETED, require_triton_kernels

    if not INTERPRETED:
        pytest.skip("checks the wiring under TRITON_INTERPRET=1 (the GPU tests cover CUDA)")
    require_triton_kernels()
    import laquant
    from laquant.kernels.gla import decode
    from laquant.models import gla, recurrent
    from laquant.quant import fused, modules

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=128,
                                     elementwise_affine=affine)).eval()
    if recipe is not None:
        laquant.calibrate(model, recipe, torch.randint(0, 128, (2, 32)), progress=False)
    monkeypatch.setattr(recurrent, "FUSED_CODES_MIN_BATCH", 2)
    for module in (gla, recurrent, fused, modules):
        monkeypatch.setattr(module, "use_triton", lambda x, fmt=None: not x.requires_grad)
    calls = []
    step = decode.gla_decode_step
    monkeypatch.setattr(decode, "gla_decode_step",
                        lambda *a, **kw: calls.append((kw.get("norm") is not None, kw.get("packed") is not None))
                        or step(*a, **kw))
    ids = torch.randint(0, 128, (2, 5))

    def decode_two(fused_norm: bool):
        monkeypatch.setattr(recurrent, "FUSED_OUTPUT_NORM", fused_norm)
        cache = model.new_cache(seed=3)
        model(ids, past_key_values=cache, use_cache=True)
        logits = [model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(2)]
        return torch.cat(logits, 1), cache

    unfused, unfused_cache = decode_two(False)
    assert calls == [(False, False)] * 4
    calls.clear()
    logits, cache = decode_two(True)
    assert calls == [(True, recipe is not None)] * 4  # 2 layers x 2 steps, codes for a W8A8 o_proj
    assert torch.equal(logits, unfused)
    for a, b in zip(cache.states, unfused_cache.states):
        assert torch.equal(a.data, b.data)
    if recipe is not None:  # fewer sequences than FUSED_CODES_MIN_BATCH: the norm's own kernel writes the codes
        monkeypatch.setattr(recurrent, "FUSED_CODES_MIN_BATCH", 3)
        calls.clear()
        assert torch.equal(decode_two(True)[0], unfused) and calls == [(False, False)] * 4


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "gla_int8_all"])
@torch.no_grad()
def test_gpu_decode_steps_apply_the_output_norm_in_the_decode_kernel(recipe, monkeypatch):
    """On CUDA (bf16): the decode steps with the output norm in the decode kernel against the steps running the
    norm's own kernel; the same state, logits within the bf16 rounding of the norm's sum of squares, which the
    decode kernel may group differently."""
    import laquant
    from laquant.kernels.gla import decode
    from laquant.models import recurrent

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=256, num_hidden_layers=2, num_heads=2, vocab_size=512)).eval()
    if recipe is not None:  # calibrated in float32, then cast: the scales stay float32
        laquant.calibrate(model, recipe, torch.randint(0, 512, (2, 64)), progress=False)
    model = model.cuda().to(torch.bfloat16)
    monkeypatch.setattr(recurrent, "FUSED_CODES_MIN_BATCH", 1)
    calls = []
    step = decode.gla_decode_step
    monkeypatch.setattr(decode, "gla_decode_step",
                        lambda *a, **kw: calls.append(kw.get("packed") is not None) or step(*a, **kw))
    ids = torch.randint(0, 512, (3, 9), device="cuda")

    def decode_steps(fused_norm: bool):
        monkeypatch.setattr(recurrent, "FUSED_OUTPUT_NORM", fused_norm)
        cache = model.new_cache(seed=3)
        model(ids[:, :5], past_key_values=cache, use_cache=True)
        logits = [model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(5, 9)]
        return torch.cat(logits, 1).float(), cache

    unfused, unfused_cache = decode_steps(False)
    calls.clear()
    logits, cache = decode_steps(True)
    assert calls == [recipe is not None] * 8
    assert torch.isfinite(logits).all() and rel_err(logits, unfused) < 2e-2
    for a, b in zip(cache.states, unfused_cache.states):
        assert (a.data.float() - b.data.float()).abs().max() <= (1 if recipe else 0.05)


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_from_pretrained_in_bf16_decodes_on_the_kernels(tmp_path):
    """A gla_int8_all checkpoint loaded by transformers in bf16 runs on the kernels (its gate kernels take the
    calibrated bounds and scales as float32: loaded as bf16 they failed to compile) and gives the logits of the model
    it was saved from, cast the same way."""
    from transformers import AutoModelForCausalLM

    import laquant

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=256, num_hidden_layers=2, num_heads=2, vocab_size=512)).eval()
    result = laquant.calibrate(model, "gla_int8_all", torch.randint(0, 512, (2, 64)), progress=False)
    laquant.save(result, tmp_path / "ckpt")
    want = model.cuda().to(torch.bfloat16)
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 512, (2, 9), device="cuda")
    caches = [m.new_cache(seed=1) for m in (want, got)]
    for m, cache in zip((want, got), caches):
        m(ids[:, :6], past_key_values=cache, use_cache=True)
    for i in range(6, 9):
        a, b = (m(ids[:, i:i + 1], past_key_values=c, use_cache=True).logits for m, c in zip((want, got), caches))
        assert torch.isfinite(b).all() and torch.equal(a, b)
