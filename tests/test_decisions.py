"""Typed decisions and their handlers; statistics that do not depend on the recipe."""

import json

import pytest
import torch

import laquant
from laquant.adapters import get_adapter
from laquant.calibration.run import calibration_batches, collect_stats
from laquant.decisions import Decisions, ExpertsDecision, GateDecision, ProjectionDecision, StateDecision
from laquant.errors import LaquantError
from laquant.quantize import handler_for, plan
from laquant.recipe import load_recipe

# as laquant 0.1 wrote them into config.json (before the decisions were typed)
WRITTEN = {
    "projections": {
        "model.layers.0.attn.q_proj": {"format": "int8", "outliers": [3, 17], "weight_granularity": "per_channel",
                                       "act_granularity": "per_token"},
        "model.layers.3.self_attn.k_proj": {"format": "int8", "outliers": [], "weight_granularity": "per_tensor",
                                            "act_granularity": "per_tensor", "role": "softmax_attention"},
    },
    "gates": {
        "model.layers.0.attn.gk_proj": {"format": "int8", "weight_granularity": "per_channel",
                                        "scaling": "per_channel", "clamp": True, "n_channels": 64,
                                        "channel_start": None},
        "model.layers.0.mamba.in_proj": {"format": "int8", "weight_granularity": "per_channel",
                                         "scaling": "per_tensor", "clamp": False, "n_channels": 4,
                                         "channel_start": 320},
    },
    "state": {"model.layers.0.attn": {"format": "fp8_row", "renorm_interval": 0}},
}


def test_decisions_round_trip_the_json_a_checkpoint_holds():
    decisions = Decisions.from_dict(WRITTEN)
    # keys, values and key order; a state decision written before prefill_roundtrip existed rounded
    # the state at every prefill chunk, and now says so; one written before rounding existed rounded
    # to nearest
    expected = json.loads(json.dumps(WRITTEN))
    expected["state"]["model.layers.0.attn"]["prefill_roundtrip"] = True
    expected["state"]["model.layers.0.attn"]["rounding"] = "nearest"
    assert json.dumps(decisions.to_dict()) == json.dumps(expected)
    assert json.dumps(Decisions.from_dict(expected).to_dict()) == json.dumps(expected)
    q = decisions.projections["model.layers.3.self_attn.k_proj"]
    assert isinstance(q, ProjectionDecision) and q.role == "softmax_attention" and q.outliers == []
    gate = decisions.gates["model.layers.0.mamba.in_proj"]
    assert isinstance(gate, GateDecision) and (gate.channel_start, gate.n_channels, gate.clamp) == (320, 4, False)
    assert decisions.state["model.layers.0.attn"] == StateDecision("fp8_row", 0, prefill_roundtrip=True)
    # read as the JSON they stand for, as Calibrated.decisions was
    assert set(decisions) == {"projections", "gates", "state"}
    assert decisions["projections"]["model.layers.0.attn.q_proj"]["outliers"] == [3, 17]
    assert decisions["projections"]["model.layers.0.attn.q_proj"].get("role") is None
    assert [n for n, _ in decisions.every_module()] == [*WRITTEN["projections"], *WRITTEN["gates"], *WRITTEN["state"]]


def test_experts_decisions_round_trip_and_appear_only_where_there_are_some():
    experts = {"model.layers.1.mlp.experts": {"format": "int8", "weight_granularity": "per_channel",
                                              "activation": "silu", "gated": True, "limit": 7.0}}
    written = {**WRITTEN, "experts": experts}
    decisions = Decisions.from_dict(written)
    assert decisions.experts["model.layers.1.mlp.experts"] == ExpertsDecision("silu", True, 7.0)
    assert json.dumps(Decisions.from_dict(decisions.to_dict()).to_dict()) == json.dumps(decisions.to_dict())
    assert decisions.to_dict()["experts"] == experts and list(decisions)[-1] == "experts"
    assert [n for n, _ in decisions.every_module()][-1] == "model.layers.1.mlp.experts"
    assert "experts" not in Decisions.from_dict(WRITTEN).to_dict()


def test_an_unknown_decision_kind_has_no_handler():
    with pytest.raises(LaquantError, match="no quantization handler for a dict; known: ProjectionDecision"):
        handler_for({"format": "int8"})


@torch.no_grad()
def test_statistics_serve_any_threshold_and_plans_do_not_depend_on_it(tiny_model_dir):
    model, _ = laquant.load_model(tiny_model_dir)
    adapter = get_adapter(model)
    batches = calibration_batches(torch.randint(0, 8192, (4000,)), samples=2, seq_len=128, seed=0)
    stats = collect_stats(model, adapter, batches, segment=64, progress=False)
    name = "model.layers.0.attn.q_proj"
    x = torch.cat([b for b in _inputs(model, name, batches)]).abs()
    for threshold in (0.25, 0.5, 1.5, 6.0):
        expected = (x > threshold).double().mean(0).float()
        assert torch.allclose(stats.over_threshold(name, threshold), expected, atol=1e-7)
    with pytest.raises(LaquantError, match="not above 0.7"):
        stats.over_threshold(name, 0.7)
    no_limit = "projections.outlier_max_fraction=null"  # a random model's q_proj has many inputs above 3
    low = plan(adapter, stats, load_recipe("gla_int8", ["projections.outlier_threshold=3.0", no_limit]))
    high = plan(adapter, stats, load_recipe("gla_int8", [no_limit]))
    absmax = stats.get(name, "act_absmax")
    assert low.projections[name].outliers == (absmax > 3.0).nonzero().flatten().tolist()
    assert high.projections[name].outliers == (absmax > 6.0).nonzero().flatten().tolist()
    assert "threshold" not in stats.meta  # nothing in the statistics depends on the recipe


def _inputs(model, name, batches):
    """What ``name`` reads when ``batches`` run in segments of 64 tokens with the state carried."""
    seen = []
    handle = model.get_submodule(name).register_forward_pre_hook(lambda m, a: seen.append(a[0].reshape(-1, 64)))
    try:
        for b in batches:
            cache = model.new_cache()
            for start in range(0, b.shape[0], 64):
                model(input_ids=b[None, start:start + 64], past_key_values=cache, use_cache=True)
    finally:
        handle.remove()
    return seen


def test_stochastic_state_decision_round_trips():
    d = StateDecision("int8_row", 1, False, "stochastic")
    assert StateDecision.from_dict(json.loads(json.dumps(d.to_dict()))) == d
