"""``laquant eval speed``: laquant's kernels and models against their peers, measured in one run.

Suites (all on one CUDA device; each ratio is taken against a peer timed in the same process):

* ``decode``  one GLA decode step on a state pool, H = 64, K = V = 128: laquant with fp8 / int8 /
  bf16 / fp32 state vs fla ``fused_recurrent_gla`` (fp32 state) and fla's gated-delta-rule step;
  achieved GB/s against the measured copy bandwidth;
* ``prefill`` B * T = 65,536 tokens, H = 16, K = V = 128, bf16: laquant's chunk kernel vs fla
  ``chunk_gla`` vs PyTorch SDPA causal; the non-causal kernel vs SDPA non-causal;
* ``delta_decode`` / ``delta_prefill``  the gated delta rule (Gated DeltaNet, Qwen3-Next's heads:
  16 q/k heads, 32 v heads, K = V = 128): the decode step on a state pool in each format vs fla
  ``fused_recurrent_gated_delta_rule``; the chunked prefill vs fla ``chunk_gated_delta_rule``;
* ``kda_decode`` / ``kda_prefill``  Kimi Delta Attention (the delta rule with a per-channel decay,
  Kimi Linear's heads: 32 heads, K = V = 128): the decode step on a state pool in each format vs fla
  ``fused_recurrent_kda``; the chunked prefill vs fla ``chunk_kda``;
* ``gemm``    the int8 outlier-split GEMM (activation quantization included) vs cuBLAS bf16,
  bitsandbytes LLM.int8 (threshold 6.0) and ``torch._scaled_mm`` fp8 rowwise (operands quantized
  beforehand, so its time is the GEMM alone);
* ``e2e``     a model in bf16 and quantized with a recipe: prefill tokens/s, decode tokens/s after
  a 4K prompt (eager, CUDA-graphed through :mod:`laquant.generate`: one replay per step, and
  through transformers' ``model.generate``, timed from its first new token to its last), peak
  memory, cache bytes per sequence, and a ``torch.profiler`` profile of one eager decode step at
  B = 64 after a 512-token prompt (kernels per step and per decoder layer, GPU time, top kernels);
  with ``peers``, in the same process: fla's own ``GLAForCausalLM`` for a ``config:{json}`` GLA and
  transformers' own model for a ``FAMILY:{json}`` hybrid such as ``qwen3_next:{json}`` (same config,
  random weights, bf16, their own caches, eager decode).

Times are medians of ``triton.testing.do_bench`` (which clears L2 between runs). Results go to
``OUT/speed.json`` (device, versions, shapes, dtypes, raw times), ``OUT/speed.md``, ``OUT/speed.png``
(kernel suites) and ``OUT/speed_e2e.png`` (e2e bars).
"""

from __future__ import annotations

import gc
import json
import time
from contextlib import nullcontext
from functools import partial
from importlib import import_module
from pathlib import Path

import torch
import torch.nn.functional as F

from laquant.errors import LaquantError

SUITES = ("decode", "prefill", "delta_decode", "delta_prefill", "kda_decode", "kda_prefill", "gemm", "e2e")


# dense bf16 tensor-core peak (vendor datasheets, no sparsity) for the compute floor
DENSE_BF16_TFLOPS = {"NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H200": 989.0}


def _bench(fn, rep: int = 100, graph: bool = False) -> float:
    """Median milliseconds; ``graph``: replayed as a CUDA graph, so CPU launch overhead drops out."""
    from triton.testing import do_bench, do_bench_cudagraph

    if graph:
        return do_bench_cudagraph(fn, rep=rep, return_mode="median")
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def copy_bandwidth(nbytes: int = 2**30) -> float:
    """Bytes moved per second (read + write) by a device-to-device copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / (_bench(lambda: dst.copy_(src), rep=300) * 1e-3)


def versions() -> dict:
    import transformers
    import triton

    import laquant

    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": triton.__version__, "transformers": transformers.__version__, "laquant": laquant.__version__}
    for name in ("fla", "bitsandbytes"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing or broken peer is reported as absent
            out[name] = None
    return out


def _randn(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


# ----------------------------------------------------------------------------------------- decode
def _time_state_formats(row: dict, step, shape, io_bytes: int, bandwidth=None, state_std: float = 1.0) -> None:
    """Time ``step(data, scale, quantizer)``, a decode step on a state pool of ``shape`` ``[B, H, K, V]``,
    in each state format; record µs, GB/s (the state read and written plus ``io_bytes``) and, with
    the copy ``bandwidth``, the memory floor and the fraction of it reached."""
    from laquant.kernels.common.state import StateQuantizer

    B, H, K, V = shape
    for fmt in ("fp8_row", "int8_row", "bf16", "fp32"):
        quant = StateQuantizer(fmt)
        data, scale = quant.store(torch.randn(B, H, K, V, device="cuda") * state_std)
        scale = scale.squeeze(-1).contiguous() if scale is not None else None
        ms = _bench(lambda: step(data, scale, quant))
        nbytes = 2 * quant.format.bytes_per_state(K, V, B * H) + io_bytes
        row[f"laquant_{fmt}_us"] = ms * 1e3
        row[f"laquant_{fmt}_GBps"] = nbytes / (ms * 1e-3) / 1e9
        if bandwidth:
            row[f"laquant_{fmt}_floor_us"] = nbytes / bandwidth * 1e6
            row[f"laquant_{fmt}_of_copy_bw"] = nbytes / (ms * 1e-3) / bandwidth


def bench_decode(batches=(1, 4, 16, 32, 64, 128, 256), H=64, K=128, bandwidth=None) -> list[dict]:
    from laquant.kernels.gla.decode import gla_decode_step

    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        from fla.ops.gla import fused_recurrent_gla
    except ImportError:
        fused_recurrent_gla = fused_recurrent_gated_delta_rule = None
    V = K
    rows = []
    for B in batches:
        q, k, v = (_randn(B, H, d) for d in (K, K, V))
        g = (F.logsigmoid(torch.randn(B, H, K, device="cuda")) / 16).bfloat16()
        idx = torch.arange(B, device="cuda", dtype=torch.int32)
        io_bytes = B * H * (3 * K + 2 * V) * 2  # q, k, g, v in and o out, bf16
        row = {"B": B, "H": H, "K": K, "V": V}
        _time_state_formats(row, lambda data, scale, quant: gla_decode_step(q, k, v, g, data, scale, idx, quant),
                            (B, H, K, V), io_bytes, bandwidth)
        if fused_recurrent_gla is not None:
            h0 = torch.randn(B, H, K, V, device="cuda")
            q4, k4, v4, g4 = (x.unsqueeze(1) for x in (q, k, v, g))
            row["fla_gla_fp32_us"] = 1e3 * _bench(
                lambda: fused_recurrent_gla(q4, k4, v4, g4, initial_state=h0, output_final_state=True))
            gs = g4[..., 0].float().contiguous()
            beta = torch.rand(B, 1, H, device="cuda").bfloat16()
            kn = F.normalize(k4.float(), dim=-1).bfloat16()
            row["fla_gdn_fp32_us"] = 1e3 * _bench(lambda: fused_recurrent_gated_delta_rule(
                q4, kn, v4, g=gs, beta=beta, initial_state=h0, output_final_state=True))
            for fmt in ("fp8_row", "bf16", "fp32"):
                row[f"speedup_{fmt}_vs_fla"] = row["fla_gla_fp32_us"] / row[f"laquant_{fmt}_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ---------------------------------------------------------------------------------------- prefill
def _fla_op(module: str, name: str):
    """fla's op ``module.name``, or None without fla (its columns are left out)."""
    try:
        return getattr(import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _prefill_shapes(seq_lens, total: int) -> list[tuple[int, int]]:
    """``(B, T)`` per sequence length: ``B * T = total`` tokens, one sequence where T alone exceeds it."""
    return [(max(1, total // T), T) for T in seq_lens]


def _time_chunked(row: dict, chunked, peer=None, peer_no_grad: bool = False) -> None:
    """Time a chunked prefill ``chunked(**kwargs)``: ``laquant_ms`` as given (float32 state),
    ``laquant_fp8_roundtrip_ms`` with the state rounded to fp8 at every chunk; then fla's ``peer``
    (under ``torch.no_grad()`` where asked) and the speedup over it."""
    from laquant.kernels.common.state import StateQuantizer

    row["laquant_ms"] = _bench(chunked)
    fp8 = StateQuantizer("fp8_row")
    row["laquant_fp8_roundtrip_ms"] = _bench(partial(chunked, roundtrip=fp8, final_format="fp8_row"))
    if peer is not None:
        with torch.no_grad() if peer_no_grad else nullcontext():
            row["fla_ms"] = _bench(peer)
        row["speedup_vs_fla"] = row["fla_ms"] / row["laquant_ms"]


def bench_prefill(seq_lens=(1024, 2048, 4096, 8192, 16384, 32768, 65536), total=65536, H=16, K=128,
                  bandwidth=None) -> list[dict]:
    from laquant.kernels.gla.chunk import chunk_gla_triton
    from laquant.kernels.gla.noncausal import noncausal_linear_attention_triton

    fla_chunk_gla = _fla_op("fla.ops.gla", "chunk_gla")
    V = K
    rows = []
    for B, T in _prefill_shapes(seq_lens, total):
        q, k, v = (_randn(B, T, H, d) for d in (K, K, V))
        g = (F.logsigmoid(torch.randn(B, T, H, K, device="cuda")) / 16).bfloat16()
        row = {"B": B, "T": T, "H": H, "K": K, "V": V}
        peer = None if fla_chunk_gla is None else partial(fla_chunk_gla, q, k, v, g, output_final_state=True)
        _time_chunked(row, partial(chunk_gla_triton, q, k, v, g, output_final_state=True), peer)
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's [B, H, T, D]
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            row["sdpa_causal_ms"] = _bench(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True))
            row["sdpa_noncausal_ms"] = _bench(lambda: F.scaled_dot_product_attention(qh, kh, vh))
        row["speedup_vs_sdpa_causal"] = row["sdpa_causal_ms"] / row["laquant_ms"]
        row["laquant_noncausal_ms"] = _bench(lambda: noncausal_linear_attention_triton(q, k, v))
        row["noncausal_speedup_vs_sdpa"] = row["sdpa_noncausal_ms"] / row["laquant_noncausal_ms"]
        # floor: q, k, v, g read and o written once, bf16
        if bandwidth:
            row["floor_ms"] = B * T * H * (3 * K + 2 * V) * 2 / bandwidth * 1e3
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------ delta rule
def _delta_inputs(B, T, Hk, Hv, K, V):
    """Gated-delta-rule inputs as Qwen3-Next feeds them: bf16 q, k, v; float32 log-decay and beta."""
    q, k, v = _randn(B, T, Hk, K), _randn(B, T, Hk, K), _randn(B, T, Hv, V)
    g = -F.softplus(torch.randn(B, T, Hv, device="cuda")) * 0.5
    return q, k, v, g, torch.rand(B, T, Hv, device="cuda")


def bench_delta_decode(batches=(1, 4, 16, 64, 256), Hk=16, Hv=32, K=128, bandwidth=None) -> list[dict]:
    """One gated-delta-rule decode step (Qwen3-Next's heads: 16 q/k, 32 v, K = V = 128, l2-normalised
    q and k) on a state pool in each format vs fla ``fused_recurrent_gated_delta_rule`` (fp32 state)."""
    from laquant.kernels.delta.decode import delta_decode_step

    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        fused_recurrent_gated_delta_rule = None
    V = K
    rows = []
    for B in batches:
        q, k, v, g, beta = _delta_inputs(B, 1, Hk, Hv, K, V)
        idx = torch.arange(B, device="cuda", dtype=torch.int32)
        io_bytes = B * (Hk * 2 * K + Hv * 2 * V) * 2 + B * Hv * 8  # q, k, v in, o out (bf16); g, beta fp32
        row = {"B": B, "Hk": Hk, "Hv": Hv, "K": K, "V": V}
        _time_state_formats(row, lambda data, scale, quant: delta_decode_step(
            q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], data, scale, idx, quant, use_qk_l2norm=True),
            (B, Hv, K, V), io_bytes, bandwidth, state_std=0.1)
        if fused_recurrent_gated_delta_rule is not None:
            h0 = torch.randn(B, Hv, K, V, device="cuda") * 0.1
            row["fla_fp32_us"] = 1e3 * _bench(lambda: fused_recurrent_gated_delta_rule(
                q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True))
            for fmt in ("fp8_row", "bf16", "fp32"):
                row[f"speedup_{fmt}_vs_fla"] = row["fla_fp32_us"] / row[f"laquant_{fmt}_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_delta_prefill(seq_lens=(1024, 4096, 16384, 65536), total=65536, Hk=16, Hv=32, K=128,
                        bandwidth=None, peak_tflops=None) -> list[dict]:
    """Chunked gated-delta-rule prefill, B * T = 65,536 tokens, Qwen3-Next's heads, bf16: laquant
    (fp32 state; fp8 round trips every 64 tokens) vs fla ``chunk_gated_delta_rule`` (forward). ``layout`` names
    laquant's launch: ``split`` (the chunk-parallel WY form, a 64-token walk) or ``walk`` (one launch)."""
    from laquant.kernels.delta.chunk import chunk_delta_triton, splits_intra

    fla_chunk = _fla_op("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
    V = K
    rows = []
    for B, T in _prefill_shapes(seq_lens, total):
        q, k, v, g, beta = _delta_inputs(B, T, Hk, Hv, K, V)
        row = {"B": B, "T": T, "Hk": Hk, "Hv": Hv, "K": K, "V": V,
               "layout": "split" if splits_intra(q, B * Hv, B * T) else "walk"}
        peer = None if fla_chunk is None else partial(fla_chunk, q, k, v, g, beta, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
        _time_chunked(row, partial(chunk_delta_triton, q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True),
                      peer, peer_no_grad=True)
        # floors: q, k, v, g, beta read and o written once; the matmul FLOPs of the chunked form
        # (64-token chunks: k k^T, w, u, q k^T, A v_new per chunk; w S, q S, k^T v_new per token)
        if bandwidth:
            io = B * T * ((Hk * 2 * K + Hv * 2 * V) * 2 + Hv * 8)
            row["memory_floor_ms"] = io / bandwidth * 1e3
        flops = 2 * B * T * Hv * (3 * K * V + 64 * (3 * K + 2 * V))
        row["TFLOPs"] = flops / (row["laquant_ms"] * 1e-3) / 1e12
        if peak_tflops:
            row["compute_floor_ms"] = flops / (peak_tflops * 1e12) * 1e3
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------------------ Kimi Delta Attention
def _kda_inputs(B, T, H, K, V):
    """KDA inputs as Kimi Linear feeds them: bf16 q, k, v; float32 per-channel log-decay and beta."""
    q, k, v = _randn(B, T, H, K), _randn(B, T, H, K), _randn(B, T, H, V)
    g = -F.softplus(torch.randn(B, T, H, K, device="cuda")) * 0.5
    return q, k, v, g, torch.rand(B, T, H, device="cuda")


def bench_kda_decode(batches=(1, 16, 64, 256), H=32, K=128, bandwidth=None) -> list[dict]:
    """One KDA decode step (Kimi Linear's heads: 32, K = V = 128, l2-normalised q and k) on a state
    pool in each format vs fla ``fused_recurrent_kda`` (fp32 state)."""
    from laquant.kernels.kda.decode import kda_decode_step

    fla_step = _fla_op("fla.ops.kda", "fused_recurrent_kda")
    V = K
    rows = []
    for B in batches:
        q, k, v, g, beta = _kda_inputs(B, 1, H, K, V)
        idx = torch.arange(B, device="cuda", dtype=torch.int32)
        io_bytes = B * H * ((2 * K + 2 * V) * 2 + K * 4 + 4)  # q, k, v in, o out (bf16); g, beta fp32
        row = {"B": B, "H": H, "K": K, "V": V}
        _time_state_formats(row, lambda data, scale, quant: kda_decode_step(
            q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], data, scale, idx, quant, use_qk_l2norm=True),
            (B, H, K, V), io_bytes, bandwidth, state_std=0.1)
        if fla_step is not None:
            h0 = torch.randn(B, H, K, V, device="cuda") * 0.1
            row["fla_fp32_us"] = 1e3 * _bench(lambda: fla_step(q, k, v, g, beta, initial_state=h0,
                                                               output_final_state=True, use_qk_l2norm_in_kernel=True))
            for fmt in ("fp8_row", "bf16", "fp32"):
                row[f"speedup_{fmt}_vs_fla"] = row["fla_fp32_us"] / row[f"laquant_{fmt}_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_kda_prefill(seq_lens=(1024, 4096, 16384, 65536), total=65536, H=32, K=128, bandwidth=None) -> list[dict]:
    """Chunked KDA prefill, B * T = 65,536 tokens, Kimi Linear's heads, bf16: laquant (fp32 state;
    fp8 round trips every 64 tokens) vs fla ``chunk_kda`` (forward)."""
    from laquant.kernels.kda.chunk import chunk_kda_triton

    fla_chunk = _fla_op("fla.ops.kda", "chunk_kda")
    V = K
    rows = []
    for B, T in _prefill_shapes(seq_lens, total):
        q, k, v, g, beta = _kda_inputs(B, T, H, K, V)
        row = {"B": B, "T": T, "H": H, "K": K, "V": V}
        peer = None if fla_chunk is None else partial(fla_chunk, q, k, v, g, beta, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
        _time_chunked(row, partial(chunk_kda_triton, q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True),
                      peer, peer_no_grad=True)
        if bandwidth:  # q, k, v, g, beta read and o written once
            row["memory_floor_ms"] = B * T * H * ((2 * K + 2 * V) * 2 + K * 4 + 4) / bandwidth * 1e3
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------------- gemm
GEMM_SHAPES = {  # (in, out): a 1.3B GLA's projections (hidden 2048) and the square case
    "q/k 2048->1024": (2048, 1024), "v/g/o 2048->2048": (2048, 2048), "mlp up 2048->5632": (2048, 5632),
    "mlp down 5632->2048": (5632, 2048), "square 4096->4096": (4096, 4096),
}


def bench_gemm(ms_list=(1, 16, 128, 2048, 8192), shapes=None, n_outliers=8) -> list[dict]:
    from laquant.quant.modules import QuantLinear

    try:
        import bitsandbytes as bnb
    except Exception:  # noqa: BLE001
        bnb = None
    rows = []
    for name, (K, N) in (shapes or GEMM_SHAPES).items():
        lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
        outliers = torch.randperm(K, device="cuda")[:n_outliers]
        qlin = QuantLinear.from_linear(lin, outliers)
        w8 = lin.weight.abs().amax(1, keepdim=True).float() / 448
        w_fp8 = (lin.weight.float() / w8).to(torch.float8_e4m3fn)
        b_lin = None
        if bnb is not None:
            b_lin = bnb.nn.Linear8bitLt(K, N, bias=False, has_fp16_weights=False, threshold=6.0)
            b_lin.load_state_dict({"weight": lin.weight.detach().cpu().half()})
            b_lin = b_lin.cuda()
        for M in ms_list:
            x = _randn(M, K)
            x[:, outliers] *= 20  # outlier columns as calibration finds them
            row = {"shape": name, "M": M, "K": K, "N": N, "n_outliers": n_outliers}
            # CUDA-graph replays: the GPU time of each implementation, launch overhead excluded
            row["bf16_us"] = 1e3 * _bench(lambda: F.linear(x, lin.weight), graph=True)
            row["laquant_int8_us"] = 1e3 * _bench(lambda: qlin(x), graph=True)
            row["laquant_int8_eager_us"] = 1e3 * _bench(lambda: qlin(x))
            row["speedup_vs_bf16"] = row["bf16_us"] / row["laquant_int8_us"]
            xs = x.abs().amax(1, keepdim=True).float() / 448
            x_fp8 = (x.float() / xs).to(torch.float8_e4m3fn)
            row["scaled_mm_fp8_us"] = 1e3 * _bench(lambda: torch._scaled_mm(
                x_fp8, w_fp8.t(), scale_a=xs, scale_b=w8.t(), out_dtype=torch.bfloat16), graph=True)
            if b_lin is not None:  # not graph-capturable (it finds outliers with a host sync): eager
                xh = x.half()
                row["bnb_int8_us"] = 1e3 * _bench(lambda: b_lin(xh))
                row["speedup_vs_bnb"] = row["bnb_int8_us"] / row["laquant_int8_us"]
            flops = 2 * M * K * N
            row["laquant_TOPS"] = flops / (row["laquant_int8_us"] * 1e-6) / 1e12
            row["bf16_TFLOPS"] = flops / (row["bf16_us"] * 1e-6) / 1e12
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# -------------------------------------------------------------------------------------------- e2e
def _decode_rate(model, prompt, steps, graphed) -> float:
    """Tokens per second of ``steps`` decode steps after ``prompt``, the batch of sequences in
    parallel, through :class:`laquant.generate.DecodeSession` (graphed: one replay per step)."""
    from laquant.generate import DecodeSession

    B = prompt.shape[0]
    with torch.no_grad():
        session = DecodeSession(model, prompt, steps + 3, graphed=graphed)
        session.step()  # two steps outside the timing (first-call costs)
        session.step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            session.step()
        torch.cuda.synchronize()
    return B * steps / (time.perf_counter() - t0)


class _StepClock:
    """A transformers streamer that notes the time each generated token reaches the host (the first
    ``put`` is the prompt, before the prefill)."""

    def __init__(self):
        self.times = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _hf_generate_rate(model, prompt, steps) -> float:
    """Tokens/s of transformers' ``model.generate`` (greedy, ``steps + 1`` new tokens after ``prompt``)
    over its decode steps: from the first new token to the last, as its streamer receives them (the
    loop reads every step's tokens and stop flag on the host, so a step ends on the host)."""
    kw = dict(max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(prompt))
    with torch.no_grad():
        model.generate(prompt, **kw)  # first-call costs (compilation, graph captures)
        clock = _StepClock()
        model.generate(prompt, streamer=clock, **kw)
    return prompt.shape[0] * steps / (clock.times[-1] - clock.times[1])


# A qwen3_next of about the size of the GLA configs benchmarked (``qwen3_next:{json}`` overrides any
# field): Gated DeltaNet with Qwen3-Next's head layout, one gated softmax-attention layer in four, MoE.
QWEN3_NEXT_DEFAULTS = dict(
    vocab_size=32000, hidden_size=1024, num_hidden_layers=8, intermediate_size=2816, num_attention_heads=8,
    num_key_value_heads=2, head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128,
    linear_value_head_dim=128, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=512,
    shared_expert_intermediate_size=512, decoder_sparse_step=1, full_attention_interval=4,
    bos_token_id=0, eos_token_id=0)


def qwen3_next_config(fields: dict):
    """transformers' ``Qwen3NextConfig`` of :data:`QWEN3_NEXT_DEFAULTS` with ``fields`` over them."""
    from transformers import Qwen3NextConfig

    cfg = {**QWEN3_NEXT_DEFAULTS, **fields}
    if "layer_types" not in cfg:
        every = cfg.pop("full_attention_interval")
        cfg["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                              for i in range(cfg["num_hidden_layers"])]
    else:
        cfg.pop("full_attention_interval", None)
    return Qwen3NextConfig(**cfg)


def _hybrid_families() -> list[str]:
    """The transformers hybrids an e2e spec ``FAMILY:{json}`` may name (text models: the vision-language
    families need a vision config)."""
    from laquant.families import FAMILIES

    return [name for name, f in FAMILIES.items() if not f.native and not f.vision]


def _parse_spec(model_id: str) -> tuple[str, dict | None]:
    """``config:{json}`` -> ("gla", fields); ``FAMILY:{json}`` for a transformers hybrid family
    (``qwen3_next``, ``qwen3_5_text``, ``kimi_linear``, ``nemotron_h``, ...) -> (FAMILY, fields); anything
    else (a folder, an HF id, gla-small) -> ("load", None)."""
    for kind in ("gla", *_hybrid_families()):
        prefix = "config:" if kind == "gla" else f"{kind}:"
        if model_id.startswith(prefix):
            text = model_id[len(prefix):] or "{}"
            try:
                fields = json.loads(text)
            except json.JSONDecodeError as exc:
                raise LaquantError(f"--model {model_id!r}: the part after {prefix!r} is not JSON ({exc})") from None
            if not isinstance(fields, dict):
                raise LaquantError(f"--model {model_id!r}: expected a JSON object of config fields after {prefix!r}")
            return kind, fields
    return "load", None


def hybrid_config(kind: str, fields: dict):
    """The transformers config of a ``FAMILY:{json}`` spec: qwen3_next's over :data:`QWEN3_NEXT_DEFAULTS`,
    another family's over transformers' defaults for it."""
    if kind == "qwen3_next":
        return qwen3_next_config(fields)
    from laquant.families import FAMILIES

    config_class = FAMILIES[kind].config_class()
    try:
        return config_class(**fields)
    except Exception as exc:  # noqa: BLE001 - configs raise TypeError, ValueError or huggingface_hub's validation error
        raise LaquantError(f"--model {kind}:{json.dumps(fields)}: not a valid {kind} config ({exc})") from None


def hybrid_model(kind: str, cfg):
    """A random transformers model of a hybrid family's config (no laquant mixers)."""
    from laquant.families import FAMILIES

    return FAMILIES[kind].from_config(cfg)


def _random_model(build):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build()
    return model.to(torch.bfloat16).eval()


def _model_maker(model_id: str):
    """``(label, make)`` for a model id: a directory / HF id / ``gla-small``, ``config:{json}`` (a
    randomly initialised laquant GLA of that GLAConfig: speed only) or ``FAMILY:{json}`` (a random
    transformers hybrid of that family, e.g. Qwen3-Next, with laquant's mixers installed)."""
    from laquant.loading import load_model
    from laquant.models import GLAConfig, GLAForCausalLM

    kind, fields = _parse_spec(model_id)
    if kind == "gla":
        cfg = GLAConfig(**fields)
        return f"random GLA {cfg.hidden_size}x{cfg.num_hidden_layers}", lambda: _random_model(lambda: GLAForCausalLM(cfg))
    if kind != "load":
        from laquant.adapters import install

        cfg = hybrid_config(kind, fields)

        def make():
            model = _random_model(lambda: hybrid_model(kind, cfg))
            install(model)
            return model

        return f"random {kind} {cfg.hidden_size}x{cfg.num_hidden_layers}", make
    return model_id, lambda: load_model(model_id, device="cuda", dtype=torch.bfloat16)[0]


def _qwen3_next_path() -> str:
    """Which delta-rule and conv implementations transformers' Qwen3-Next calls here: its functions
    are wrapped at import time with the implementation chosen then (fla's kernels when fla imports,
    else the PyTorch fallback); read from the wrappers' closures."""
    import inspect

    from transformers.models.qwen3_next import modeling_qwen3_next as m

    names = []
    for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
               "causal_conv1d_update"):
        f = impl = getattr(m, fn, None)
        try:
            impl = inspect.getclosurevars(f).nonlocals.get("implementation", f)
        except (TypeError, ValueError):
            pass
        names.append(f"{fn} -> {getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}")
    return "; ".join(names)


def peer_variants(model_ids) -> list[tuple[str, str, callable]]:
    """The peers of the ``config:`` and ``FAMILY:`` models, same config and random weights, bf16:
    fla's own ``GLAForCausalLM`` (its kernels and cache; variant ``fla_bf16``) and transformers' own
    model of the family (variant ``transformers_bf16``). Other models have none here."""
    out = []
    for model_id in model_ids:
        kind, fields = _parse_spec(model_id)
        label, _ = _model_maker(model_id)
        if kind == "gla":
            def make_fla(fields=fields):
                try:
                    from fla.models import GLAConfig as FlaGLAConfig
                    from fla.models import GLAForCausalLM as FlaGLAForCausalLM
                except ImportError as exc:
                    raise LaquantError(f"the fla peer needs flash-linear-attention ({exc})") from None
                model = _random_model(lambda: FlaGLAForCausalLM(FlaGLAConfig(**fields)))
                model.peer_path = (f"fla {__import__('fla').__version__} GLAForCausalLM, fla kernels and fla Cache; "
                                   "eager decode (its Cache stores a new state tensor at every update, so a captured "
                                   "step would replay on stale ones)")
                return model

            out.append((label, "fla_bf16", make_fla))
        elif kind != "load":
            def make_hf(kind=kind, fields=fields):
                model = _random_model(lambda: hybrid_model(kind, hybrid_config(kind, fields)))
                model.peer_path = (f"transformers {type(model).__name__}, eager decode (its KV cache grows)"
                                   + (": " + _qwen3_next_path() if kind == "qwen3_next" else ""))
                return model

            out.append((label, "transformers_bf16", make_hf))
    return out


def recipe_variants(model_ids, recipe: str, hybrid_recipe: str = "hybrid_int8",
                    peers: bool = False, overrides=()) -> list[tuple[str, str, callable]]:
    """Each model in bf16 and quantized here (calibration on the shipped text, or on random tokens
    for a ``config:`` / ``FAMILY:`` model): GLA with ``recipe``, a hybrid with ``hybrid_recipe``, each with the
    ``SECTION.FIELD=VALUE`` ``overrides`` (named in the variant); with ``peers``, each model's peer
    (:func:`peer_variants`) after it."""
    from laquant.api import calibrate
    from laquant.data import load_text, tokenize
    from laquant.loading import load_tokenizer
    from laquant.recipe import load_recipe

    recipes = {name: load_recipe(name, list(overrides)) for name in (recipe, hybrid_recipe)}  # bad fields fail here
    suffix = "".join(f" {item}" for item in overrides)
    out = []
    for model_id in model_ids:
        label, make = _model_maker(model_id)
        kind, _ = _parse_spec(model_id)
        this_recipe = recipes[recipe if kind in ("gla", "load") else hybrid_recipe]

        def quantized(make=make, model_id=model_id, kind=kind, this_recipe=this_recipe):
            model = make()
            if kind != "load":
                calib = torch.randint(0, model.config.vocab_size, (4, 1024), device="cuda")
            else:
                ids = tokenize(load_text("calibration"), load_tokenizer(model_id))
                calib = ids[: 4 * 1024].view(4, 1024).cuda()
            return calibrate(model, this_recipe, data=calib, progress=False).model

        out += [(label, "bf16", make), (label, this_recipe["name"] + suffix, quantized)]
        if peers:
            out += peer_variants([model_id])
    return out


def checkpoint_variants(path: str, baseline: str | None) -> list[tuple[str, str, callable]]:
    """A saved laquant checkpoint (``laquant calibrate`` output) and, optionally, its baseline."""
    from laquant.api import load

    out = []
    if baseline is not None:
        label, make = _model_maker(baseline)
        out.append((label, "baseline", make))
    out.append((path, "checkpoint", lambda: load(path, device="cuda", dtype=torch.bfloat16)[0]))
    return out


def cache_bytes(cache) -> int:
    """Bytes of a decode cache: laquant's state bytes, or (any other cache: fla's, transformers')
    every tensor reachable from it (recurrent states, conv states and, in a hybrid, the KV cache)."""
    if hasattr(cache, "state_bytes"):
        return cache.state_bytes()
    seen, total, todo = set(), 0, [(cache, 0)]
    while todo:
        obj, depth = todo.pop()
        if isinstance(obj, torch.Tensor):
            key = (obj.data_ptr(), tuple(obj.shape))
            if key not in seen:
                seen.add(key)
                total += obj.numel() * obj.element_size()
        elif depth < 5 and id(obj) not in seen:
            seen.add(id(obj))
            if isinstance(obj, dict):
                todo += [(v, depth + 1) for v in obj.values()]
            elif isinstance(obj, (list, tuple)):
                todo += [(v, depth + 1) for v in obj]
            elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
                todo += [(v, depth + 1) for v in vars(obj).values()]
    return total


# --------------------------------------------------------------------------------------- profile
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: the profile's layer boundaries


def decoder_layers(model) -> list:
    """The decoder layers of a causal LM (``model.model.layers``: laquant's, fla's, transformers')."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return list(layers) if layers is not None else []


def summarize_kernels(kernels, num_layers: int, top: int = 6) -> dict:
    """One decode step's GPU activity ``[(name, start_us, duration_us), ...]`` (marker kernels named
    :data:`MARKER` launched before each decoder layer and after the last) -> the profile fields of an
    e2e row: ``kernels_per_step``, ``kernels_per_layer`` (mean over the decoder layers; None when the
    markers are not all there), ``kernels_outside_layers``, ``gpu_ms_per_step`` (kernel time, markers
    excluded) and ``top_kernels`` (``[name, calls, ms, share]`` by total time)."""
    kernels = sorted(kernels, key=lambda k: k[1])
    segments, current = [], []
    for name, _, dur in kernels:
        if MARKER in name:
            segments.append(current)
            current = []
        else:
            current.append((name, dur))
    segments.append(current)
    real = [k for seg in segments for k in seg]
    gpu_us = sum(d for _, d in real)
    per_name: dict[str, list] = {}
    for name, dur in real:
        entry = per_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += dur
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]
    out = {"kernels_per_step": len(real), "kernels_per_layer": None, "kernels_outside_layers": None,
           "gpu_ms_per_step": gpu_us / 1e3,
           "top_kernels": [[short_kernel_name(n), c, us / 1e3, us / gpu_us if gpu_us else 0.0]
                           for n, (c, us) in ranked]}
    if num_layers and len(segments) == num_layers + 2:
        inside = segments[1:-1]
        out["kernels_per_layer"] = sum(len(s) for s in inside) / num_layers
        out["kernels_outside_layers"] = len(segments[0]) + len(segments[-1])
    return out


def short_kernel_name(name: str, width: int = 70) -> str:
    """A kernel's name without template arguments and parameter lists, at most ``width`` characters."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    short = "".join(out).strip() or name
    return short if len(short) <= width else short[: width - 1] + "…"


def profile_decode_step(model, batch: int = 64, prompt_len: int = 512) -> dict:
    """``torch.profiler`` over one eager (graph-less) decode step of ``batch`` sequences after a
    ``prompt_len``-token prompt: :func:`summarize_kernels` of it."""
    from torch.profiler import ProfilerActivity, profile

    from laquant.generate import DecodeSession

    layers = decoder_layers(model)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device="cuda")
    with torch.no_grad():
        session = DecodeSession(model, prompt, 4, graphed=False)
        session.step()  # warm: kernels compiled, autotuned
        mark = lambda *_: torch.cuda._sleep(1)  # noqa: E731
        hooks = [layer.register_forward_pre_hook(mark) for layer in layers]
        if layers:
            hooks.append(layers[-1].register_forward_hook(mark))
        try:
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                session.step()
                torch.cuda.synchronize()
        finally:
            for h in hooks:
                h.remove()
    out = summarize_kernels(cuda_kernels(prof), len(layers))
    out["profile"] = f"B={batch}, prompt {prompt_len}, one eager step"
    return out


def cuda_kernels(prof) -> list[tuple[str, float, float]]:
    """``[(name, start_us, duration_us), ...]`` of the CUDA kernels a ``torch.profiler`` run recorded."""
    from torch.autograd import DeviceType

    return [(e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in prof.events()
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]


def gpu_ms_of(fn) -> float:
    """The GPU time of one call of ``fn``: its CUDA kernels' durations summed (``torch.profiler``), so
    host time between the launches is left out."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(dur for _, _, dur in cuda_kernels(prof)) / 1e3


def _graphed_prefill_rate(model, ids: torch.Tensor) -> float | None:
    """Tokens/s of ``ids``' prefill replayed as a CUDA graph (:func:`laquant.generate.prefill`, the wall clock of a
    replay and its copies out, the capture left out), or None where the model has no graphed prefill."""
    from laquant.generate import graphed_prefill_refusal, prefill, prefill_graphs, release_graphs

    if graphed_prefill_refusal(model, ids.shape[1]) is not None:
        return None
    try:
        with torch.no_grad():
            prefill(model, ids, graphed=True)  # captures the bucket
            if prefill_graphs(model).failure is not None:
                return None
            ms = _bench(lambda: prefill(model, ids, graphed=True), rep=500)
    finally:
        release_graphs(model)  # its memory pool is not counted in the decode rows' peak memory
    return ids.shape[1] / (ms * 1e-3)


def bench_e2e(variants, prompt_len=4096, batches=(1, 16, 64), steps=32, profile: tuple[int, int] | None = (64, 512)
              ) -> list[dict]:
    """Prefill tokens/s (one prompt: on the wall clock, which an eager forward's host time can set,
    on its kernels' GPU time, and replayed as a CUDA graph where the model has one), decode tokens/s
    after a prompt (eager, through the CUDA-graphed
    loop of :mod:`laquant.generate` where the model has one, and through transformers' ``generate``,
    which replays a graph per step on laquant's GLA), peak memory, cache bytes
    per sequence and, with ``profile = (B, prompt)``, the kernels of one eager decode step; one
    model in memory at a time."""
    from laquant.generate import is_graphable

    rows = []
    for label, variant, make in variants:
        model = make()
        vocab = model.config.vocab_size
        n_params = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
        graphable = is_graphable(model)
        row = {"model": label, "variant": variant, "params+buffers": n_params, "prompt_len": prompt_len,
               "decode_steps": steps, "decode_path": "graphed + eager" if graphable else "eager only"}
        # eager only: the peers (fla's model, transformers' own qwen3_next)
        if hasattr(model, "peer_path"):
            row["peer_path"] = model.peer_path
        ids = torch.randint(0, vocab, (1, prompt_len), device="cuda")
        prefill = lambda: model(ids, logits_to_keep=1)  # noqa: E731
        with torch.no_grad():
            # ~25 calls: one eager prefill's wall clock moves with the host (1.5-3.7x its GPU time on an H200,
            # eval/results/codes_registers_h200/), a handful of calls did not settle it
            ms = _bench(prefill, rep=1000)
            gpu_ms = gpu_ms_of(prefill)
        row["prefill_tok_per_s"] = prompt_len / (ms * 1e-3)
        row["prefill_gpu_tok_per_s"] = prompt_len / (gpu_ms * 1e-3) if gpu_ms > 0 else None
        row["prefill_graphed_tok_per_s"] = _graphed_prefill_rate(model, ids)
        for B in batches:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            prompt = torch.randint(0, vocab, (B, prompt_len), device="cuda")
            row[f"decode_B{B}_tok_per_s"] = _decode_rate(model, prompt, steps, graphed=False)
            row[f"peak_mem_B{B}_GiB"] = torch.cuda.max_memory_allocated() / 2**30  # eager: no graph pool
            row[f"decode_B{B}_graphed_tok_per_s"] = (_decode_rate(model, prompt, steps, graphed=True)
                                                     if graphable else None)
            row[f"hf_generate_B{B}_tok_per_s"] = _hf_generate_rate(model, prompt, steps)
        from laquant.generate import release_all_graphs

        release_all_graphs(model)
        with torch.no_grad():
            from laquant.adapters import cache_kwargs, returned_cache
            from laquant.generate import _fresh_cache

            cache = returned_cache(model(ids[:, :64], **cache_kwargs(model, _fresh_cache(model)), use_cache=True,
                                         logits_to_keep=1))
        row["state_bytes_per_seq"] = cache_bytes(cache)
        del cache
        if profile is not None:
            torch.cuda.empty_cache()
            row.update(profile_decode_step(model, *profile))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model
        # reference cycles (transformers' modules, the graphs' closures) hold a model's weights until the cyclic
        # collector runs: the next variant's peak memory counted them (a 1.37B Mamba-2's hybrid_int8 peaked at 5.03
        # GiB at B = 1 with the bf16 model's 2.5 GiB still held, 2.53 GiB without; eval/results/mamba2_decode_h200/)
        gc.collect()
        torch.cuda.empty_cache()
    return rows


E2E_PROFILE_KEYS = ("kernels_per_step", "kernels_per_layer", "kernels_outside_layers", "gpu_ms_per_step",
                    "top_kernels", "profile", "peer_path")


def e2e_markdown(rows: list[dict]) -> list[str]:
    """The e2e suite's tables: speeds (one row per variant), then the decode-step profile (kernels
    per step and per layer, GPU time, top kernels) and which path each peer ran."""
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in E2E_PROFILE_KEYS]
    lines = ["## e2e", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |" for r in rows]
    lines.append("")
    profiled = [r for r in rows if r.get("kernels_per_step") is not None]
    if profiled:
        lines += ["### e2e: one eager decode step, torch.profiler (" + profiled[0].get("profile", "") + ")", "",
                  "| model | variant | kernels / step | kernels / layer | kernels outside layers | GPU ms / step "
                  "| top kernels (calls, ms, share) |", "|---|---|---|---|---|---|---|"]
        for r in profiled:
            top = "<br>".join(f"`{n}` ({c}, {ms:.3f}, {share:.0%})" for n, c, ms, share in r.get("top_kernels") or [])
            lines.append(f"| {r['model']} | {r['variant']} | {r['kernels_per_step']} | {_fmt(r.get('kernels_per_layer'))} "
                         f"| {_fmt(r.get('kernels_outside_layers'))} | {_fmt(r['gpu_ms_per_step'])} | {top} |")
        lines.append("")
    peers = [r for r in rows if r.get("peer_path")]
    if peers:
        lines += ["Peers' paths: " + "; ".join(f"**{r['variant']}**: {r['peer_path']}" for r in peers), ""]
    return lines


def best_decode_rate(row: dict, B: int) -> tuple[float | None, bool]:
    """``(tokens/s, graphed)``: the graphed rate where the variant has one, else the eager one."""
    g = row.get(f"decode_B{B}_graphed_tok_per_s")
    if g is not None:
        return g, True
    return row.get(f"decode_B{B}_tok_per_s"), False


def plot_e2e(rows: list[dict], out: Path) -> None:
    """Bars of decode tokens/s per batch size (graphed where the variant has a graph, hatched:
    eager), one bar per variant, and below them prefill tokens/s per variant."""
    import numpy as np

    from laquant.eval.plots import pyplot, save_figure

    batches = sorted({int(k[len("decode_B"):-len("_tok_per_s")]) for r in rows for k in r
                      if k.startswith("decode_B") and k.endswith("_tok_per_s") and "graphed" not in k})
    names = [f"{r['model']} · {r['variant']}" for r in rows]
    fig, (ax, ax2) = pyplot().subplots(2, 1, figsize=(max(7.0, 1.2 * len(batches) * max(1, len(rows)) / 2 + 3),
                                                       4.5 + 0.35 * len(rows)),
                                       gridspec_kw={"height_ratios": [3, max(1.0, 0.35 * len(rows))]})
    width = 0.8 / max(1, len(rows))
    x = np.arange(len(batches))
    for i, (r, name) in enumerate(zip(rows, names)):
        vals, hatches = [], []
        for B in batches:
            v, graphed = best_decode_rate(r, B)
            vals.append(v or 0.0)
            hatches.append("" if graphed else "//")
        bars = ax.bar(x + (i - (len(rows) - 1) / 2) * width, vals, width, label=name)
        for bar, h, v in zip(bars, hatches, vals):
            bar.set_hatch(h)
            if v:
                ax.annotate(f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom",
                            fontsize=6)
    ax.set(xticks=x, xticklabels=[f"B={B}" for B in batches], yscale="log", ylabel="decode tokens/s",
           title="decode tokens/s (solid: CUDA graph, one replay per step; hatched: eager)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    y = np.arange(len(rows))
    prefill = [r.get("prefill_tok_per_s") or 0.0 for r in rows]
    ax2.barh(y, prefill, color=[f"C{i}" for i in range(len(rows))])
    for yi, v in zip(y, prefill):
        ax2.annotate(f" {v:,.0f}", (v, yi), va="center", fontsize=6)
    ax2.set(yticks=y, yticklabels=names, xlabel="prefill tokens/s (one prompt)")
    ax2.invert_yaxis()
    ax2.tick_params(axis="y", labelsize=7)
    save_figure(fig, out)


# ----------------------------------------------------------------------------------------- report
def _fmt(x):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def markdown(result: dict) -> str:
    lines = ["# laquant eval speed", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in result["versions"].items()]
    lines += [f"| copy bandwidth | {result['copy_bandwidth_GBps']:.0f} GB/s |", ""]
    for suite in SUITES:
        rows = result.get(suite)
        if not rows:
            continue
        if suite == "e2e":
            lines += e2e_markdown(rows)
            continue
        keys = list(dict.fromkeys(k for r in rows for k in r))
        lines += [f"## {suite}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)


# per suite: the x column, its label, the curves (column, label) and the panel's title
PANELS = {
    "decode": ("B", "batch", (("laquant_fp8_row_us", "laquant fp8 state"), ("laquant_bf16_us", "laquant bf16"),
                              ("laquant_fp32_us", "laquant fp32"), ("fla_gla_fp32_us", "fla fused_recurrent_gla")),
               "µs per step", "GLA decode step, H=64, K=V=128"),
    "prefill": ("T", "sequence length (B*T = 65,536)",
                (("laquant_ms", "laquant chunk"), ("fla_ms", "fla chunk_gla"), ("sdpa_causal_ms", "SDPA causal"),
                 ("laquant_noncausal_ms", "laquant non-causal"), ("sdpa_noncausal_ms", "SDPA non-causal")),
                "ms", "GLA prefill, H=16, K=V=128, bf16"),
    "delta_decode": ("B", "batch", (("laquant_fp8_row_us", "laquant fp8 state"), ("laquant_bf16_us", "laquant bf16"),
                                    ("laquant_fp32_us", "laquant fp32"), ("fla_fp32_us", "fla fused_recurrent")),
                     "µs per step", "gated delta rule decode, Hv=32, K=V=128"),
    "delta_prefill": ("T", "sequence length (B*T = 65,536)",
                      (("laquant_ms", "laquant chunk"), ("laquant_fp8_roundtrip_ms", "laquant, fp8 state"),
                       ("fla_ms", "fla chunk_gated_delta_rule")),
                      "ms", "gated delta rule prefill, Hv=32, K=V=128, bf16"),
    "kda_decode": ("B", "batch", (("laquant_fp8_row_us", "laquant fp8 state"), ("laquant_bf16_us", "laquant bf16"),
                                  ("laquant_fp32_us", "laquant fp32"), ("fla_fp32_us", "fla fused_recurrent_kda")),
                   "µs per step", "KDA decode, H=32, K=V=128"),
    "kda_prefill": ("T", "sequence length (B*T = 65,536)",
                    (("laquant_ms", "laquant chunk"), ("laquant_fp8_roundtrip_ms", "laquant, fp8 state"),
                     ("fla_ms", "fla chunk_kda")),
                    "ms", "KDA prefill, H=32, K=V=128, bf16"),
}


def plot(result: dict, out: Path) -> None:
    from laquant.eval.plots import pyplot, save_figure

    suites = [s for s in PANELS if result.get(s)]
    fig, axes = pyplot().subplots(1, len(suites), figsize=(5.5 * len(suites), 4), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        x_key, x_label, curves, y_label, title = PANELS[suite]
        rows = result[suite]
        for key, label in curves:
            if key in rows[0]:
                ax.plot([r[x_key] for r in rows], [r[key] for r in rows], marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel=x_label, ylabel=y_label, title=title)
        ax.legend()
    save_figure(fig, out)


def run_speed(out_dir: Path, suites=SUITES, models=("gla-small",), recipe="gla_int8", quick=False,
              checkpoint: str | None = None, baseline: str | None = None, batches=(1, 16, 64),
              prompt_len: int = 4096, steps: int = 32, peers: bool = False, hybrid_recipe: str = "hybrid_int8",
              profile: tuple[int, int] | None = (64, 512), overrides=()) -> dict:
    if not torch.cuda.is_available():
        raise LaquantError("`laquant eval speed` measures GPU kernels and needs a CUDA device; none is visible "
                           "(check `nvidia-smi` and CUDA_VISIBLE_DEVICES)")
    unknown = set(suites) - set(SUITES)
    if unknown:
        raise LaquantError(f"unknown suite(s) {', '.join(sorted(unknown))}; choose from {', '.join(SUITES)}")
    bw = copy_bandwidth()
    result = {"versions": versions(), "copy_bandwidth_GBps": bw / 1e9, "dtype": "bfloat16 inputs, float32 accumulators"}
    if "decode" in suites:
        result["decode"] = bench_decode((1, 64) if quick else (1, 4, 16, 32, 64, 128, 256), bandwidth=bw)
    if "prefill" in suites:
        result["prefill"] = bench_prefill((4096,) if quick else (1024, 2048, 4096, 8192, 16384, 32768, 65536),
                                          bandwidth=bw)
    if "delta_decode" in suites:
        result["delta_decode"] = bench_delta_decode((1, 64) if quick else (1, 4, 16, 64, 256), bandwidth=bw)
    if "delta_prefill" in suites:
        result["delta_prefill"] = bench_delta_prefill((4096,) if quick else (1024, 4096, 16384, 65536), bandwidth=bw,
                                                      peak_tflops=DENSE_BF16_TFLOPS.get(torch.cuda.get_device_name()))
    if "kda_decode" in suites:
        result["kda_decode"] = bench_kda_decode((1, 64) if quick else (1, 16, 64, 256), bandwidth=bw)
    if "kda_prefill" in suites:
        result["kda_prefill"] = bench_kda_prefill((4096,) if quick else (1024, 4096, 16384, 65536), bandwidth=bw)
    if "gemm" in suites:
        result["gemm"] = bench_gemm((1, 2048) if quick else (1, 16, 128, 2048, 8192),
                                    shapes={"square 4096->4096": (4096, 4096)} if quick else None)
    if "e2e" in suites:
        variants = (checkpoint_variants(checkpoint, baseline) if checkpoint
                    else recipe_variants(models, recipe, hybrid_recipe, peers=peers, overrides=overrides))
        result["e2e"] = bench_e2e(variants, prompt_len=512 if quick else prompt_len, batches=batches, steps=steps,
                                  profile=profile)
    from laquant.checkpoint import StagingDir

    with StagingDir(out_dir, overwrite=True) as tmp:
        (tmp / "speed.json").write_text(json.dumps(result, indent=2))
        (tmp / "speed.md").write_text(markdown(result))
        if any(result.get(suite) for suite in PANELS):
            plot(result, tmp / "speed.png")
        if result.get("e2e"):
            plot_e2e(result["e2e"], tmp / "speed_e2e.png")
    return result

