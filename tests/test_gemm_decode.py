"""The small-M (decode) GEMMs: the split-K W8A8 kernel, the W8A16 weight-only kernel and the
dispatch by the committed sweep table (kernels/gemm/configs.py)."""

import pytest
import torch

from conftest import DEVICE, rel_err, require_triton_kernels
from laquant.kernels.gemm import configs
from laquant.quant.modules import QuantLinear

triton = require_triton_kernels()
from laquant.kernels.common import counters  # noqa: E402
from laquant.kernels.gemm import int8 as gemm  # noqa: E402
from laquant.kernels.gemm.int8 import (  # noqa: E402
    int8_outlier_linear_triton,
    int8_weight_only_linear_triton,
    linear_triton,
)

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def _module(K, N, n_out, bias, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=gen) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=gen))
    outliers = torch.randperm(K, generator=gen)[:n_out]
    return QuantLinear.from_linear(lin.to(dtype), outliers).to(DEVICE), outliers


def _x(M, K, outliers, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen)
    x[:, outliers] *= 30
    return x.to(DEVICE, dtype)


def _reference(mod, x, act):
    from laquant.kernels import int8_outlier_linear

    args = (mod.qweight[:, :mod.n_main], mod.weight_scale, mod.keep_idx if mod.n_outliers else None,
            mod.outlier_idx, mod.outlier_weight, mod.bias)
    return int8_outlier_linear(x.cpu(), *(t.cpu() if t is not None else None for t in args), act).to(DEVICE)


def _check(y, ref, dtype):
    assert y.dtype == ref.dtype and y.shape == ref.shape
    assert rel_err(y.float(), ref.float()) < TOL[dtype]  # rel_err refuses NaN/Inf


SPLITK = [dict(BM=16, BN=32, BK=64, SPLIT_K=1, FIXUP=True, num_warps=4, num_stages=2),
          dict(BM=16, BN=32, BK=64, SPLIT_K=2, FIXUP=True, FUSE_Q=True, num_warps=4, num_stages=2),
          dict(BM=16, BN=32, BK=64, SPLIT_K=3, FIXUP=True, num_warps=4, num_stages=2),
          dict(BM=32, BN=64, BK=128, SPLIT_K=2, FIXUP=False, num_warps=4, num_stages=2),
          dict(BM=16, BN=64, BK=64, SPLIT_K=2, FIXUP=True, SWAP_AB=True, num_warps=4, num_stages=2)]


# --- on the CPU under Triton's interpreter (float32: its bf16 dot is wrong), and on the GPU ---

@pytest.mark.parametrize("cfg", SPLITK)
@pytest.mark.parametrize("M,K,N,n_out,bias", [(3, 200, 72, 7, True), (17, 96, 40, 0, False)])
def test_splitk_kernels_match_reference(cfg, M, K, N, n_out, bias):
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    mod, outliers = _module(K, N, n_out, bias, dtype)
    x = _x(M, K, outliers, dtype)
    p = mod.packed()
    _check(int8_outlier_linear_triton(x, p, cfg), _reference(mod, x, "per_token"), dtype)
    _check(int8_weight_only_linear_triton(x, p, cfg), _reference(mod, x, "none"), dtype)
    for buf in counters._BUFFERS.values():  # the in-kernel fixup leaves its counters zeroed
        assert not buf.any()


def test_auto_dispatch_follows_the_table(monkeypatch):
    """linear_triton(mode="auto") runs the path choose_gemm picks, with its tiles."""
    w8a8 = dict(BM=16, BN=32, BK=64, SPLIT_K=2, FIXUP=True, num_warps=4, num_stages=2)
    w8a16 = dict(BM=64, BN=64, BK=64, SPLIT_K=1, FIXUP=True, num_warps=4, num_stages=2)
    table = {"1@64x96": {"path": "w8a16", "w8a8": w8a8, "w8a16": w8a16},
             "64@64x96": {"path": "w8a8", "w8a8": w8a8, "w8a16": w8a16}}
    monkeypatch.setattr(configs, "TABLES", {"dispatch test GPU": table})  # off CUDA: the first table
    calls = []
    monkeypatch.setattr(gemm, "int8_outlier_linear_triton", lambda x, p, c: calls.append(("w8a8", c)))
    monkeypatch.setattr(gemm, "int8_weight_only_linear_triton", lambda x, p, c: calls.append(("w8a16", c)))
    mod, outliers = _module(96, 64, 3, False, torch.float32)
    for M in (1, 40, 300):
        linear_triton(_x(M, 96, outliers, torch.float32), mod.packed())
    assert [c[0] for c in calls] == ["w8a16", "w8a8", "w8a8"]
    assert calls[0][1]["BN"] == 64 and calls[0][1]["BM"] == 16  # BM shrinks to what M needs
    assert calls[1][1]["SPLIT_K"] == 2 and "GROUP_M" in calls[2][1]  # M > 256: the tiled kernel
    linear_triton(_x(1, 96, outliers, torch.float32), mod.packed(), mode="w8a8")
    assert calls[-1][0] == "w8a8"
    with pytest.raises(ValueError, match="mode must be auto, w8a8 or w8a16; got 'int4'"):
        linear_triton(_x(1, 96, outliers, torch.float32), mod.packed(), mode="int4")


def test_choose_gemm_buckets_and_unseen_shapes(monkeypatch):
    table = {f"{b}@{s}": {"path": "w8a16" if b <= 16 else "w8a8", "w8a8": dict(configs.DEFAULT_SPLITK["w8a8"], BN=n),
                          "w8a16": configs.DEFAULT_SPLITK["w8a16"]}
             for b in configs.M_BUCKETS for s, n in (("2048x2048", 32), ("5632x2048", 128))}
    monkeypatch.setattr(configs, "TABLES", {"bucket test GPU": table})
    assert configs.choose_gemm(1, 2048, 2048)[0] == "w8a16"
    assert configs.choose_gemm(16, 2048, 2048)[0] == "w8a16"
    assert configs.choose_gemm(17, 2048, 2048)[0] == "w8a8"
    assert configs.choose_gemm(64, 6000, 2100)[1]["BN"] == 128  # nearest swept shape
    assert configs.choose_gemm(64, 2000, 2048)[1]["BN"] == 32
    assert "GROUP_M" in configs.choose_gemm(257, 2048, 2048)[1]


def test_each_gpu_takes_its_own_table(monkeypatch):
    """A GPU takes the table swept on it, else one of the same model of GPU, else the first committed."""
    tables = {name: {f"{b}@2048x2048": {"path": "w8a8", "w8a8": dict(configs.DEFAULT_SPLITK["w8a8"], BN=bn),
                                        "w8a16": configs.DEFAULT_SPLITK["w8a16"]} for b in configs.M_BUCKETS}
              for name, bn in (("NVIDIA X100 80GB HBM3", 32), ("NVIDIA X200", 128))}
    monkeypatch.setattr(configs, "TABLES", tables)
    assert configs.table_key("NVIDIA X200") == "NVIDIA X200"
    assert configs.table_key("NVIDIA X100 PCIe") == "NVIDIA X100 80GB HBM3"  # the same model of GPU
    assert configs.table_key("NVIDIA Z9") == configs.table_key(None) == "NVIDIA X100 80GB HBM3"  # the first
    assert configs.choose_gemm(64, 2048, 2048, "NVIDIA X200")[1]["BN"] == 128
    assert configs.choose_gemm(64, 2048, 2048, "NVIDIA X100 NVL")[1]["BN"] == 32
    monkeypatch.setattr(configs, "TABLES", {})
    assert configs.table_key("NVIDIA X200") is None
    assert configs.choose_gemm(64, 2048, 2048, "NVIDIA X200")[1] == configs.DEFAULT_SPLITK["w8a8"]  # untuned


def test_step_tables_replace_a_paths_tiles(monkeypatch):
    """An entry of STEP_TABLES (tiles chosen inside the decode step) replaces that path's tiles of the TABLES key the
    lookup lands on, and only those: other buckets, the other path and the path choice stay the table's."""
    w8a8, w8a16 = dict(configs.DEFAULT_SPLITK["w8a8"], BN=32), configs.DEFAULT_SPLITK["w8a16"]
    table = {f"{b}@2048x2048": {"path": "w8a8", "w8a8": w8a8, "w8a16": w8a16} for b in configs.M_BUCKETS}
    step = dict(w8a8, BN=128, BK=128)
    monkeypatch.setattr(configs, "TABLES", {"step test GPU": table})
    monkeypatch.setattr(configs, "STEP_TABLES", {"step test GPU": {"64@2048x2048": {"w8a8": step}}})
    configs._entry.cache_clear()
    try:
        assert configs.entry_key("step test GPU", 64, 2000, 2100) == "64@2048x2048"  # the nearest swept shape
        assert configs.choose_gemm(64, 2000, 2100) == ("w8a8", step)
        assert configs.choose_config("w8a8", 40, 2048, 2048) == step  # bucket 64; BM already no taller than 64
        assert configs.choose_config("w8a16", 64, 2048, 2048) == w8a16
        assert configs.choose_gemm(32, 2048, 2048)[1] == w8a8
    finally:
        monkeypatch.undo()
        configs._entry.cache_clear()


@pytest.mark.parametrize("device", list(configs.STEP_TABLES))
def test_committed_step_tables_name_swept_entries(device):
    """The committed step overlays replace tiles of an existing entry, with the fields its kernel takes."""
    assert device in configs.TABLES
    for key, paths in configs.STEP_TABLES[device].items():
        assert key in configs.TABLES[device] and set(paths) <= {"w8a8", "w8a16"}
        for cfg in paths.values():
            assert {"BM", "BN", "BK", "SPLIT_K", "num_warps", "num_stages"} <= set(cfg)
            assert all(cfg[f] & (cfg[f] - 1) == 0 for f in ("BM", "BN", "BK", "SPLIT_K"))


@pytest.mark.parametrize("device", list(configs.TABLES))
def test_committed_tables_are_complete(device):
    """Every swept shape has every bucket, both paths, a path choice."""
    table = configs.TABLES[device]
    shapes = {k.split("@")[1] for k in table}
    assert shapes
    for s in shapes:
        for b in configs.M_BUCKETS:
            e = table[f"{b}@{s}"]
            assert e["path"] in ("w8a8", "w8a16") and "SPLIT_K" in e["w8a16"]
            assert "SPLIT_K" in e["w8a8"] or "GROUP_M" in e["w8a8"]  # the split-K or the tiled kernel


# a block's opt-in shared memory (Triton's max_shared_mem) on an H100 / H200, an A100, an L40S / RTX 4090
MAX_SHARED_MEM = {"hopper": 232448, "a100": 166912, "ada": 101376}


def _committed_tiles():
    for table in configs.TABLES.values():
        for entry in table.values():
            yield "w8a8", entry["w8a8"]
            yield "w8a16", entry["w8a16"]
    for table in configs.STEP_TABLES.values():
        for entry in table.values():
            yield from entry.items()
    for table in configs.GROUP_TABLES.values():
        yield from (("w8a8", cfg) for cfg in table.values())
    yield from (("w8a8", configs.tiled_config(M)) for M in (64, 300))


@pytest.mark.parametrize("gpu", MAX_SHARED_MEM)
def test_tiles_fit_each_gpus_shared_memory(gpu):
    """Tiles swept on Hopper shrink (pipeline depth, then K step) to what another GPU's block may take; on Hopper the
    committed tiles run as swept (bf16 x; fp32 x keeps room for its fp32 copy of the weight tile)."""
    budget = gemm.tile_smem_budget(MAX_SHARED_MEM[gpu])
    assert gemm.tile_smem_budget(MAX_SHARED_MEM["hopper"]) == gemm.HOPPER_TILE_SMEM == 224 * 1024
    for path, cfg in _committed_tiles():
        # the split-K W8A8 kernel reads int8 codes (fp32 x where it quantizes x itself, FUSE_Q), W8A16 x itself, the
        # tiled kernel codes only
        for x_bytes in ((1,) if "SPLIT_K" not in cfg else (1, 4) if path == "w8a8" else (2, 4)):
            BK, stages = gemm._fit_smem(cfg, x_bytes, budget)
            limit = budget if x_bytes < 4 else budget - 64 * 1024
            assert stages * BK * (cfg["BM"] * x_bytes + cfg["BN"]) <= limit, (gpu, cfg, x_bytes)
            assert 2 <= stages <= cfg["num_stages"] and cfg["BK"] % BK == 0 and BK >= 32
            if gpu == "hopper" and x_bytes < 4:
                assert (BK, stages) == (cfg["BK"], cfg["num_stages"]), cfg


def test_the_launch_fits_the_devices_shared_memory(monkeypatch):
    """Both W8A8 kernels (split-K at decode sizes, tiled above) and W8A16 launch with tiles fitted to the device's
    budget (here a small one: shallower pipelines, narrower K steps), and still match the reference."""
    fitted = []

    def spy(cfg, x_bytes, limit):
        fitted.append((limit, *fit(cfg, x_bytes, limit)))
        return fitted[-1][1:]

    fit = gemm._fit_smem
    monkeypatch.setattr(gemm, "_fit_smem", spy)
    monkeypatch.setattr(gemm, "_tile_smem", lambda device: 24 * 1024)
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    mod, outliers = _module(200, 72, 7, True, dtype)
    p = mod.packed()
    splitk = dict(BM=16, BN=32, BK=256, SPLIT_K=2, FIXUP=True, num_warps=4, num_stages=4)
    for M, cfg in ((5, splitk), (300, dict(configs.tiled_config(300), BM=32, BN=32))):
        x = _x(M, 200, outliers, dtype, seed=M)
        _check(int8_outlier_linear_triton(x, p, cfg), _reference(mod, x, "per_token"), dtype)
    _check(int8_weight_only_linear_triton(x, p, splitk), _reference(mod, x, "none"), dtype)
    assert [f[0] for f in fitted] == [24 * 1024] * 3
    assert all(BK * stages < 256 * 4 for _, BK, stages in fitted)  # shrunk from what was asked


# --- GPU only: odd shapes, every dtype, the table's own configs ---

@pytest.mark.gpu
@pytest.mark.parametrize("dtype,M", [(d, M) for d in (torch.bfloat16, torch.float16) for M in (1, 3, 17, 64, 100, 257)]
                         + [(torch.float32, M) for M in (1, 17, 100)],
                         ids=lambda v: {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(v, str(v)))
@pytest.mark.parametrize("K,N,n_out,bias", [(1000, 333, 7, True), (2056, 1100, 0, False), (777, 2050, 40, False)])
def test_gpu_odd_shapes(dtype, M, K, N, n_out, bias):
    mod, outliers = _module(K, N, n_out, bias, dtype, seed=M)
    x = _x(M, K, outliers, dtype, seed=M + 1)
    p = mod.packed()
    ref8, ref16 = _reference(mod, x, "per_token"), _reference(mod, x, "none")
    _check(int8_outlier_linear_triton(x, p), ref8, dtype)
    _check(int8_weight_only_linear_triton(x, p), ref16, dtype)
    _check(linear_triton(x, p, mode="w8a8"), ref8, dtype)
    _check(linear_triton(x, p, mode="w8a16"), ref16, dtype)
    path, _ = configs.choose_gemm(M, N, K, gemm.device_name(x.device))  # the table linear_triton takes here
    _check(linear_triton(x.view(1, M, K), p).view(M, N), ref16 if path == "w8a16" else ref8, dtype)
    for cfg in SPLITK:
        _check(int8_outlier_linear_triton(x, p, cfg), ref8, dtype)
        _check(int8_weight_only_linear_triton(x, p, cfg), ref16, dtype)


@pytest.mark.gpu
def test_gpu_fixup_is_deterministic_and_resets():
    mod, outliers = _module(2048, 2048, 8, True, torch.bfloat16)
    x = _x(64, 2048, outliers, torch.bfloat16)
    p = mod.packed()
    for path in ("w8a8", "w8a16"):
        fn = int8_outlier_linear_triton if path == "w8a8" else int8_weight_only_linear_triton
        cfg = dict(BM=64, BN=32, BK=128, SPLIT_K=8, FIXUP=True, num_warps=4, num_stages=3)
        ys = [fn(x, p, cfg) for _ in range(20)]
        assert all(torch.equal(ys[0], y) for y in ys)
        assert not counters.arrival_counters(x.device).any()
