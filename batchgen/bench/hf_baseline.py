"""``python -m batchgen.bench.hf_baseline INPUT OUTPUT``: transformers' ``generate_batch`` as a command.

The baseline side of a whole-command benchmark (B4): what a user would write with transformers alone to do
``batchgen run``'s job: load the model and tokenizer, apply the chat template to each row's prompt, call
``model.generate_batch`` (greedy, EOS disabled, the cache sized for the workload as in ``runners``), and
write one JSON line per row. The last stdout line is a JSON summary (tokens, generation seconds).
"""

from __future__ import annotations

import argparse
import json
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m batchgen.bench.hf_baseline", description=__doc__)
    ap.add_argument("input", help="JSONL with a 'prompt' (string) or 'messages' column")
    ap.add_argument("output", help="JSONL of completions")
    ap.add_argument("--model", help="local directory [the embedded model]")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, help="torch intra-op threads [torch's default]")
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16 [float32]")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from batchgen.bench.runners import run_generate_batch
    from batchgen.model.loader import load_model
    from batchgen.model.tokenize import encode_prompt

    loaded = load_model(args.model, device="cpu", dtype=args.dtype, attn_implementation="sdpa")
    with open(args.input) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    prompts = [encode_prompt(loaded.tokenizer, r.get("messages") or r["prompt"]) for r in rows]
    record = run_generate_batch(
        loaded.model, loaded.tokenizer, prompts, args.max_new_tokens, keep_outputs=True
    )
    _write(args.output, rows, record.pop("outputs"), loaded.tokenizer)
    summary = {k: record[k] for k in ("output_tokens", "wall_s", "errors", "error")}
    print(json.dumps({**summary, "threads": torch.get_num_threads(), "end": time.time()}), flush=True)
    return 0 if record["error"] is None else 1


def _write(path: str, rows: list[dict], outputs: list[list[int]], tokenizer) -> None:
    with open(path, "w") as f:
        for i, (row, ids) in enumerate(zip(rows, outputs, strict=True)):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            f.write(json.dumps({"id": row.get("id", i), "index": i, "completion": text}) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
