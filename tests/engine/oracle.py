"""The correctness oracle: transformers' own generate, one prompt at a time, greedy, float32."""

from __future__ import annotations

import random

import torch

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "have",
    "has",
    "had",
    "river",
    "mountain",
    "city",
    "number",
    "water",
    "light",
    "music",
    "history",
    "science",
    "garden",
    "paper",
    "window",
    "market",
    "question",
    "answer",
    "simple",
    "quickly",
    "under",
    "between",
    "because",
    "morning",
    "evening",
    "travel",
    "letter",
    "story",
    "animal",
    "winter",
]

SYSTEM_PROMPT = (
    "You are a careful assistant. Answer briefly and precisely. Never invent facts. If a question is "
    "ambiguous, say which reading you chose. Prefer plain words over jargon, and numbers over adjectives."
)


def make_prompts(tokenizer, count: int = 32, max_tokens: int = 1000, seed: int = 0) -> list[list[int]]:
    """``count`` token-id prompts of mixed lengths (1 .. ~max_tokens), plain and chat-templated."""
    rng = random.Random(seed)
    lengths = [1, 2, 5, max_tokens] + [rng.choice([rng.randint(3, 60), rng.randint(60, max_tokens)])
                                        for _ in range(count - 4)]  # fmt: skip
    prompts = []
    for i, n in enumerate(lengths):
        text = " ".join(rng.choice(WORDS) for _ in range(n))
        if i % 3 == 2:  # chat rows
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        else:
            ids = tokenizer.encode(text, add_special_tokens=False)
        prompts.append([int(t) for t in ids[: max(n, 1)]] if i % 3 != 2 else [int(t) for t in ids])
    return prompts


def with_system_prompt(tokenizer, prompts_text: list[str]) -> list[list[int]]:
    out = []
    for text in prompts_text:
        ids = tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
        )
        out.append([int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)])
    return out


def reference_greedy(
    model_path: str, prompts: list[list[int]], max_new_tokens: int, device: str = "cpu"
) -> list[list[int]]:
    """transformers generate, one prompt at a time, greedy, stopping at the model's EOS."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    return generate_greedy(model, prompts, max_new_tokens)


def generate_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """``reference_greedy`` on a model already in memory (on its own device and dtype)."""
    device = next(model.parameters()).device
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(
                torch.tensor([ids], device=device),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
            outputs.append(out[0, len(ids) :].tolist())
    return outputs
