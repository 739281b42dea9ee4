"""A fused forward laquant gives a transformers module class, checked against the class's own forward at the class's
first use in a process: a transformers release may change a formula under the same class name
(:mod:`laquant.models.fused_moe`, :mod:`laquant.models.fused_rotary`)."""

from __future__ import annotations

import warnings

import torch

from laquant.models.quantizing_rowwise import original_class


def outputs_agree(ours: torch.Tensor, theirs: torch.Tensor) -> str | None:
    """Why the output ``ours`` is not transformers' ``theirs`` (the whole output's relative error above an ulp of a
    16-bit dtype, eight of float32); None if it is."""
    if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
        return f"output {ours.dtype} {tuple(ours.shape)} against {theirs.dtype} {tuple(theirs.shape)}"
    err = ((ours.float() - theirs.float()).norm() / theirs.float().norm().clamp_min(1e-30)).item()
    tol = (8 if ours.dtype == torch.float32 else 1) * torch.finfo(ours.dtype).eps
    return None if err <= tol else f"output off by {err:.2e} (relative)"


def checked_forward(module, inputs: torch.Tensor, fused, original, agree, checks: dict):
    """``fused()``'s result where ``module``'s class reproduces transformers' forward (``original()``), checked at
    the class's first use in the process (``checks``, class -> whether it did: ``agree(ours, theirs)``, transformers'
    forward run first); ``original()``'s where it does not, or inside a stream capture before the check."""
    cls = original_class(module)
    state = checks.get(cls)
    if state is True:
        return fused()
    if state is False or (inputs.is_cuda and torch.cuda.is_current_stream_capturing()):  # the check synchronizes
        return original()
    theirs = original()
    ours = fused()
    why = agree(ours, theirs)
    checks[cls] = why is None
    if why is None:
        return ours
    import transformers

    warnings.warn(f"laquant's fused forward of {cls.__name__} does not reproduce its forward in transformers "
                  f"{transformers.__version__} ({why}); it keeps transformers' forward", stacklevel=3)
    return theirs
