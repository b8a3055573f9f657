"""Tensor parallelism's orchestration: one model split over K processes (one GPU each; gloo on the CPU).

Rank 0 owns the scheduler, reader, writer and checkpoints. It starts and watches the other ranks
(``launch.py``) and drives them through a control connection: its runner (``rank0_runner.py``) sends each
order as a message (``messages.py``) before running it itself, and every other rank runs the worker loop
(``worker.py``). Every rank builds the same engine rank (``engine/rank_engine.py``) over its own shard of
the weights. This floor sits between ``llm.py``, which starts a job, and the engine it drives.
"""
