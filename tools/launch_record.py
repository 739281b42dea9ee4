"""Every Triton launch a CPU test run makes, recorded for an sm_90 compile without a GPU (``tools/compile_offline.py
--recorded``): the interpreter the CPU suite runs the kernels under does not check what Triton's compiler rejects, and
the hand-picked cases of ``compile_offline.py`` cover only the kernels someone thought of (a prompt short conv that
could never have compiled passed every interpreted test, 2026-12-05).

    PYTHONPATH=tools python -m pytest -q -p launch_record --record-launches /tmp/launches.jsonl [tests ...]
    python tools/compile_offline.py --recorded /tmp/launches.jsonl [--jobs 2]

A launch is recorded by what specializes its compile, not by its data: each tensor's dtype, shape, strides and
whether its address is 16-byte aligned, each other argument's value, and the launch's options. The compile rebuilds
CPU tensors of that layout and specializes them as Triton's JIT does (``sass_mix.compile_like_jit``). Launches that
specialize alike are recorded once. Only laquant's kernels are recorded (the kernels tests define for themselves are
not importable by name).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile

import torch


def _kernel_function(kernel):
    """The Python function under a Triton kernel object (a JIT function, or the interpreter's stand-in)."""
    return getattr(kernel, "fn", kernel)


def encode_value(value):
    """A launch argument as JSON: a tensor by its layout (no data), a dtype by name, anything else as it is."""
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "stride": list(value.stride()), "aligned": value.data_ptr() % 16 == 0}
    if isinstance(value, torch.dtype):
        return {"torch_dtype": str(value).removeprefix("torch.")}
    if type(value).__name__ == "dtype" and hasattr(value, "name") and type(value).__module__.startswith("triton"):
        return {"tl_dtype": value.name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return {"sequence": [encode_value(v) for v in value]}
    raise TypeError(f"cannot record a launch argument of type {type(value).__name__}")


def decode_value(value):
    """:func:`encode_value`'s inverse: a tensor of that dtype, shape, strides and alignment (uninitialized)."""
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        dtype = getattr(torch, value["tensor"])
        size = 1 + sum((n - 1) * s for n, s in zip(value["shape"], value["stride"]) if n > 0)
        item = torch.empty((), dtype=dtype).element_size()
        pad = 0 if value["aligned"] else 1  # one element past a 16-byte boundary: unaligned
        base = torch.empty(size + 16 // item + pad, dtype=dtype)
        skip = (-base.data_ptr() % 16) // item + pad
        return base.as_strided(value["shape"], value["stride"], skip)
    if "torch_dtype" in value:
        return getattr(torch, value["torch_dtype"])
    if "tl_dtype" in value:
        import triton.language as tl

        return tl.dtype(value["tl_dtype"])
    if "sequence" in value:
        return tuple(decode_value(v) for v in value["sequence"])
    raise ValueError(f"not a recorded launch argument: {value}")


def encode_launch(kernel, args: tuple, kwargs: dict) -> dict | None:
    """A launch as JSON (:func:`encode_value` of each argument), or None for a kernel outside laquant."""
    fn = _kernel_function(kernel)
    module = getattr(fn, "__module__", "")
    if not module.startswith("laquant."):
        return None
    return {"kernel": f"{module}:{fn.__qualname__}", "args": [encode_value(a) for a in args],
            "kwargs": {k: encode_value(v) for k, v in sorted(kwargs.items())}}


def decode_launch(record: dict) -> tuple:
    """``(kernel, args, kwargs)`` of a recorded launch, the kernel imported by name (a JIT function where the
    interpreter is off)."""
    module, qualname = record["kernel"].split(":")
    kernel = importlib.import_module(module)
    for part in qualname.split("."):
        kernel = getattr(kernel, part)
    return (kernel, tuple(decode_value(a) for a in record["args"]),
            {k: decode_value(v) for k, v in record["kwargs"].items()})


def read_records(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _holding(function) -> list:
    """The laquant modules whose name ``launch_kernel`` is ``function`` (they imported it by name)."""
    return [m for m in list(sys.modules.values())
            if getattr(m, "__name__", "").startswith("laquant") and getattr(m, "launch_kernel", None) is function]


class Recorder:
    """Wraps ``laquant.kernels.common.launch.launch_kernel`` (and every module's name for it) to keep each distinct
    :func:`encode_launch` of the launches made, in order of first use; :meth:`stop` puts the originals back."""

    def __init__(self):
        from laquant.kernels.common import launch

        self.records: dict[str, dict] = {}
        self.unrecorded: dict[str, str] = {}  # kernel -> why a launch of it could not be recorded
        self._launch, self._real = launch, launch.launch_kernel
        real = self._real

        def recording(kernel, grid, *args, **kwargs):
            try:
                record = encode_launch(kernel, args, kwargs)
            except TypeError as e:
                self.unrecorded[getattr(_kernel_function(kernel), "__qualname__", str(kernel))] = str(e)
                record = None
            if record is not None:
                self.records.setdefault(json.dumps(record, sort_keys=True), record)
            return real(kernel, grid, *args, **kwargs)

        self._recording = recording
        for m in _holding(real):
            m.launch_kernel = recording
        launch.launch_kernel = recording

    def stop(self) -> None:
        for m in _holding(self._recording):
            m.launch_kernel = self._real
        self._launch.launch_kernel = self._real

    def write(self, path: str) -> None:
        """The records as JSON lines, written to a temporary file and moved into place."""
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".partial")
        with os.fdopen(fd, "w") as f:
            for record in self.records.values():
                f.write(json.dumps(record, sort_keys=True) + "\n")
        os.replace(tmp, path)


# the pytest plugin (-p launch_record)
_RECORDER: Recorder | None = None


def pytest_addoption(parser):
    parser.addoption("--record-launches", metavar="PATH", default=None,
                     help="record every laquant Triton launch's specialization into PATH (JSON lines), for "
                          "tools/compile_offline.py --recorded")


def pytest_configure(config):
    global _RECORDER
    if config.getoption("--record-launches"):
        _RECORDER = Recorder()


def pytest_unconfigure(config):
    global _RECORDER
    path = config.getoption("--record-launches")
    if _RECORDER is not None and path:
        _RECORDER.stop()
        _RECORDER.write(path)
        print(f"\nlaunch_record: {len(_RECORDER.records)} distinct launches of "
              f"{len({r['kernel'] for r in _RECORDER.records.values()})} kernels into {path}"
              + (f"; not recorded: {_RECORDER.unrecorded}" if _RECORDER.unrecorded else ""))
        _RECORDER = None
