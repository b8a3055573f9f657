"""Compute kernels by capability; reference.py: the torch oracle and CPU path; fp8_format.py: FP8 types."""
