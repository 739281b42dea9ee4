"""A layer's gate as a branch of the captured decode step (laquant.models.side_stream): forked only
under capture, the same outputs bit for bit."""

import pytest
import torch

import laquant.models.side_stream as side_stream
from laquant.models import GLAConfig, GLAForCausalLM


def test_outside_a_capture_the_work_runs_in_order():
    x = torch.randn(3, 5)
    branch = side_stream.fork(lambda t, s: t * s, x, 2.0)
    assert not side_stream.forks(x)
    assert torch.equal(branch.join(), x * 2.0)
    assert branch.join() is branch.join()


def _spy(monkeypatch):
    calls = []
    real = side_stream.forks

    def counting(x):
        calls.append(real(x))
        return calls[-1]

    monkeypatch.setattr(side_stream, "forks", counting)
    return calls


# ------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_a_captured_fork_runs_on_the_side_stream():
    x = torch.randn(64, 300, device="cuda")
    w = torch.randn(300, 17, device="cuda")
    seen = {}

    def step():
        def gate(t):
            seen["stream"] = torch.cuda.current_stream()
            return torch.sigmoid(t @ w)

        branch = side_stream.fork(gate, x)
        main = (x * 3).sum(-1, keepdim=True)
        return main + branch.join()

    from laquant.generate import capture_graph, warm_up_outside_capture

    warm_up_outside_capture(step)
    graph, out = capture_graph(step)
    assert seen["stream"] != torch.cuda.current_stream()  # the last call was the capture's
    for _ in range(2):
        x.normal_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, (x * 3).sum(-1, keepdim=True) + torch.sigmoid(x @ w))


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_graphed_gla_decodes_the_same_with_and_without_the_branch(monkeypatch):
    import laquant
    from laquant.generate import generate, release_graphs

    torch.manual_seed(0)
    cfg = GLAConfig(hidden_size=256, num_hidden_layers=3, num_heads=2, vocab_size=4096, bos_token_id=0, eos_token_id=0)
    with torch.device("cuda"):
        model = GLAForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    laquant.calibrate(model, "gla_int8_all", torch.randint(0, 4096, (4, 256), device="cuda"), progress=False)
    ids = torch.randint(1, 4096, (5, 19), device="cuda")
    calls = _spy(monkeypatch)
    got = generate(model, ids, 12)
    assert calls.count(True) == cfg.num_hidden_layers  # one fork per layer, in the capture only
    release_graphs(model)
    monkeypatch.setenv("LAQUANT_SIDE_STREAM", "0")
    calls.clear()
    want = generate(model, ids, 12)
    assert True not in calls
    assert torch.equal(got, want)
    assert torch.equal(want, generate(model, ids, 12, graphed=False))
    release_graphs(model)
