"""Weights: where they come from (``sources``) and how a projection stores and multiplies them
(``formats``: dense; ``fp8``: e4m3 quantized at load; ``fp8_checkpoint``: pre-quantized FP8 checkpoints)."""
