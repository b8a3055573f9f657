"""Triton kernels of the mixture-of-experts layer: token grouping, grouped products, the combine."""
