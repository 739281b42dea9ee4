"""The state formats' names, importable without torch (recipes are checked before torch loads).
:mod:`.formats` holds the rows and checks at import that they are these, in this order."""

STATE_FORMATS = ("fp32", "bf16", "fp8_row", "fp8_head", "fp8_tensor", "int8_row", "int4_row")
SCALED_STATE_FORMATS = ("fp8_row", "fp8_head", "fp8_tensor", "int8_row", "int4_row")  # those with float32 scales
ROUNDINGS = ("nearest", "stochastic")  # how a state is rounded to its format when stored
# a verify step's outputs (speculative decoding, kernels/common/pool_steps.py): the state rounded to its format
# after every token as the decode steps round it, or held in float32 between the tokens as a prefill holds it
VERIFY_NUMERICS = ("decode", "prefill")
