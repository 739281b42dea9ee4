"""Recipes: every shipped one validates; bad ones fail with the key and the allowed values."""

import pytest

from laquant.errors import LaquantError
from laquant.recipe import available_recipes, load_recipe


def test_every_shipped_recipe_validates():
    names = available_recipes()
    assert {"gla_int8", "gla_w8a8", "gla_w8a8_naive", "gla_fp8_state", "gla_fp8_state_naive",
            "gla_bf16_state", "gla_gates_int8", "gla_gates_naive"} <= set(names)
    for name in names:
        recipe = load_recipe(name)
        assert recipe["name"] == name and set(recipe) >= {"projections", "gates", "state", "keep"}


def test_gla_int8_is_what_the_design_says():
    r = load_recipe("gla_int8")
    assert r["projections"] == {"format": "int8", "weight_granularity": "per_channel", "act_granularity": "per_token",
                                "outlier_threshold": 6.0, "outlier_top_k": None, "outlier_max_fraction": 0.25,
                                "outlier_fallback": "keep", "output_act_granularity": None}
    assert r["gates"]["scaling"] == "per_channel" and r["gates"]["clamp"] is True
    # the state is stored in int8 (per-row scales, stochastically rounded) between calls and decode
    # steps; a prefill keeps it float32 inside. The fp8 form it had before is gla_int8_fp8.
    assert r["state"] == {"format": "int8_row", "renorm_interval": 1, "prefill_roundtrip": False,
                          "rounding": "stochastic"}
    assert load_recipe("gla_int8_fp8")["state"]["format"] == "fp8_row"
    assert r["keep"] == ["embeddings", "norms", "lm_head"]


def test_overrides():
    r = load_recipe("gla_int8", ["state.format=fp32", "state.rounding=nearest", "projections.outlier_threshold=null",
                                 "gates.clamp=false"])
    assert r["state"]["format"] == "fp32" and r["projections"]["outlier_threshold"] is None
    assert r["gates"]["clamp"] is False


def test_keep_override_names_the_roles_kept_in_high_precision():
    """``--set keep=...`` (comma-separated or a YAML list) replaces the recipe's keep: lm_head quantized too."""
    assert load_recipe("gla_int8_all", ["keep=embeddings,norms"])["keep"] == ["embeddings", "norms"]
    assert load_recipe("gla_int8_all", ["keep=[embeddings, norms, lm_head]"])["keep"] == ["embeddings", "norms",
                                                                                          "lm_head"]
    assert load_recipe("hybrid_int8", ["keep=embeddings, norms, routers, experts"])["keep"] == [
        "embeddings", "norms", "routers", "experts"]


@pytest.mark.parametrize("overrides,message", [
    (["keep=embeddings,norms,head"], "keep must be a list of roles from: embeddings, norms, lm_head"),
    (["keep=norms,lm_head"], "keep must include embeddings: laquant does not quantize them"),
    (["keep="], "keep must be a list of roles from"),
    (["state.format=fp4"], "state.format = 'fp4' is not allowed; allowed: fp32, bf16, fp8_row"),
    (["state.renorm=2"], "unknown key state.renorm; allowed: format, renorm_interval, prefill_roundtrip, rounding"),
    (["state.rounding=up"], "state.rounding = 'up' is not allowed; allowed: nearest, stochastic"),
    (["state.format=bf16", "state.rounding=stochastic"], "stochastic applies to the scaled state formats"),
    (["projections.outlier_threshold=-3"], "a number > 0, or null"),
    (["projections.outlier_top_k=2.5"], "an integer > 0, or null"),
    (["projections.outlier_max_fraction=1.5"], "a number in (0, 1], or null"),
    (["projections.outlier_max_fraction=0"], "a number in (0, 1], or null"),
    (["gates.clamp=yes please"], "gates.clamp = 'yes please' is not allowed; allowed: True, False"),
    (["state.renorm_interval=-1"], "an integer >= 0"),
    (["statefmt"], "expected SECTION.FIELD=VALUE"),
])
def test_bad_fields_are_named(overrides, message):
    with pytest.raises(LaquantError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_recipe("gla_int8", overrides)


def test_bad_files(tmp_path):
    with pytest.raises(LaquantError, match="unknown recipe 'nope'; available: .*gla_int8"):
        load_recipe("nope")
    (tmp_path / "r.yaml").write_text("name: r\nprojection: {format: int8}\n")
    with pytest.raises(LaquantError, match="unknown key 'projection'"):
        load_recipe(str(tmp_path / "r.yaml"))
    (tmp_path / "k.yaml").write_text("keep: [lm_head]\n")
    with pytest.raises(LaquantError, match="keep must include embeddings, norms"):
        load_recipe(str(tmp_path / "k.yaml"))
    (tmp_path / "y.yaml").write_text("state: [unclosed\n")
    with pytest.raises(LaquantError, match="not valid YAML"):
        load_recipe(str(tmp_path / "y.yaml"))


def test_family_defaults(tmp_path):
    from laquant.recipe import for_family

    r = load_recipe("hybrid_int8")
    assert for_family(r, "minimax")["gates"]["format"] == "keep"
    assert for_family(r, "qwen3_next")["gates"]["format"] == "int8"
    assert for_family(r, "gla")["softmax_attention"]["format"] == "keep"
    assert for_family(r, "bamba")["families"] == {}
    # an explicit --set beats a family default
    assert for_family(load_recipe("hybrid_int8", ["gates.format=int8"]), "minimax")["gates"]["format"] == "int8"
    (tmp_path / "f.yaml").write_text("families: {llama: {gates: {format: keep}}}\n")
    with pytest.raises(LaquantError, match="families.llama: unknown model_type; known: gla, qwen3_next"):
        load_recipe(str(tmp_path / "f.yaml"))
    (tmp_path / "g.yaml").write_text("families: {minimax: {keep: [norms]}}\n")
    with pytest.raises(LaquantError, match="families.minimax may only override the sections"):
        load_recipe(str(tmp_path / "g.yaml"))
    (tmp_path / "h.yaml").write_text("families: {bamba: {state: {format: fp4}}}\n")
    with pytest.raises(LaquantError, match=r"\(families.bamba\): state.format = 'fp4' is not allowed"):
        load_recipe(str(tmp_path / "h.yaml"))
