"""A checkpoint directory read without transformers: ``config.json`` (``checkpoint_config.py``), the
tokenizer and its chat template (``tokenizer.py``, ``chat_template.py``). A ``batchgen run`` of a model
batchgen's fused forward runs then starts without importing transformers (seconds of a CPU process's
start-up); anything these readers cannot reproduce exactly returns None, and the caller loads it through
transformers."""
