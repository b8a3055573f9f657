"""Paged attention on CUDA: Triton decode and prefill kernels, KV write, the CUDA FP8 decode kernel."""
