"""`laquant eval lm-eval`: lm-evaluation-harness on a laquant checkpoint and its base model, on a
local loglikelihood_rolling task (no download), checked against the log-likelihood computed here."""

import json
import math

import pytest
import torch

import laquant
from laquant.cli import main

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")

DOCS = ["The river rose through the night, and by morning the lower fields were under water.",
        "She counted the coins twice, then wrote the total in the margin of the ledger and closed it."]


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    torch.manual_seed(7)
    model, tok = laquant.load_model(tiny_model_dir)
    out = tmp_path_factory.mktemp("lm-eval") / "q"
    laquant.save(laquant.calibrate(model, "gla_int8", torch.randint(0, 8192, (2, 96)), progress=False), out,
                 tokenizer=tok)
    return out


@torch.no_grad()
def _log_likelihood(model_dir, dtype):
    """Each document scored whole after lm-eval's prefix token (BOS, else EOS), as loglikelihood_rolling does."""
    model, tok = laquant.load(model_dir, dtype=dtype)
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    total = 0.0
    for doc in DOCS:
        ids = tok(doc, add_special_tokens=False)["input_ids"]
        logits = model(input_ids=torch.tensor([[prefix] + ids[:-1]])).logits[0]
        total += torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None]).sum().item()
    return total


@pytest.mark.slow
def test_lm_eval_on_a_checkpoint_and_its_base(checkpoint, tiny_model_dir, tmp_path, capsys):
    text = tmp_path / "docs.txt"
    text.write_text("\n\n".join(DOCS) + "\n")
    out = tmp_path / "results.json"
    assert main(["eval", "lm-eval", str(checkpoint), "--baseline", str(tiny_model_dir), "--text", str(text),
                 "--dtype", "float32", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| laquant_text" in printed and "byte_perplexity" in printed
    result = json.loads(out.read_text())
    assert result["dtype"] == "float32" and result["versions"]["lm_eval"]
    base_params = laquant.load_model(tiny_model_dir)[0].num_parameters()
    n_bytes = sum(len(d.encode()) for d in DOCS)
    n_words = sum(len(d.split()) for d in DOCS)
    for label, model_dir in (("model", checkpoint), ("baseline", tiny_model_dir)):
        row = result["models"][label]
        assert row["model_num_parameters"] == base_params, label  # the int8 weights count
        assert row["model_dtype"] == "torch.float32"
        metrics = row["results"]["laquant_text"]
        ll = _log_likelihood(model_dir, torch.float32)
        assert math.isclose(metrics["byte_perplexity"], math.exp(-ll / n_bytes), rel_tol=1e-4), label
        assert math.isclose(metrics["word_perplexity"], math.exp(-ll / n_words), rel_tol=1e-4), label
        assert math.isclose(metrics["bits_per_byte"], -ll / n_bytes / math.log(2), rel_tol=1e-4), label
    assert result["models"]["model"]["results"] != result["models"]["baseline"]["results"]


def test_both_models_compute_in_the_base_models_dtype_by_default(checkpoint, tiny_model_dir):
    from laquant.eval.harness import dtype_for

    assert dtype_for("auto", checkpoint) == dtype_for("auto", tiny_model_dir) == torch.bfloat16
    assert dtype_for("float32", checkpoint) == torch.float32


@pytest.mark.parametrize("argv,message", [
    ([], "name at least one task"),
    (["--text", "{missing}"], "text file not found"),
    pytest.param(["--tasks", "no_such_task_anywhere"], "lm-eval has no task 'no_such_task_anywhere'",
                 marks=pytest.mark.slow),  # lm-eval indexes all its tasks to look: seconds
])
def test_bad_input_is_one_line(checkpoint, tmp_path, capsys, argv, message):
    argv = [a.replace("{missing}", str(tmp_path / "nope.txt")) for a in argv]
    assert main(["eval", "lm-eval", str(checkpoint), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_graphed_scoring_of_a_hybrid_replays_lm_evals_calls(tmp_path, monkeypatch):
    """``evaluate(..., graphed=True)`` on a transformers hybrid with laquant's mixers: lm-eval's calls reach the
    graphed forward and replay (on the CPU through the static tensors, the capture skipped), with the eager scores."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_static_hybrid import _installed

    from laquant.eval.harness import TEXT_TASK, evaluate, task_manager, text_task
    from laquant.loading import load_tokenizer
    from laquant.paths import default_model_dir
    from laquant.serving import graphed_forward

    monkeypatch.setattr(graphed_forward, "_on_graph_device", lambda t: True)
    replays = []
    replay = graphed_forward._Capture.replay
    monkeypatch.setattr(graphed_forward._Capture, "replay", lambda self, ids: replays.append(ids.shape) or
                        replay(self, ids))
    (tmp_path / "docs.txt").write_text("\n\n".join(DOCS) + "\n")
    manager = task_manager([TEXT_TASK], [text_task(tmp_path / "docs.txt", tmp_path / "task")])
    model, tok = _installed("qwen3_next").eval(), load_tokenizer(default_model_dir())
    eager = evaluate(model, tok, [TEXT_TASK], manager)
    assert not replays
    graphed = evaluate(model, tok, [TEXT_TASK], manager, graphed=True)
    assert len(replays) == len(DOCS)
    for metric, value in eager["results"][TEXT_TASK].items():
        assert math.isclose(graphed["results"][TEXT_TASK][metric], value, rel_tol=1e-5), metric
    assert "laquant_graph_forward" not in model.__dict__ and graphed_forward._GRAPHS not in model.__dict__
    assert "laquant_graph_prefill" not in model.__dict__  # on for the call only (generation tasks' prefills)
    model.laquant_graph_prefill = False
    evaluate(model, tok, [TEXT_TASK], manager, graphed=True)
    assert model.laquant_graph_prefill is False


@torch.no_grad()
def test_lm_evals_batched_generation_equals_one_prompt_at_a_time(checkpoint):
    """lm-eval's generate_until left-pads a batch of prompts for transformers' generate: on a laquant checkpoint each
    prompt gets the text it gets alone (until 2026-12-04 laquant's GLA refused a padded batch)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model, tok = laquant.load(checkpoint)
    prompts = ["The river rose", "She counted the coins twice, then wrote", "A"]
    requests = [Instance(request_type="generate_until", doc={}, idx=i,
                         arguments=(p, {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": False}))
                for i, p in enumerate(prompts)]
    outputs = {}
    for batch_size in (3, 1):
        lm = HFLM(pretrained=model, tokenizer=tok, backend="causal", batch_size=batch_size)
        outputs[batch_size] = lm.generate_until(requests)
    assert outputs[3] == outputs[1] and all(outputs[1])
