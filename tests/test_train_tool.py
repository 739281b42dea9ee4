"""tools/train.py's transformers hybrids (tiny sizes, CPU): built with laquant's mixers, trainable
through them (the gradient reaches each mixer's decay parameters), and the loss falls."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from laquant.adapters import get_adapter

spec = importlib.util.spec_from_file_location("train_tool", Path(__file__).parents[1] / "tools" / "train.py")
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)


@pytest.mark.parametrize("arch", ["qwen3_next", "kimi_linear", "nemotron_h"])
def test_a_tiny_hybrid_trains_on_laquants_mixers(arch):
    model = train.build_model("tiny", 512, 0, "laquant", arch)
    adapter = get_adapter(model)
    mixers = [adapter.module(n) for n in adapter.mixers()]
    assert mixers and all(isinstance(m, adapter.mixer_class) for m in mixers)
    assert adapter.attention_layers(), "the hybrid has softmax-attention layers"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 512, (2, 48))
    losses = []
    for step in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if step == 0:
            decay = [p for m in mixers for name in m.DECAY for p in [m.get_parameter(name)]]
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in decay)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5, losses


def test_sizes_are_defined_for_every_arch():
    assert set(train.ARCH_SIZES) == set(train.ARCHS)
    assert all("small" in sizes and "tiny" in sizes for sizes in train.ARCH_SIZES.values())


def test_a_training_text_subset_is_what_train_reads(tmp_path, monkeypatch):
    """tools/train_data_subset.py: every file train.py reads, cut to its first documents, readable by it."""
    import lzma
    import sys

    for rel in train.TRAIN_FILES:
        path = tmp_path / "full" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "\n\n".join(f"{rel} document {i}" for i in range(10))
        with (lzma.open if path.suffix == ".xz" else open)(path, "wt", encoding="utf-8") as f:
            f.write(text)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "tools"))
    monkeypatch.setattr(sys, "argv", ["x", "--data-dir", str(tmp_path / "full"), "--out", str(tmp_path / "sub"),
                                      "--fraction", "0.3"])
    import train_data_subset

    train_data_subset.main()
    docs = train.read_documents(tmp_path / "sub")
    assert len(docs) == 3 * len(train.TRAIN_FILES)
    assert all(d.endswith(("document 0", "document 1", "document 2")) for d in docs)
