"""Triton ops fused around the projections: RMSNorm + residual, SiLU-and-multiply, rotary + KV write."""
