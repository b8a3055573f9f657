"""The ``batchgen run`` / ``status`` application on top of the engine: orchestration, threads, signals."""
