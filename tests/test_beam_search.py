"""transformers' beam search (generate with num_beams > 1) on laquant's models: between steps it reorders the
cache's batch rows, and laquant's recurrent states, kept beside transformers' cache (a hybrid's) or as the cache
(laquant's GLA), follow. Before, a hybrid's beams went on from other beams' states: silently other tokens than
transformers' own model gave."""

import copy

import pytest
import torch
from test_hybrid import FAMILIES, _model

import laquant.models.graphed_step as gs
from laquant.adapters import install
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.models.cache import reorder_rows

BEAMS = dict(do_sample=False, num_beams=3, pad_token_id=0)


def _sequence_log_probs(model, sequences, prompt_len):
    """The summed log-probabilities of each sequence's new tokens, from one forward over the whole sequence."""
    logits = model(sequences).logits[:, prompt_len - 1:-1].float().log_softmax(-1)
    return logits.gather(-1, sequences[:, prompt_len:, None]).squeeze(-1).sum(-1)


def _beams(model, ids, new_tokens):
    return model.generate(ids, **BEAMS, max_new_tokens=new_tokens, attention_mask=torch.ones_like(ids),
                          num_return_sequences=3, length_penalty=0.0, output_scores=True, return_dict_in_generate=True)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@torch.no_grad()
def test_beam_search_on_a_hybrid_scores_its_sequences(family):
    """Every family with laquant's mixers (float32; the vision-language ones on text): each returned beam's score
    is its tokens' log-probability under one forward over the whole sequence (a beam that went on from another
    beam's state scores apart; transformers' own MiniMax does, by 0.043 here, its cache's linear states not
    following the beams)."""
    model = _model(family)
    install(model)
    ids = torch.randint(1, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    out = _beams(model, ids, 8)
    torch.testing.assert_close(out.sequences_scores, _sequence_log_probs(model, out.sequences, 7), atol=1e-4,
                               rtol=1e-4)


@torch.no_grad()
def test_beam_search_on_qwen3_next_is_transformers():
    """The beams transformers' own model finds (qwen3_next, whose cache reorders its own linear states)."""
    original = _model("qwen3_next")
    model = copy.deepcopy(original)
    install(model)
    ids = torch.randint(1, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_beams(model, ids, 8).sequences, _beams(original, ids, 8).sequences)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-steps"])
@pytest.mark.parametrize("attn", [None, [{"layers": [1], "num_heads": 2}]], ids=["recurrent", "attn-layer"])
@torch.no_grad()
def test_beam_search_on_laquant_gla_scores_its_sequences(attn, graphs, monkeypatch):
    """laquant's GLA (its cache reorders its states, conv inputs and attn keys): each returned beam's score is
    its tokens' log-probability under one forward over the whole sequence, which fails where a beam went on
    from another's state; the graph steps (the CPU stand-in) find the same beams."""
    monkeypatch.setattr(gs, "_on_graph_device", lambda t: graphs)
    torch.manual_seed(1)
    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=3, num_heads=2, vocab_size=256,
                                     use_short_conv=True, attn=attn, bos_token_id=0, eos_token_id=0)).eval()
    ids = torch.randint(1, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids, **BEAMS, max_new_tokens=7, num_return_sequences=3, length_penalty=0.0,
                         output_scores=True, return_dict_in_generate=True)
    want = _sequence_log_probs(model, out.sequences, ids.shape[1])
    torch.testing.assert_close(out.sequences_scores, want, atol=1e-4, rtol=1e-4)
    assert ("_laquant_step_graphs" in model.__dict__) == graphs


@torch.no_grad()
def test_beam_search_on_a_quantized_hybrid_with_graph_steps(monkeypatch):
    """hybrid_int8 (8-bit states, int8 projections) qwen3_next: the graph steps (the CPU stand-in) hold the
    static states when beam search reorders the cache; the cache lets them go and the next step adopts it
    again: the eager steps' beams."""
    import laquant

    from laquant.recipe import load_recipe

    model = _model("qwen3_next")
    laquant.calibrate(model, load_recipe("hybrid_int8"), torch.randint(1, 8000, (2, 32)), progress=False)
    ids = torch.randint(1, 100, (2, 7), generator=torch.Generator().manual_seed(0))
    kw = dict(BEAMS, max_new_tokens=6, attention_mask=torch.ones_like(ids))
    model.laquant_graph_steps = False
    want = model.generate(ids, **kw)
    model.laquant_graph_steps = True
    monkeypatch.setattr(gs, "_on_graph_device", lambda t: True)
    assert torch.equal(model.generate(ids, **kw), want)
    assert any(isinstance(g, gs.StepGraph) for g in model.__dict__["_laquant_step_graphs"].values())


def test_a_static_copy_is_not_reordered():
    from laquant.generate import static_cache

    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=256)).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(1, 256, (2, 5)), cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="fixed batch"):
        reorder_rows(static_cache(cache, 16), torch.tensor([1, 0]))
