"""What ``laquant export`` / ``calibrate --format compressed-tensors`` accept, checked without torch
(the CLI names a wrong choice before the heavy imports)."""

from __future__ import annotations

from laquant.errors import LaquantError
from laquant.families import get_family

OUTLIER_POLICIES = ("requantize", "bf16")  # projections with bf16 outlier columns: requantized, or kept dense


def check_exportable(model_type: str | None, source) -> None:
    """A transformers family (GLA is laquant's and fla's model: no transformers class, no vLLM model)."""
    family = get_family(model_type, f"{source}: model_type")
    if family.native:
        raise LaquantError(
            f"{source}: model_type {model_type!r} is flash-linear-attention's GLA, which neither transformers nor "
            "vLLM has a model class for, so a compressed-tensors checkpoint of it could not be loaded anywhere; "
            "use the laquant checkpoint itself (laquant.load, or AutoModelForCausalLM after `import laquant`)")
