"""Triton kernels of the sampler: the greedy argmax and the fused penalties, min-p and draw."""
