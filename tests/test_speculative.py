"""The model-level verify step with commit (laquant.models.verify) and greedy speculative decoding
(laquant.serving.speculative, ``generate(draft_model=...)``, ``laquant generate --draft``): the same
tokens as plain greedy decoding of the target, and a cache left as plain decoding leaves it."""

import math

import pytest
import torch

from laquant.cli import main
from laquant.errors import LaquantError
from laquant.generate import generate, trim_after_eos
from laquant.kernels.common.state import StateQuantizer
from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, GLAConfig, GLAForCausalLM
from laquant.models.verify import commit, verify
from laquant.serving.speculative import SpeculativeStats, parting_gaps, speculative_generate

VOCAB = 256


def _gla(seed=1, state=None, **kw):
    torch.manual_seed(seed)
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
    return _with_state(GLAForCausalLM(GLAConfig(**{**cfg, **kw})).eval(), state)


def _delta(seed=1, state=None):
    torch.manual_seed(seed)
    cfg = GatedDeltaNetConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16, expand_v=1.5,
                              num_v_heads=4, vocab_size=VOCAB, attn={"layers": [1], "num_heads": 2})
    return _with_state(GatedDeltaNetForCausalLM(cfg).eval(), state)


def _with_state(model, state):
    """The mixers' states stored as ``state`` ("int8_row" / "fp8_row": stochastically rounded, renormalised every 3 stores)."""
    if state is not None:
        for m in model.modules():
            if hasattr(m, "state_quantizer"):
                m.state_quantizer = StateQuantizer(state, renorm_interval=3, rounding="stochastic")
    return model


def _states(cache):
    return [(s.data.clone(), None if s.scale is None else s.scale.clone(), s.n_stores) if s is not None else None
            for s in cache.states]


def _assert_same_cache(a, b, exact):
    assert a.seen_tokens == b.seen_tokens
    for sa, sb in zip(_states(a), _states(b)):
        if sa is None:
            assert sb is None
            continue
        assert sa[2] == sb[2]  # store counts
        if exact:
            assert torch.equal(sa[0].view(torch.uint8), sb[0].view(torch.uint8))
            assert sa[1] is None or torch.equal(sa[1], sb[1])
        else:
            fa = sa[0].float() * (sa[1] if sa[1] is not None else 1)
            fb = sb[0].float() * (sb[1] if sb[1] is not None else 1)
            assert (fa - fb).norm() <= 1e-3 * fb.norm()
    assert a.conv.keys() == b.conv.keys() and a.kv.keys() == b.kv.keys()

    def close(x, y):  # inputs of a batch-variant GEMM: a bf16 one may round a K/V element one ulp apart
        if exact:
            return torch.equal(x, y)
        tol = 2e-2 if x.dtype == torch.bfloat16 else 1e-5
        return torch.allclose(x.float(), y.float(), rtol=tol, atol=tol)

    for key in a.conv:
        assert close(a.conv[key], b.conv[key])
    for key in a.kv:
        assert all(close(x, y) for x, y in zip(a.kv[key], b.kv[key]))


@pytest.mark.parametrize("make,dtype,state", [(_gla, torch.bfloat16, None), (_gla, torch.bfloat16, "int8_row"),
                                              (_gla, torch.float32, "fp8_row"), (_delta, torch.float32, "int8_row"),
                                              (_delta, torch.bfloat16, None)])
@torch.no_grad()
def test_verify_then_commit_equals_decode_steps(make, dtype, state):
    model = make(state=state).to(dtype)
    ids = torch.randint(1, VOCAB, (2, 7))
    new = torch.randint(1, VOCAB, (2, 5))
    for n in (0, 2, 5):
        plain = model(input_ids=ids, use_cache=True).past_key_values
        logits = []
        for t in range(n):
            logits.append(model(input_ids=new[:, t:t + 1], past_key_values=plain, use_cache=True).logits[:, -1])
        spec = model(input_ids=ids, use_cache=True).past_key_values
        before = _states(spec)
        out = verify(model, new, spec)
        assert out.shape == (2, 5, VOCAB) and torch.isfinite(out.float()).all()
        for a, b in zip(before, _states(spec)):  # the states wait for the commit
            assert (a is None) == (b is None) and (a is None or (torch.equal(a[0], b[0]) and a[2] == b[2]))
        for t, want in enumerate(logits):
            assert torch.allclose(out[:, t].float(), want.float(), atol=2e-2 if dtype == torch.bfloat16 else 1e-4)
        commit(spec, n)
        # the mixers' commits are bit-identical to decode steps for the same inputs (test_verify); whether their
        # inputs are depends on the rest of the model being batch-invariant: on the CPU, GLA in bf16 is (the
        # GEMMs are; fp32 GEMMs and the delta rule's gate transcendentals, vectorised by length, are not)
        _assert_same_cache(spec, plain, exact=dtype == torch.bfloat16 and make is _gla)
        # and decoding goes on alike
        a = model(input_ids=new[:, :1], past_key_values=spec, use_cache=True).logits
        b = model(input_ids=new[:, :1], past_key_values=plain, use_cache=True).logits
        assert torch.allclose(a.float(), b.float(), atol=2e-2 if dtype == torch.bfloat16 else 1e-4)


@pytest.mark.parametrize("make,dtype,state", [(lambda **kw: _gla(use_short_conv=True, **kw), torch.bfloat16,
                                               "int8_row"),
                                              (lambda **kw: _gla(**kw), torch.float32, "fp8_row"),
                                              (lambda **kw: _gla(**kw), torch.bfloat16, None)])
@torch.no_grad()
def test_commit_on_a_static_cache_takes_device_counts(make, dtype, state):
    """What a captured speculative round does: verify on a static cache, commit a count tensor (no host
    read), the store counter moving on the device; the same states, conv inputs and counts as an
    ordinary cache committing the same count as an int."""
    model = make(state=state).to(dtype)
    ids, new = torch.randint(1, VOCAB, (2, 7)), torch.randint(1, VOCAB, (2, 5))
    for n, as_tensor in ((0, torch.tensor(0)), (3, torch.tensor([3], dtype=torch.int32)), (5, torch.tensor(5))):
        plain = model(input_ids=ids, use_cache=True).past_key_values
        static = plain.static_copy()
        want = verify(model, new, plain)
        commit(plain, n)
        got = verify(model, new, static)
        assert torch.equal(got, want)
        commit(static, as_tensor)
        assert static.pending is None and static.slots.n_stores.tolist() == [1 + n] * 2
        assert static.sync_counters() == n
        _assert_same_cache(static, plain, exact=True)
        a = model(input_ids=new[:, :1], past_key_values=static, use_cache=True).logits  # a decode step goes on alike
        b = model(input_ids=new[:, :1], past_key_values=plain, use_cache=True).logits
        assert torch.equal(a, b)
        static.sync_counters()
        _assert_same_cache(static, plain, exact=True)
    verify(model, new, plain)
    with pytest.raises(LaquantError, match="static cache only"):
        commit(plain, torch.tensor(1))
    verify(model, new, static)
    with pytest.raises(LaquantError, match="one-element integer tensor"):
        commit(static, torch.tensor([1, 1]))


def test_verify_rejects_misuse():
    model = _gla()
    cache = model.new_cache()
    with torch.no_grad():
        with pytest.raises(LaquantError, match="prefilled"):
            verify(model, torch.ones(1, 3, dtype=torch.long), cache)
        model(input_ids=torch.ones(1, 3, dtype=torch.long), past_key_values=cache, use_cache=True)
        with pytest.raises(LaquantError, match="1 to 16 tokens"):
            verify(model, torch.ones(1, 17, dtype=torch.long), cache)
        with pytest.raises(LaquantError, match="no verify step"):
            commit(cache, 1)
        verify(model, torch.ones(1, 3, dtype=torch.long), cache)
        with pytest.raises(LaquantError, match="pending"):
            verify(model, torch.ones(1, 3, dtype=torch.long), cache)
        with pytest.raises(LaquantError, match="0..3"):
            commit(cache, 4)


@pytest.mark.parametrize("target,draft,k,B", [
    (lambda: _gla(), lambda: _gla(seed=7), 3, 1),  # an unrelated draft: few proposals accepted
    (lambda: _gla(state="int8_row"), lambda: _gla(), 4, 2),  # its own fp32-state form: most accepted
    (lambda: _gla(state="fp8_row").to(torch.bfloat16), lambda: _gla().to(torch.bfloat16), 15, 1),
    (lambda: _delta(state="int8_row"), lambda: _gla(), 2, 2),  # another family with a short conv and an attn layer
])
@torch.no_grad()
def test_speculative_equals_greedy(target, draft, k, B):
    target, draft = target(), draft()
    ids = torch.randint(1, VOCAB, (B, 6))
    want = generate(target, ids, 23)
    stats = SpeculativeStats()
    got = speculative_generate(target, draft, ids, 23, num_draft_tokens=k, stats=stats)
    assert torch.equal(got, want)
    assert stats.rounds < 23 and stats.proposed > 0
    assert torch.equal(generate(target, ids, 23, draft_model=draft, num_draft_tokens=k), want)


@torch.no_grad()
def test_speculative_with_eos_and_a_perfect_draft():
    target = _gla(state="int8_row")
    ids = torch.randint(1, VOCAB, (2, 5))
    free = generate(target, ids, 30)
    eos = int(free[0, 5 + 4])
    want = generate(target, ids, 30, eos_token_id=eos)
    stats = SpeculativeStats()
    got = speculative_generate(target, target, ids, 30, num_draft_tokens=5, eos_token_id=eos, stats=stats)
    assert torch.equal(got, want)
    assert stats.accepted == stats.proposed  # the target drafting for itself: every proposal accepted


@torch.no_grad()
def test_shipped_gla_small_drafts_for_its_quantized_form(trained_model_dir):
    import laquant
    from laquant.loading import load_model

    draft, _ = load_model(trained_model_dir)
    target, _ = load_model(trained_model_dir)
    data = torch.randint(0, target.config.vocab_size, (2, 128), generator=torch.Generator().manual_seed(0))
    laquant.calibrate(target, "gla_int8", data, progress=False)  # int8 weights, int8 stochastically rounded state
    assert any(m.state_quantizer.stochastic for m in target.modules() if hasattr(m, "state_quantizer"))
    ids = torch.randint(1, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    want = generate(target, ids, 40)
    stats = SpeculativeStats()
    got = speculative_generate(target, draft, ids, 40, num_draft_tokens=4, stats=stats)
    # greedy up to near-ties: the CPU's float32 GEMMs round a verify step's rows apart from a decode step's row (the
    # 2026-12-04 state rounding parts these 40 tokens at position 49, logits 8.63876 / 8.63862)
    _assert_same_up_to_near_ties(target, got, want, ids.shape[1], "gla-small drafting for its gla_int8 form")
    assert stats.acceptance > 0.5  # the unquantized model is a good draft for its quantized form


@pytest.mark.parametrize("k,B,eos_at", [(3, 1, None), (4, 2, None), (2, 2, 9), (15, 1, None)])
@torch.no_grad()
def test_the_captured_round_equals_greedy(k, B, eos_at):
    """The round a CUDA graph captures (laquant.serving.speculative._RoundGraph), run eagerly on the CPU:
    the draft's steps on the scratch cache, the target's verify, the accept count and both commits on the
    device, the batches of rounds that cannot overshoot; the target's greedy tokens, with EOS too."""
    from laquant.generate import _forward, _fresh_cache
    from laquant.serving.speculative import _RoundGraph

    target, draft = _gla(state="int8_row", use_short_conv=True), _gla()
    ids = torch.randint(1, VOCAB, (B, 6))
    eos = None if eos_at is None else int(generate(target, ids, 30)[0, 6 + eos_at])
    want = generate(target, ids, 30, eos_token_id=eos)
    logits, tc = _forward(target, ids, _fresh_cache(target))
    _, dc = _forward(draft, ids, _fresh_cache(draft))
    rounds = _RoundGraph(target, draft, tc, dc, k, eos, 32, capture=False)
    for _ in range(2):  # a second load replays from the same prefill caches
        stats = SpeculativeStats()
        rounds.load(tc, dc, logits.argmax(-1))
        got = trim_after_eos(rounds.run(30, stats, eos_check_every=2), eos)
        assert torch.equal(torch.cat([ids, got], 1), want)
        assert stats.round_graphed and 0 < stats.rounds < 30 and stats.proposed == k * stats.rounds
        assert rounds.target.seen_tokens == tc.seen_tokens + int(rounds.pos) - 1
    perfect = _RoundGraph(target, target, tc, tc, k, eos, 32, capture=False)  # the target drafting for itself
    stats = SpeculativeStats()
    perfect.load(tc, tc, logits.argmax(-1))
    assert torch.equal(torch.cat([ids, trim_after_eos(perfect.run(30, stats, 2), eos)], 1), want)
    assert stats.accepted == stats.proposed


def _rounds_run_eagerly(monkeypatch, built: list):
    """The graphed path on the CPU: every model graphable, each round built (``built`` records whether autograd
    was on) with ``capture=False``, so its rounds run eagerly, as the captured graph would replay them."""
    import laquant.generate
    import laquant.serving.speculative as spec

    class Eager(spec._RoundGraph):
        def __init__(self, *args, **kw):
            built.append(torch.is_grad_enabled())
            super().__init__(*args, **{**kw, "capture": False})

    monkeypatch.setattr(laquant.generate, "is_graphable", lambda model: True)
    monkeypatch.setattr(spec, "_RoundGraph", Eager)


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_the_round_is_built_without_autograd(monkeypatch, draft):
    """Called with autograd on and weights that require gradients (as a loaded model's do), the round is
    still warmed up and captured without it: with it, the model ran the differentiable references instead
    of the kernels, which a CUDA graph cannot capture, and ``laquant eval serve --draft`` ran every round
    eagerly on the GPU."""
    target = _gla()
    assert all(p.requires_grad for p in target.parameters()) and torch.is_grad_enabled()
    ids = torch.randint(1, VOCAB, (2, 6))
    with torch.no_grad():
        want = generate(target, ids, 20)
    built = []
    _rounds_run_eagerly(monkeypatch, built)
    stats = SpeculativeStats()
    got = speculative_generate(target, "ngram" if draft == "ngram" else _gla(seed=2), ids, 20, 3, stats=stats)
    assert built == [False] and stats.round_graphed
    assert torch.equal(got, want)


def test_a_round_built_under_inference_mode_serves_later_calls(monkeypatch):
    """The round a call under ``torch.inference_mode()`` builds (kept with the target) holds normal tensors:
    a later call without inference mode loads its caches into them in place (it raised before)."""
    target = _gla()
    ids = torch.randint(1, VOCAB, (2, 6))
    with torch.no_grad():
        want = generate(target, ids, 20)
    built = []
    _rounds_run_eagerly(monkeypatch, built)
    with torch.inference_mode():
        first = speculative_generate(target, "ngram", ids, 20, 3)
    second = speculative_generate(target, "ngram", ids, 20, 3)
    assert len(built) == 1  # the second call replayed the first call's round
    assert torch.equal(first, want) and torch.equal(second, want)


@torch.no_grad()
def test_a_target_holding_its_round_is_freed_by_del():
    """The target keeps its captured rounds in its __dict__; the round holds it weakly (no reference cycle:
    ``del`` frees its weights without the garbage collector) and the draft, whose weights it reads, strongly."""
    import gc
    import weakref

    from laquant.generate import _forward, _fresh_cache
    from laquant.serving.speculative import _RoundGraph

    target, draft = _gla(), _gla()
    ids = torch.randint(1, VOCAB, (1, 6))
    _, tc = _forward(target, ids, _fresh_cache(target))
    _, dc = _forward(draft, ids, _fresh_cache(draft))
    rounds = _RoundGraph(target, draft, tc, dc, 2, None, 16, capture=False)
    assert rounds.model is target
    target.__dict__.setdefault("_laquant_decode_graphs", {})["round"] = rounds
    refs = weakref.ref(target), weakref.ref(draft)
    del rounds, tc, dc
    gc.disable()
    try:
        del target, draft
        assert refs[0]() is None and refs[1]() is None
    finally:
        gc.enable()


def test_bad_draft_is_an_error():
    target = _gla()
    ids = torch.randint(1, VOCAB, (1, 4))
    with pytest.raises(LaquantError, match="vocabulary"):
        generate(target, ids, 5, draft_model=_gla(vocab_size=VOCAB * 2))
    for k in (0, 16, 2.5):
        with pytest.raises(LaquantError, match="num_draft_tokens"):
            generate(target, ids, 5, draft_model=_gla(), num_draft_tokens=k)
    with pytest.raises(LaquantError, match="greedy only"):
        generate(target, ids, 5, draft_model=_gla(), do_sample=True)


def test_cli_generate_with_a_draft(tiny_model_dir, capsys):
    assert main(["generate", str(tiny_model_dir), "--prompt", "Hello", "--max-new-tokens", "6", "--device", "cpu",
                 "--no-eos"]) == 0
    plain = capsys.readouterr().out.split("\n[")[0]
    assert main(["generate", str(tiny_model_dir), "--prompt", "Hello", "--max-new-tokens", "6", "--device", "cpu",
                 "--no-eos", "--draft", str(tiny_model_dir), "--draft-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out.split("\n[")[0] == plain and "speculative" in out
    assert main(["generate", "--prompt", "x", "--draft-tokens", "3"]) == 2
    assert "--draft-tokens needs --draft" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--draft", str(tiny_model_dir), "--draft-tokens", "16"]) == 2
    assert "--draft-tokens must be in 1..15, got 16" in capsys.readouterr().err
    from laquant.cli.generate import MAX_DRAFT_TOKENS as CLI_MAX
    from laquant.serving.speculative import MAX_DRAFT_TOKENS

    assert CLI_MAX == MAX_DRAFT_TOKENS


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "gla_int8"])
@torch.no_grad()
def test_speculative_on_the_gpu(trained_model_dir, recipe):
    """On the kernels: the shipped model drafting for its quantized form gives the target's greedy tokens,
    graphed or eager, up to near-ties: the GEMMs of a K-token verify and of a decode step take other
    tiles (another M) and round apart, so where the target's two best logits are within that rounding
    the runs may part (on an H100, gla_int8 with random prompts did at B = 3); the first token where
    they part must be such a tie."""
    import laquant
    from laquant.api import load

    draft, _ = load(trained_model_dir, device="cuda", dtype=torch.bfloat16)
    target, _ = load(trained_model_dir, device="cuda", dtype=torch.bfloat16)
    if recipe:
        laquant.calibrate(target, recipe, torch.randint(0, 8192, (4, 256), device="cuda"), progress=False)
    gen = torch.Generator().manual_seed(3)
    for B in (1, 3):
        ids = torch.randint(1, 8192, (B, 16), generator=gen).cuda()
        want = generate(target, ids, 64, graphed=False)
        assert torch.equal(generate(target, ids, 64), want)
        for k, graphed in ((1, None), (4, None), (4, False), (15, None)):
            stats = SpeculativeStats()
            got = speculative_generate(target, draft, ids, 64, k, stats=stats, graphed=graphed)
            _assert_same_up_to_near_ties(target, got, want, ids.shape[1], (B, k, graphed))
            assert stats.accepted > 0 and stats.round_graphed == (graphed is None), (B, k, graphed)
        # the verify steps holding the state in float32 between the tokens: near-ties of the 8-bit state's rounding,
        # which moves the logits more than the GEMMs' tiles do (on an H200 a row parted at a gap of 1.03%)
        got = speculative_generate(target, draft, ids, 64, 4, verify_numerics="prefill")
        _assert_same_up_to_near_ties(target, got, want, ids.shape[1], (B, "prefill"), rel_gap=3e-2)


@pytest.mark.gpu
def test_speculative_rounds_graph_with_autograd_on(trained_model_dir):
    """Called as a user would, without ``torch.no_grad()``, on a loaded model (its weights require
    gradients): the rounds are CUDA graphs (they ran eagerly before), with the greedy tokens."""
    from laquant.api import load

    target, _ = load(trained_model_dir, device="cuda", dtype=torch.bfloat16)
    assert torch.is_grad_enabled() and any(p.requires_grad for p in target.parameters())
    ids = torch.randint(1, 8192, (2, 16), generator=torch.Generator().manual_seed(5)).cuda()
    with torch.no_grad():
        want = generate(target, ids, 48)
    stats = SpeculativeStats()
    got = speculative_generate(target, "ngram", ids, 48, 4, stats=stats)
    assert stats.round_graphed
    with torch.no_grad():
        _assert_same_up_to_near_ties(target, got, want, ids.shape[1], "ngram")


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_a_draft_with_attn_layers_proposes_from_its_graph():
    """Models with fla softmax attn layers: a round is not one graph (its verify's attention takes several tokens:
    graphable_cache), but the draft's proposals replay its captured one-token decode step (they ran eagerly
    before); float32, the tokens are plain greedy decoding's."""
    attn = {"layers": [1], "num_heads": 2}
    target, draft = _gla(state="int8_row", attn=attn).cuda(), _gla(seed=2, attn=attn).cuda()
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4)).cuda()
    want = generate(target, ids, 23)
    stats = SpeculativeStats()
    got = speculative_generate(target, draft, ids, 23, num_draft_tokens=4, stats=stats)
    assert stats.draft_graphed and not stats.round_graphed
    _assert_same_up_to_near_ties(target, got, want, ids.shape[1], "attn")


@torch.no_grad()
def test_a_draft_whose_cache_cannot_be_static_proposes_eagerly():
    """A draft of softmax attn layers only has no state for a static cache: its proposals are not captured (False:
    the eager proposals), not an error out of speculative decoding."""
    from laquant.serving.speculative import _propose_graphed

    draft = _gla(attn={"layers": [0, 1], "num_heads": 2})
    out = draft(torch.randint(1, VOCAB, (2, 5)), use_cache=True)
    assert _propose_graphed(draft, out.past_key_values, [out.logits[:, -1].argmax(-1)], 3) is False


@torch.no_grad()
def test_parting_gaps_names_each_parted_row():
    """parting_gaps: per parted row, the first position where it parts and the target's logit gap of the two
    tokens there over its largest logit (the measure the GPU tests and bench_verify hold speculative output to)."""
    target = _gla()
    want = generate(target, torch.randint(1, VOCAB, (3, 6)), 6)
    got = want.clone()
    got[1, 8] = (want[1, 8] + 1) % VOCAB
    got[2, 0] = (want[2, 0] + 1) % VOCAB
    logits = target(want[1:2, :8]).logits[0, -1].float()
    gap = float((logits[want[1, 8]] - logits[got[1, 8]]).abs() / logits.abs().max())
    assert list(parting_gaps(target, got, want)) == [(1, 8, pytest.approx(gap)), (2, 0, math.inf)]
    assert gap > 0 and next(parting_gaps(target, want, want), None) is None


def _assert_same_up_to_near_ties(model, got, want, prompt_len, what, rel_gap=1e-2):
    """``got == want`` row by row, or the first token where a row parts is one whose two candidates'
    logits (the target's, on ``want``'s prefix) differ by at most ``rel_gap`` of the largest logit."""
    assert got.shape == want.shape, what
    for b, p, gap in parting_gaps(model, got, want):
        assert p >= prompt_len, what
        assert gap <= rel_gap, (what, b, p, gap)


@pytest.mark.parametrize("make,state", [(_gla, "int8_row"), (_delta, "int8_row"), (_gla, None)])
@torch.no_grad()
def test_verify_with_prefill_numerics_commits_as_decode_steps(make, state):
    """numerics="prefill": the first position's logits are the decode numerics' (the stored state), the later
    ones differ by the state format's rounding (not at all for fp32). The commit stores each mixer's state as its
    decode steps would from the inputs it saw: the first mixer's as plain decoding's, bit for bit, the later ones'
    from inputs that the float32 states below them changed a little (as a prefill's would)."""
    model = make(state=state).to(torch.bfloat16)
    ids, new = torch.randint(1, VOCAB, (2, 7)), torch.randint(1, VOCAB, (2, 5))
    exact_cache = model(input_ids=ids, use_cache=True).past_key_values
    exact = verify(model, new, exact_cache)
    commit(exact_cache, 3)
    cache = model(input_ids=ids, use_cache=True).past_key_values
    fast = verify(model, new, cache, numerics="prefill")
    assert torch.isfinite(fast.float()).all()
    assert torch.equal(fast[:, 0], exact[:, 0])
    assert torch.equal(fast, exact) == (state is None)
    assert torch.allclose(fast.float(), exact.float(), atol=0.1)
    commit(cache, 3)
    if state is None:
        _assert_same_cache(cache, exact_cache, exact=True)
    assert cache.seen_tokens == exact_cache.seen_tokens
    states = [(a, b) for a, b in zip(_states(cache), _states(exact_cache)) if a is not None]
    assert torch.equal(states[0][0][0], states[0][1][0])  # the first mixer's inputs are the same
    for (data, scale, n), (want, want_scale, want_n) in states[1:]:
        got, ref = data.float() * (1 if scale is None else scale), want.float() * (1 if want_scale is None else
                                                                                   want_scale)
        assert n == want_n and (got - ref).norm() <= 3e-2 * ref.norm()
    with pytest.raises(LaquantError, match="numerics must be one of"):
        verify(model, new, cache, numerics="chunk")


@pytest.mark.parametrize("state", ["int8_row", None])
@torch.no_grad()
def test_speculative_with_prefill_numerics(state):
    """verify_numerics="prefill": plain greedy decoding's tokens up to near-ties (exactly with an fp32 state)."""
    target, draft = _gla(state=state), _gla()
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    want = generate(target, ids, 23)
    stats = SpeculativeStats()
    got = speculative_generate(target, draft, ids, 23, num_draft_tokens=4, stats=stats, verify_numerics="prefill")
    assert stats.accepted > 0
    if state is None:
        assert torch.equal(got, want)
    # where a row parts, its two tokens' logits were within the state's rounding: a code step of the int8 state is
    # 1/127 of its row's absmax, and this random model's logits lie close together (the trained model's on the GPU:
    # within 3% in test_speculative_on_the_gpu, a row parted at 1.03% on an H200)
    _assert_same_up_to_near_ties(target, got, want, ids.shape[1], state, rel_gap=5e-2)
    assert torch.equal(generate(target, ids, 23, draft_model=draft, verify_numerics="prefill"), got)
    with pytest.raises(LaquantError, match="verify_numerics"):
        speculative_generate(target, draft, ids, 4, verify_numerics="exact")


def test_cli_generate_verify_numerics(tiny_model_dir, capsys):
    args = ["generate", str(tiny_model_dir), "--prompt", "Hello", "--max-new-tokens", "6", "--device", "cpu",
            "--no-eos"]
    assert main([*args, "--draft", str(tiny_model_dir), "--verify-numerics", "prefill"]) == 0
    assert "speculative" in capsys.readouterr().out
    assert main([*args, "--verify-numerics", "prefill"]) == 2  # without --draft
    assert "--verify-numerics needs --draft" in capsys.readouterr().err
