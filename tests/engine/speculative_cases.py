"""Speculative decoding tests' shared inputs: the options that verify guesses at every step, and prompts
whose continuation meets n-grams of the prompt."""

from __future__ import annotations

import random

# every step verifies guesses (no timing policy), suffixes down to one token looked up
SPECULATE = dict(speculative="ngram", speculative_policy="always", ngram_min=1)


def copying_prompts(count: int, seed: int) -> list[list[int]]:
    """Token-id prompts that repeat a random phrase, so that a random model's output meets n-grams of
    its prompt (guesses to verify), of 10-150 tokens."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        phrase = [rng.randrange(10, 400) for _ in range(rng.randrange(3, 25))]
        prompts.append((phrase * 12)[: rng.randrange(10, 150)])
    return prompts
