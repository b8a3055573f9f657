"""Tensor-parallel primitives the model is built from: the process group and its collectives
(``group.py``), which rows of each weight a rank holds (``shard.py``) and the layers whose ranks combine
their results (``layers.py``). This floor imports nothing of the model, the engine or above; starting
ranks and driving them lives in ``batchgen/tensor_parallel/``.
"""
