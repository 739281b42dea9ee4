"""Perplexity eval: window bookkeeping, prefill/decode agreement, known answers."""

import math

import pytest
import torch

from laquant.errors import LaquantError
from laquant.eval.ppl import perplexity, strided_windows
from laquant.loading import load_model


@pytest.mark.parametrize("n,context,stride", [(100, 32, 16), (100, 32, 31), (97, 10, 3), (64, 64, 8), (65, 64, 63), (1000, 7, 1)])
def test_every_token_after_the_first_is_scored_once(n, context, stride):
    scored = torch.zeros(n, dtype=torch.long)
    for w in strided_windows(n, context, stride):
        assert w.end - w.begin <= context and w.begin < w.first_target <= w.end
        scored[w.first_target:w.end] += 1
    assert scored[0] == 0 and (scored[1:] == 1).all()


def test_window_errors():
    with pytest.raises(LaquantError, match="longer than the data"):
        strided_windows(10, 32, 16)
    with pytest.raises(LaquantError, match="--stride"):
        strided_windows(100, 32, 32)


@torch.no_grad()
def test_prefill_and_decode_agree(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (300,))
    pre = perplexity(model, ids, context=64, stride=24, mode="prefill", batch_size=3, progress=False)
    dec = perplexity(model, ids, context=64, stride=24, mode="decode", batch_size=5, progress=False)
    assert pre.tokens_scored == dec.tokens_scored == 299
    assert math.isfinite(pre.ppl)
    assert abs(pre.nll - dec.nll) < 1e-5
    assert len(pre.loss_by_position) == 64


@torch.no_grad()
def test_uniform_model_has_perplexity_equal_to_vocab(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    model.lm_head.weight.zero_()  # every logit 0 -> uniform over 8192 tokens
    res = perplexity(model, torch.randint(0, 8192, (200,)), context=50, mode="prefill", progress=False)
    assert res.ppl == pytest.approx(8192, rel=1e-5)


@torch.no_grad()
def test_embedded_model_is_a_language_model():
    """The shipped model beats a unigram model by far, and its two modes agree on real text."""
    from laquant.data import load_text, tokenize

    model, tokenizer = load_model()
    ids = tokenize(load_text("wikitext2"), tokenizer)
    counts = torch.bincount(ids, minlength=model.config.vocab_size).double()
    probs = counts / counts.sum()
    unigram_ppl = math.exp(-(probs[ids[1:]].log()).mean().item())  # unigram fitted on the test text itself
    sample = ids[:1537]
    pre = perplexity(model, sample, context=512, mode="prefill", progress=False)
    dec = perplexity(model, sample, context=512, mode="decode", progress=False)
    assert abs(pre.nll - dec.nll) < 1e-4
    assert pre.ppl < unigram_ppl / 2, (pre.ppl, unigram_ppl)


def test_the_embedded_model_is_named_gla_small_everywhere(tmp_path, monkeypatch):
    from laquant.loading import default_model_dir, resolve_model_dir

    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("gla-small") == resolve_model_dir(None) == default_model_dir()
    (tmp_path / "gla-small").mkdir()  # a local folder of that name wins
    assert resolve_model_dir("gla-small").resolve() == (tmp_path / "gla-small").resolve()


@torch.no_grad()
def test_loss_by_position_all_averages_every_window(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (200,))
    res = perplexity(model, ids, context=40, stride=20, mode="prefill", batch_size=4, progress=False)
    windows = strided_windows(200, 40, 20)
    inputs = torch.stack([ids[w.begin:w.end] for w in windows])
    nll = torch.nn.functional.cross_entropy(model(input_ids=inputs).logits[:, :-1].flatten(0, 1),
                                            inputs[:, 1:].flatten(), reduction="none").view(len(windows), -1)
    assert res.loss_by_position_all[0] == 0.0 and not res.graphed
    assert torch.allclose(torch.tensor(res.loss_by_position_all[1:], dtype=torch.float64), nll.double().mean(0), atol=1e-5)


@pytest.mark.gpu
@torch.no_grad()
def test_graphed_decode_equals_the_eager_loop(tiny_model_dir):
    import laquant.eval.ppl as ppl
    from laquant.kernels.common.state import StateQuantizer

    model, _ = load_model(tiny_model_dir)
    model = model.cuda()
    for m in model.modules():
        if hasattr(m, "state_quantizer"):
            m.state_quantizer = StateQuantizer("fp8_row", 1, rounding="stochastic")
    ids = torch.randint(0, 8192, (700,))
    graphed = perplexity(model, ids, context=128, stride=64, mode="decode", batch_size=4, progress=False)
    make = ppl._GraphedScorer.make
    ppl._GraphedScorer.make = classmethod(lambda cls, *a: None)
    try:
        eager = perplexity(model, ids, context=128, stride=64, mode="decode", batch_size=4, progress=False)
    finally:
        ppl._GraphedScorer.make = make
    assert graphed.graphed and not eager.graphed
    assert graphed.nll == pytest.approx(eager.nll, abs=1e-6)
    assert graphed.loss_by_position_all == pytest.approx(eager.loss_by_position_all, abs=1e-5)
