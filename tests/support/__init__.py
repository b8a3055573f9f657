"""Test support shared across tests/ folders (and the scripts): tiny random models built from real configs
(no download), FP8 checkpoints, paged-cache logits, thinking models and chat template cases."""
