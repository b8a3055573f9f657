"""FP8 matrix products on CUDA: activation quantization, pointer and TMA kernels, split-K sums."""
