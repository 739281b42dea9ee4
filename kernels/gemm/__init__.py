"""int8 GEMM with an LLM.int8-style outlier split."""
