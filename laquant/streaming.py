"""Calibrating and saving a model larger than memory (``laquant calibrate --offload`` on laquant's own
families, ``laquant.calibrate_streamed``).

The model is built with its parameters on the meta device. The embeddings, final norm and lm_head
are read from the model's safetensors files (``safe_open`` memory-maps them; no pickle) and stay;
each decoder layer's weights are read when the layer is needed and freed after it. Two passes over
the layers: calibration (every batch through a layer before the next layer, as ``--offload``
always did), then, with the whole model's statistics planned exactly as for a model in memory,
quantization: each layer is read again, quantized and handed to the checkpoint writer, which holds
one output shard at a time. Peak memory: the resident parts, one layer and its quantized copy, the
hidden states of the calibration samples between layers, and one output shard; not the model.
The statistics and the checkpoint are the same, byte for byte, as the whole model's
(``tests/test_streaming.py``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from laquant.checkpoint import _reading, storage_tensor, weight_files
from laquant.errors import LaquantError
from laquant.families import get_family


def streams(model_type: str) -> bool:
    """Whether a model of this type can be calibrated from its files layer by layer: laquant's own
    implementations (transformers' hybrids are calibrated with the model in CPU memory)."""
    return get_family(model_type).native


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device (their buffers stay real), as
    accelerate's ``init_empty_weights(include_buffers=False)``."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _return_freed_memory() -> None:
    """Make glibc give large freed blocks back to the system: its default raises the size above which
    it maps blocks of their own to the largest block freed so far (up to 32 MiB), so the layers'
    tensors, allocated and freed in turn, would stay in the heap and the resident memory would grow
    with every layer. A fixed threshold turns that off (elsewhere than glibc: nothing to do)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: blocks of 1 MiB or more are mapped on their own
    except (OSError, AttributeError):
        pass


def _tensors(module: nn.Module, prefix: str, skip: tuple[str, ...] = ()):
    """``(full name, owner module, attribute, tensor, is_parameter)`` of every parameter and persistent
    buffer under ``module`` (tied ones under each name), outside the subtrees named in ``skip``."""
    for sub_name, sub in module.named_modules(prefix=prefix.rstrip("."), remove_duplicate=False):
        if any(sub_name == s or sub_name.startswith(s + ".") for s in skip):
            continue
        for attr, t in sub._parameters.items():
            if t is not None:
                yield f"{sub_name}.{attr}" if sub_name else attr, sub, attr, t, True
        for attr, t in sub._buffers.items():
            if t is not None and attr not in sub._non_persistent_buffers_set:
                yield f"{sub_name}.{attr}" if sub_name else attr, sub, attr, t, False


def _place(owner: nn.Module, attr: str, t: torch.Tensor, is_param: bool) -> None:
    (owner._parameters if is_param else owner._buffers)[attr] = t


def _stored_bytes(entries) -> int:
    """What :func:`laquant.eval.report.model_bytes` counts for these state entries."""
    return sum(storage_tensor(t, torch.bfloat16).nbytes for _, t, _ in entries)


class WeightStream:
    """A model's weights read from its safetensors files one module at a time."""

    def __init__(self, model_dir: Path):
        from safetensors import safe_open

        self.model_dir = Path(model_dir)
        self.where: dict[str, Path] = {}
        for path in weight_files(self.model_dir):
            with _reading(path), safe_open(str(path), framework="pt") as f:
                self.where.update(dict.fromkeys(f.keys(), path))
        self.bytes: dict[str, int] = {}  # unit ("" for the resident parts) -> its bytes as stored, base model
        self.quantized_bytes: int | None = None  # the quantized model's, once written

    def fetch(self, prefix: str, module: nn.Module, skip: tuple[str, ...] = ()) -> None:
        """Read ``module``'s weights (named ``prefix.*`` in the files) into CPU memory, each in the
        dtype its meta tensor has (as ``from_pretrained`` casts them); tied tensors stay tied."""
        from safetensors import safe_open

        todo = [e for e in _tensors(module, prefix, skip) if e[3].is_meta]
        read: dict[int, torch.Tensor] = {}  # id of a meta tensor -> its value (tied tensors: read once)
        by_file: dict[Path, list] = {}
        for e in todo:
            if e[0] in self.where:
                by_file.setdefault(self.where[e[0]], []).append(e)
        for path, entries in by_file.items():
            with _reading(path), safe_open(str(path), framework="pt") as f:
                for name, _, _, meta, _ in entries:
                    if id(meta) in read:
                        continue
                    t = f.get_tensor(name)
                    if t.shape != meta.shape:
                        raise LaquantError(f"{path}: tensor {name} has shape {tuple(t.shape)}, "
                                           f"expected {tuple(meta.shape)}")
                    read[id(meta)] = t.to(meta.dtype) if meta.is_floating_point() else t
        for name, owner, attr, meta, is_param in todo:
            if id(meta) not in read:
                raise LaquantError(f"{self.model_dir} has no weight {name}; the model folder is incomplete")
            if is_param and not isinstance(read[id(meta)], nn.Parameter):  # one Parameter for all its names
                read[id(meta)] = nn.Parameter(read[id(meta)], requires_grad=meta.requires_grad)
            _place(owner, attr, read[id(meta)], is_param)
        if prefix not in self.bytes:
            self.bytes[prefix] = _stored_bytes((n, t, p) for n, _, _, t, p in _tensors(module, prefix, skip))

    @staticmethod
    def drop(prefix: str, module: nn.Module) -> None:
        """Free ``module``'s weights: back to the meta device."""
        metas: dict[int, torch.Tensor] = {}  # tied tensors stay tied
        for _, owner, attr, t, is_param in list(_tensors(module, prefix)):
            if id(t) not in metas:
                meta = t.to("meta")
                metas[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if is_param else meta
            _place(owner, attr, metas[id(t)], is_param)

    def quantized_entries(self, result, adapter, progress: bool = True):
        """``(name, tensor, is_parameter)`` of the quantized model in its state-dict order, each tensor
        once (what :func:`laquant.checkpoint.write_tensors` writes): each decoder layer read, quantized
        by ``result.decisions`` and freed in turn. Sets ``self.quantized_bytes``."""
        from laquant.quantize import apply

        if self.quantized_bytes is not None:
            raise LaquantError("a streamed calibration result is quantized and written once, by one laquant.save; "
                               "load that checkpoint (laquant.load) to use or save it again")
        model, layers = result.model, adapter.decoder_layers()
        names = {id(layer): name for name, layer in layers}
        inside = tuple(f"{name}." for name, _ in layers)
        apply(model, adapter, result.decisions, result.stats, only=lambda n: not n.startswith(inside))
        self.quantized_bytes = 0
        seen: set[int] = set()  # the resident tensors (alive throughout, so their ids stay theirs)

        def unit(module, prefix):
            state = module.state_dict(prefix=prefix, keep_vars=True)
            params = {prefix + n for n, _ in module.named_parameters(remove_duplicate=False)}
            self.quantized_bytes += _stored_bytes((n, t, n in params) for n, t in state.items())
            local: set[int] = set()
            for name, t in state.items():
                if id(t) not in seen and id(t) not in local:
                    local.add(id(t))
                    yield name, t, name in params
            return local

        def walk(module, prefix, bar):
            if id(module) in names:
                name = names[id(module)]
                self.fetch(name, module)
                apply(model, adapter, result.decisions, result.stats, only=lambda n: n.startswith(name + "."))
                yield from unit(module, prefix)
                self.drop(name, module)
                bar.update(1)
            elif not any(id(m) in names for m in module.modules()):
                seen.update((yield from unit(module, prefix)))
            else:  # holds decoder layers: its own tensors, then its children in order
                own: dict = {}
                module._save_to_state_dict(own, prefix, True)
                for n, t in own.items():
                    is_param = n[len(prefix):] in module._parameters
                    self.quantized_bytes += _stored_bytes([(n, t, is_param)])
                    if id(t) not in seen:
                        seen.add(id(t))
                        yield n, t, is_param
                for child_name, child in module._modules.items():
                    if child is not None:
                        yield from walk(child, f"{prefix}{child_name}.", bar)

        with tqdm(total=len(layers), desc="quantizing and writing layer by layer", unit="layer",
                  disable=not progress, leave=False) as bar:
            yield from walk(model, "", bar)


def calibrate_streamed(model_dir: str | Path, recipe: dict | str, data: torch.Tensor | None = None, stats=None,
                       samples: int = 128, seq_len: int = 2048, seed: int = 0, progress: bool = True,
                       device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, on_units=None):
    """:func:`laquant.calibrate` of the model in ``model_dir`` without loading it whole (see the
    module's doc). Returns a :class:`~laquant.api.Calibrated` whose model is on the meta device and
    whose ``stream`` writes the quantized weights when :func:`laquant.save` asks for them (once)."""
    from laquant.adapters import install
    from laquant.api import Calibrated
    from laquant.calibration.run import calibration_batches, collect_stats
    from laquant.loading import empty_model, read_supported_config, resolve_model_dir
    from laquant.quantize import plan
    from laquant.recipe import for_family, load_recipe

    model_dir = resolve_model_dir(model_dir)
    cfg = read_supported_config(model_dir)
    if not streams(cfg["model_type"]):
        raise LaquantError(f"{cfg['model_type']} models are not streamed from their files layer by layer (only "
                           "laquant's own: gla, gated_deltanet); load the model and use laquant.calibrate")
    recipe = for_family(load_recipe(recipe) if isinstance(recipe, str) else recipe, cfg["model_type"])
    _return_freed_memory()
    with parameters_on_meta():
        model = empty_model(cfg, model_dir, dtype).eval()
    model.config._name_or_path = str(model_dir)  # as from_pretrained records it (config.json keeps it)
    adapter = install(model)
    stream = WeightStream(model_dir)
    layers = tuple(name for name, _ in adapter.decoder_layers())
    stream.fetch("", model, skip=layers)  # embeddings, final norm, lm_head: resident
    if stats is None:
        if data is None:
            raise LaquantError("calibrate needs calibration data (token ids) or saved stats")
        batches = data if data.dim() == 2 else calibration_batches(data, samples, seq_len, seed)
        stats = collect_stats(model, adapter, batches, seed=seed, progress=progress, layerwise_device=device,
                              stream=stream, on_units=on_units)
    elif stats.meta.get("model_type") != model.config.model_type:
        raise LaquantError(f"the statistics were collected on a {stats.meta.get('model_type')!r} model, "
                           f"not {model.config.model_type!r}")
    decisions = plan(adapter, stats, recipe)
    from laquant.api import _record_quantization

    _record_quantization(model, recipe, decisions.to_dict())
    return Calibrated(model, recipe, decisions, stats, stream=stream)
