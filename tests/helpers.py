"""What the end-to-end tests of ``batchgen run`` share: a small mixed input, the fields of a record, and
writing inputs / reading outputs in both formats."""

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
ROWS = [
    {"id": "a", "prompt": "Hello there, how are you?", "topic": "greet"},
    {"id": "b", "messages": CHAT, "topic": "chat"},
    {"id": "c", "prompt": "Count to five:", "max_new_tokens": 2, "topic": "count"},
    {"id": "d", "prompt": "Tell me a story about a fox.", "topic": "story"},
    {"id": "e", "prompt": "Why is the sea salty?", "topic": "science"},
]


FIELDS = ["id", "index", "sample", "completion", "finish_reason", "prompt_tokens", "completion_tokens"]


def write_jsonl(path, rows):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return str(path)


def write_parquet(path, rows):
    cols = list(dict.fromkeys(k for r in rows for k in r))
    pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), path, row_group_size=2)
    return str(path)


def read_records(path):
    if str(path).endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    return [orjson.loads(line) for line in open(path, "rb")]


def by_index(records):
    return sorted(records, key=lambda r: (r["index"], r["sample"]))
