import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), "NaN/Inf in compared tensors"
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture
def trained_model_dir():
    from laquant.loading import default_model_dir

    return os.environ.get("LAQUANT_TEST_MODEL") or str(default_model_dir())
