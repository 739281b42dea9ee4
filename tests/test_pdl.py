"""Which launches use programmatic dependent launch (kernels/common/pdl.py): the decode-sized ones (a
B = 64 step's included, a prefill's not) on a GPU that has it, unless LAQUANT_PDL says otherwise; never on the CPU."""

import pytest
import torch

from laquant.kernels.common import pdl


def test_never_on_the_cpu(monkeypatch):
    monkeypatch.setenv("LAQUANT_PDL", "all")
    assert pdl.pdl_launch(torch.device("cpu"), 1) == {"PDL": 0}


@pytest.mark.parametrize("mode,rows,on", [("1", 1, True), ("1", pdl.PDL_MAX_ROWS, True),
                                          ("1", pdl.PDL_MAX_ROWS + 1, False), ("1", 64, True),
                                          ("1", 4096, False), ("all", 4096, True), ("0", 1, False)])
def test_small_launches_on_a_gpu_that_has_it(monkeypatch, mode, rows, on):
    monkeypatch.setattr(pdl, "_triton_has_pdl", lambda: True)
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: True)
    monkeypatch.setenv("LAQUANT_PDL", mode)
    release = 1 if rows <= pdl.PDL_EARLY_ROWS else 2  # at the start, or after the main loop
    want = {"PDL": release, "launch_pdl": True} if on else {"PDL": 0}
    assert pdl.pdl_launch(torch.device("cuda", 0), rows) == want


def test_off_without_the_hardware_or_triton(monkeypatch):
    monkeypatch.setenv("LAQUANT_PDL", "all")
    monkeypatch.setattr(pdl, "_triton_has_pdl", lambda: True)
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: False)  # before sm_90
    assert not pdl.pdl_enabled(torch.device("cuda", 0), 1)
    monkeypatch.setattr(pdl, "_triton_has_pdl", lambda: False)
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: True)
    assert not pdl.pdl_enabled(torch.device("cuda", 0), 1)
