"""Speculative decoding with prompt lookup (laquant.serving.ngram, ``draft_model="ngram"``, ``laquant generate
--draft ngram``): the proposals of the reference and of the Triton kernel (GPU, or CPU under TRITON_INTERPRET=1)
equal a plain Python lookup, and the output equals plain greedy decoding."""

import random

import pytest
import torch

from laquant.cli import main
from laquant.errors import LaquantError
from laquant.generate import generate, trim_after_eos
from laquant.kernels.common.state import StateQuantizer
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.kernels.ngram.lookup import ngram_lookup_triton
from laquant.kernels.ngram.reference import ngram_lookup_reference
from laquant.serving.ngram import NgramDraft
from laquant.serving.speculative import SpeculativeStats, speculative_continue, speculative_generate

VOCAB = 64


def _gla(seed=1, state="int8_row", **kw):
    torch.manual_seed(seed)
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
    model = GLAForCausalLM(GLAConfig(**{**cfg, **kw})).eval()
    for m in model.modules():
        if hasattr(m, "state_quantizer"):
            m.state_quantizer = StateQuantizer(state, renorm_interval=3, rounding="stochastic")
    return model


def _lookup(seq, k, max_n, min_n):
    """The rule, one row in plain Python: the latest earlier occurrence of the longest matching tail."""
    length = len(seq)
    for n in range(max_n, min_n - 1, -1):
        for s in range(length - n - 1, -1, -1):
            if seq[s:s + n] == seq[length - n:]:
                return [seq[s + n + j % (length - n - s)] for j in range(k)]
    return [seq[-1]] * k


def _on_kernel_device(fn):
    """``fn`` run where the kernel runs (CUDA, else the CPU under the interpreter), the result on the CPU."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return lambda ctx, length, *a, **kw: fn(ctx.to(device), length.to(device), *a, **kw).cpu()


LOOKUPS = [pytest.param(ngram_lookup_reference, id="reference"),
           pytest.param(_on_kernel_device(ngram_lookup_triton), id="triton")]


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_proposals_equal_the_python_lookup(lookup):
    rng = random.Random(0)
    for _ in range(300 if lookup is ngram_lookup_reference else 60):  # (the interpreter is slow)
        B, L, vocab = rng.randint(1, 4), rng.randint(2, 40), rng.choice([2, 3, 5, 50])
        length, k, max_n = rng.randint(1, L), rng.randint(1, 9), rng.randint(1, 5)
        min_n = rng.randint(1, max_n)
        ctx = torch.randint(0, vocab, (B, L), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        got = lookup(ctx, torch.tensor(length), k, max_n, min_n)
        want = torch.tensor([_lookup(ctx[b, :length].tolist(), k, max_n, min_n) for b in range(B)])
        assert torch.equal(got, want), (ctx, length, k, max_n, min_n)


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_proposals_by_hand(lookup):
    ctx = torch.tensor([[5, 1, 2, 3, 1, 2, 3, 1, 2, 9, 9],   # a loop of 3: it goes on past the end
                        [7, 8, 9, 4, 6, 7, 8, 9, 6, 0, 0],   # only "6" occurred before (at 4): what followed it, then again
                        [1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 3]])  # no earlier occurrence of "9": the last token
    assert lookup(ctx, torch.tensor(9), 5).tolist() == [[3, 1, 2, 3, 1], [7, 8, 9, 6, 7], [9] * 5]
    # the longest match wins over a later shorter one: "2 3" (n = 2) at 1, though "3" (n = 1) is also at 5
    longest = torch.tensor([[1, 2, 3, 8, 4, 3, 6, 2, 3]])
    assert lookup(longest, torch.tensor(9), 2, max_ngram=2).tolist() == [[8, 4]]
    assert lookup(longest, torch.tensor(9), 2, max_ngram=1).tolist() == [[6, 2]]
    # an empty context (what a captured round's warm-up looks up in) proposes its first slot, in bounds
    assert lookup(longest, torch.tensor(0), 3).tolist() == [[1, 1, 1]]


@pytest.mark.parametrize("B,k,eos_at", [(1, 4, None), (2, 3, None), (2, 5, 11), (1, 15, None)])
@torch.no_grad()
def test_ngram_speculation_equals_greedy(B, k, eos_at):
    target = _gla()
    ids = torch.randint(1, VOCAB, (B, 4)).repeat(1, 3)  # a prompt that repeats itself
    eos = None if eos_at is None else int(generate(target, ids, 40)[0, 12 + eos_at])
    want = generate(target, ids, 40, eos_token_id=eos)
    stats = SpeculativeStats()
    got = speculative_generate(target, "ngram", ids, 40, num_draft_tokens=k, eos_token_id=eos, stats=stats)
    assert torch.equal(got, want)
    assert stats.proposed > 0
    if B == 1:  # (the rows of a batch advance together: a random model's two rows seldom repeat at once)
        assert stats.accepted > 0 and stats.rounds < got.shape[1] - ids.shape[1]
    assert torch.equal(generate(target, ids, 40, eos_token_id=eos, draft_model=NgramDraft(2, 1),
                                num_draft_tokens=k), want)


@pytest.mark.parametrize("k,B,eos_at", [(3, 1, None), (4, 2, None), (2, 2, 9), (15, 1, None)])
@torch.no_grad()
def test_the_captured_ngram_round_equals_greedy(k, B, eos_at):
    """The round a CUDA graph captures with an n-gram draft, run eagerly on the CPU: the lookup in the
    device-side context, the target's verify, the accept count and its commit; greedy tokens, EOS too."""
    from laquant.generate import _forward, _fresh_cache
    from laquant.serving.speculative import _RoundGraph

    target = _gla(use_short_conv=True)
    ids = torch.randint(1, VOCAB, (B, 3)).repeat(1, 2)
    eos = None if eos_at is None else int(generate(target, ids, 30)[0, 6 + eos_at])
    want = generate(target, ids, 30, eos_token_id=eos)
    logits, tc = _forward(target, ids, _fresh_cache(target))
    rounds = _RoundGraph(target, NgramDraft(), tc, None, k, eos, 32, capture=False, context_room=6 + 32 + k + 2)
    for _ in range(2):  # what a capture's warm-up runs first: rounds on the empty buffers
        rounds._round()
    for _ in range(2):  # a second load replays from the same prefill cache
        stats = SpeculativeStats()
        rounds.load(tc, None, logits.argmax(-1), ids)
        got = trim_after_eos(rounds.run(30, stats, eos_check_every=2), eos)
        assert torch.equal(torch.cat([ids, got], 1), want)
        assert 0 < stats.rounds < 30 and (stats.accepted > 0 or B > 1)
        assert rounds.target.seen_tokens == tc.seen_tokens + int(rounds.pos) - 1
        assert int(rounds.length) == 6 + int(rounds.pos)
        assert torch.equal(rounds.context[:, :int(rounds.length)], torch.cat([ids, rounds.history[:, :int(rounds.pos)]], 1))


@torch.no_grad()
def test_shipped_gla_small_with_ngram_drafts(trained_model_dir):
    """The trained model's greedy text repeats itself, which prompt lookup turns into accepted proposals."""
    from laquant.data import load_text, tokenize
    from laquant.loading import load_model, load_tokenizer

    model, _ = load_model(trained_model_dir)
    ids = tokenize(load_text("wikitext2"), load_tokenizer(trained_model_dir))[:48][None]
    want = generate(model, ids, 96)
    stats = SpeculativeStats()
    assert torch.equal(speculative_generate(model, "ngram", ids, 96, num_draft_tokens=4, stats=stats), want)
    assert stats.tokens_per_round > 1.5, stats


def test_ngram_misuse_is_an_error():
    target = _gla()
    ids = torch.randint(1, VOCAB, (1, 4))
    for bad in (dict(max_ngram=0), dict(max_ngram=2, min_ngram=3), dict(max_ngram=9), dict(max_ngram=2.0)):
        with pytest.raises(LaquantError, match="min_ngram"):
            NgramDraft(**bad)
    with pytest.raises(LaquantError, match="'ngram'"):
        generate(target, ids, 5, draft_model="ngrams")
    with pytest.raises(LaquantError, match="num_draft_tokens"):
        generate(target, ids, 5, draft_model="ngram", num_draft_tokens=16)
    with pytest.raises(LaquantError, match="context"):
        speculative_continue(target, "ngram", target.new_cache(), None, ids[:, 0], 5)


def test_cli_generate_with_ngram_drafts(tiny_model_dir, capsys):
    args = ["generate", str(tiny_model_dir), "--prompt", "Hello Hello Hello", "--max-new-tokens", "12", "--device",
            "cpu", "--no-eos"]
    assert main(args) == 0
    plain = capsys.readouterr().out.split("\n[")[0]
    assert main(args + ["--draft", "ngram", "--draft-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out.split("\n[")[0] == plain and "3 n-gram lookup tokens a round" in out


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "gla_int8"])
@torch.no_grad()
def test_ngram_speculation_on_the_gpu(trained_model_dir, recipe):
    """On the kernels, each round one CUDA graph: the target's greedy tokens up to near-ties (the GEMMs of a
    K-token verify and of a decode step round apart; see test_speculative_on_the_gpu)."""
    import laquant
    from laquant.api import load
    from laquant.data import load_text, tokenize
    from laquant.loading import load_tokenizer
    from test_speculative import _assert_same_up_to_near_ties

    target, _ = load(trained_model_dir, device="cuda", dtype=torch.bfloat16)
    if recipe:
        laquant.calibrate(target, recipe, torch.randint(0, 8192, (4, 256), device="cuda"), progress=False)
    text = tokenize(load_text("wikitext2"), load_tokenizer(trained_model_dir))
    for B in (1, 3):
        ids = torch.stack([text[i * 500:i * 500 + 32] for i in range(B)]).cuda()
        want = generate(target, ids, 96, graphed=False)
        for k, graphed in ((2, None), (4, None), (4, False), (15, None)):
            stats = SpeculativeStats()
            got = speculative_generate(target, "ngram", ids, 96, k, stats=stats, graphed=graphed)
            _assert_same_up_to_near_ties(target, got, want, ids.shape[1], (B, k, graphed))
            assert stats.accepted > 0 and stats.round_graphed == (graphed is None), (B, k, graphed)


def test_serving_replay_with_ngram_drafts_gives_the_greedy_replies(tmp_path):
    """The chat replay's speculative decode with prompt lookup (``SpeculativeDecode("ngram")``, ``laquant eval
    serve --draft ngram``): proposals from each request's tokens, the greedy replies (CPU: exact)."""
    import json
    import shutil

    from laquant.loading import default_model_dir
    from laquant.serving.prefix_cache import PrefixStateCache
    from laquant.serving.replay import SpeculativeDecode, Workload, replay

    model = _gla(vocab_size=97)
    work = Workload(system=70, conversations=2, turns=2, user=8, reply=9)
    greedy = replay(model, work, PrefixStateCache(model, 64))
    spec = SpeculativeDecode("ngram", 4, block_size=64)
    got = replay(model, work, PrefixStateCache(model, 64), spec)
    assert [r["reply"] for r in got] == [r["reply"] for r in greedy]
    assert spec.stats.rounds >= 4 and spec.stats.proposed > 0

    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, folder / name)
    out = tmp_path / "serve"
    assert main(["eval", "serve", str(folder), "--draft", "ngram", "--draft-tokens", "3", "--system", "70",
                 "--conversations", "2", "--turns", "2", "--user", "8", "--reply", "6", "--block-size", "64",
                 "--reps", "1", "--device", "cpu", "--formats", "fp32", "--no-accuracy", "--quiet",
                 "--out", str(out)]) == 0
    res = json.loads((out / "serve.json").read_text())["results"][0]
    assert res["speculation"]["replies_equal_greedy"] and res["speculation"]["rounds"] > 0
    assert res["speculation"]["verify_numerics"] == "decode"
    # the verify steps with numerics "prefill": an fp32 state has no rounding between tokens to skip, the same replies
    assert main(["eval", "serve", str(folder), "--draft", "ngram", "--verify-numerics", "prefill", "--system", "70",
                 "--conversations", "2", "--turns", "1", "--user", "8", "--reply", "6", "--block-size", "64",
                 "--reps", "1", "--device", "cpu", "--formats", "fp32", "--no-accuracy", "--quiet",
                 "--out", str(tmp_path / "serve_prefill")]) == 0
    res = json.loads((tmp_path / "serve_prefill" / "serve.json").read_text())["results"][0]
    assert res["speculation"]["verify_numerics"] == "prefill" and res["speculation"]["replies_equal_greedy"]
