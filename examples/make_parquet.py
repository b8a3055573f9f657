"""Build the Parquet examples: prompts.parquet (from prompts.jsonl) and questions.parquet (for --template).

python examples/make_parquet.py
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent
QUESTIONS = [
    ("q1", "geography", "Which river flows through Cairo?"),
    ("q2", "science", "Why is the sky blue?"),
    ("q3", "history", "Who built the first printing press in Europe?"),
    ("q4", "math", "What is the square root of 144?"),
    ("q5", "language", "What is the plural of 'mouse'?"),
    ("q6", "science", "What gas do plants absorb from the air?"),
]


def main() -> None:
    rows = [orjson.loads(line) for line in (HERE / "prompts.jsonl").read_bytes().splitlines() if line.strip()]
    # Small row groups so that even this tiny file shows row-group-by-row-group reading.
    columns = list(dict.fromkeys(k for r in rows for k in r))  # from_pylist alone keeps row 0's keys only
    table = pa.table({c: [r.get(c) for r in rows] for c in columns})
    pq.write_table(table, HERE / "prompts.parquet", row_group_size=8)
    questions = pa.table(
        {
            "qid": [q[0] for q in QUESTIONS],
            "topic": [q[1] for q in QUESTIONS],
            "question": [q[2] for q in QUESTIONS],
        }
    )
    pq.write_table(questions, HERE / "questions.parquet")
    print(f"wrote {HERE / 'prompts.parquet'} ({len(rows)} rows) and {HERE / 'questions.parquet'}")


if __name__ == "__main__":
    main()
