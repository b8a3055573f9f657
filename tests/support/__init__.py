"""Helpers for tests and benchmarks: tiny random models built from real configs (no download)."""
