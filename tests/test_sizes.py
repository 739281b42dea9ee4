"""The host-side launch arithmetic equals Triton's ``cdiv`` / ``next_power_of_2``, which it replaces on the host;
the multiprocessor count is the device's."""

import pytest
import torch

from laquant.kernels.common.sizes import cdiv, next_power_of_2, sm_count

triton = pytest.importorskip("triton")


def test_next_power_of_2_matches_triton():
    for n in [-3, 0, 1, 2, 3, 5, 16, 17, 63, 64, 65, 1000, 4096, 4097, 2**20 + 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def test_cdiv_matches_triton():
    for x in [0, 1, 15, 16, 17, 4095, 4096, 4097]:
        for y in [1, 3, 16, 64, 1024]:
            assert cdiv(x, y) == triton.cdiv(x, y), (x, y)


def test_sm_count_is_the_devices_and_elsewhere_the_fallback():
    assert sm_count(torch.device("cpu")) == 1 and sm_count(torch.device("cpu"), elsewhere=4) == 4
    if torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
        assert sm_count(dev, elsewhere=4) == torch.cuda.get_device_properties(dev).multi_processor_count
