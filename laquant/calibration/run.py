"""The calibration pass: calibration batches through the model with observers attached."""

from __future__ import annotations

import contextlib

import torch
from tqdm.auto import tqdm

from laquant.adapters import cache_kwargs
from laquant.adapters.base import Adapter
from laquant.calibration.observers import MAGNITUDE_LEVELS, GateObserver, ProjectionObserver, StateObserver
from laquant.calibration.stats import Stats
from laquant.errors import LaquantError
from laquant.models.cache import state_store


def calibration_batches(ids: torch.Tensor, samples: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """``samples`` random windows of ``seq_len`` tokens from the 1-D token tensor ``ids``."""
    if samples < 1 or seq_len < 2:
        raise LaquantError(f"--samples must be >= 1 and --seq-len >= 2 (got {samples}, {seq_len})")
    if len(ids) < seq_len:
        raise LaquantError(f"calibration data is too short: {len(ids)} tokens, but --seq-len is {seq_len}; "
                           "use more text or a shorter --seq-len")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len + 1, (samples,), generator=gen)
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def collect_stats(model, adapter, batches: torch.Tensor, segment: int = 256,
                  batch_size: int = 8, seed: int = 0, progress: bool = True,
                  layerwise_device: str | torch.device | None = None, stream=None, on_units=None) -> Stats:
    """Run ``batches [N, L]`` through ``model`` in segments of ``segment`` tokens, carrying the
    recurrent state in a cache, so the state can be read at every segment boundary.

    ``layerwise_device``: the model stays where it is (e.g. on the CPU) and each decoder layer is
    moved to this device in turn, run on every batch, and moved back, as llm-compressor's
    sequential pipeline does: the device holds one layer and one batch's activations, not the
    model. The hidden states between layers wait on the model's device.

    ``stream`` (with ``layerwise_device``): the model's decoder layers are on the meta device and
    ``stream.fetch(name, layer)`` reads each one's weights into CPU memory before it runs,
    ``stream.drop(name, layer)`` frees them after (:mod:`laquant.streaming`). ``on_units(n)``: called
    with the tokens done (a layer's share of them, layer by layer), for the job's progress."""
    tick = on_units or (lambda n: None)
    # lm_head and the softmax-attention projections are observed too, so the same statistics serve
    # recipes that keep them and those that quantize them
    observed = {**adapter.projections(), **adapter.attention_projections(),
                **{n: adapter.module(n) for n in adapter.kept()["lm_head"]}}
    proj = {n: ProjectionObserver(n, m) for n, m in observed.items()}
    gates = {n: GateObserver(n, lambda y, n=n: adapter.gate_log_decay(n, y), adapter.gate_channels(n))
             for n in adapter.gates()}
    mixers = adapter.mixers()
    states = {n: StateObserver(n) for n in mixers}
    handles = {n: adapter.module(n).register_forward_pre_hook(o) for n, o in proj.items()}
    handles.update({n: adapter.module(n).register_forward_hook(o) for n, o in gates.items()})
    done: dict[str, dict] = {}  # results of the observers of layers already calibrated (layer by layer)
    n, length = batches.shape

    def finish_layer(layer_name: str) -> None:
        """The layer's observers give their results now and are freed (their histograms are sized by
        the layer's channels: kept for every layer, they would add up to a good part of the model)."""
        for group in (proj, gates, states):
            for name in [k for k in group if k.startswith(layer_name + ".") and k not in done]:
                if name in handles:
                    handles.pop(name).remove()
                done[name] = group[name].result()
                group[name] = None

    def observe_states(cache, end: int, layer_idx: int | None = None) -> None:
        for name, info in mixers.items():
            if layer_idx is None or info.layer_idx == layer_idx:
                stored = state_store(cache).get(info.layer_idx)
                states[name].observe(end, adapter.module(name).state_quantizer.load(stored.data, stored.scale))

    def run_whole(device) -> None:
        steps = -(-n // batch_size) * -(-length // segment)
        with tqdm(total=steps, desc="calibrating", unit="seg", disable=not progress, leave=False) as bar:
            for i in range(0, n, batch_size):
                batch = batches[i:i + batch_size].to(device)
                cache = adapter.new_cache()
                for start in range(0, length, segment):
                    end = min(start + segment, length)
                    logits = model(input_ids=batch[:, start:end], **cache_kwargs(model, cache), use_cache=True).logits
                    _check_finite(logits, "the model's logits")
                    observe_states(cache, end)
                    bar.update(1)
                    tick(batch.shape[0] * (end - start))

    try:
        if layerwise_device is None:
            run_whole(next(model.parameters()).device)
        elif stream is not None or type(adapter).run_layer is not Adapter.run_layer:
            _run_layerwise(model, adapter, batches, torch.device(layerwise_device), segment, batch_size,
                           observe_states, progress, stream, tick, finish_layer)
        else:
            with _onloaded(model, adapter, torch.device(layerwise_device)):
                run_whole(torch.device(layerwise_device))
    finally:
        for h in handles.values():
            h.remove()

    tensors = {}
    for group in (proj, gates, states):
        for name, obs in group.items():
            result = done[name] if name in done else obs.result()
            tensors.update({f"{name}/{k}": v.float().contiguous().cpu() for k, v in result.items()})
    meta = {
        "model_type": model.config.model_type, "samples": n, "seq_len": length, "segment": segment,
        "magnitude_levels": MAGNITUDE_LEVELS.tolist(), "seed": seed,
        "roles": {"projections": list(proj), "gates": list(gates), "mixers": list(mixers)},
        "mixers": {k: vars(v) for k, v in mixers.items()},
    }
    return Stats(tensors, meta)


def _check_finite(x: torch.Tensor, what: str) -> None:
    if not torch.isfinite(x).all():
        raise LaquantError(f"NaN/Inf in {what} during calibration")


@contextlib.contextmanager
def _onloaded(model, adapter, device):
    """The model waits where it is; each decoder layer moves to ``device`` for its forward and back
    after it (accelerate's CPU offload, by hooks), everything else (embeddings, final norm, lm_head,
    rotary tables) sits on ``device`` for the run. For adapters without ``run_layer``: the layers are
    onloaded once per segment rather than once in all, slower but the same peak memory."""
    home = next(model.parameters()).device
    layers = [layer for _, layer in adapter.decoder_layers()]
    layer_ids = {id(m) for layer in layers for m in layer.modules()}
    rest = [m for m in model.modules() if id(m) not in layer_ids and not any(True for _ in m.children())]

    def onload(module, args):
        module.to(device)

    def offload(module, args, output):
        module.to(home)

    handles = []
    for layer in layers:
        handles += [layer.register_forward_pre_hook(onload), layer.register_forward_hook(offload)]
    for m in rest:
        m.to(device)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        model.to(home)


def _run_layerwise(model, adapter, batches, device, segment, batch_size, observe_states, progress, stream=None,
                   tick=lambda n: None, finish_layer=lambda name: None):
    """One decoder layer on ``device`` at a time; every batch through it before the next layer."""
    home = torch.device("cpu") if stream is not None else next(model.parameters()).device
    n, length = batches.shape
    layers = adapter.decoder_layers()
    with tqdm(total=len(layers) + 2, desc="calibrating layer by layer", unit="layer", disable=not progress,
              leave=False) as bar:
        embeddings = model.get_input_embeddings().to(device)
        hidden = [adapter.embed(batches[i:i + batch_size].to(device)).to(home) for i in range(0, n, batch_size)]
        embeddings.to(home)
        bar.update(1)
        for layer_idx, (layer_name, layer) in enumerate(layers):
            if stream is not None:
                stream.fetch(layer_name, layer)
            layer.to(device)
            for j, h in enumerate(hidden):
                cache = adapter.new_cache()
                outs = []
                for start in range(0, length, segment):
                    end = min(start + segment, length)
                    out = adapter.run_layer(layer, h[:, start:end].to(device), cache)
                    _check_finite(out, f"layer {layer_idx}'s output")
                    observe_states(cache, end, layer_idx)
                    outs.append(out.to(home))
                hidden[j] = torch.cat(outs, 1)
                tick(h.shape[0] * length / len(layers))
            layer.to(home)
            finish_layer(layer_name)
            if stream is not None:
                stream.drop(layer_name, layer)
            bar.update(1)
        head = adapter.head_modules()
        for m in head:
            m.to(device)
        for h in hidden:  # the lm_head's observer sees its inputs here
            for start in range(0, length, segment):
                x = h[:, start:start + segment].to(device)
                for m in head:
                    x = m(x)
                _check_finite(x, "the model's logits")
        for m in head:
            m.to(home)
        bar.update(1)
