"""batchgen's tests, laid out as the package is: tests/app/ tests batchgen/app/, tests/engine/ tests
batchgen/engine/, and so on; tests of the package's root modules (cli.py, llm.py, config.py, threads.py,
allocator.py) and of the whole layout (test_layout.py, test_skips.py) sit here at the root.

A test module does not import another test module: what several share lives in a helper or
``*_cases.py`` module of their folder, in a conftest.py fixture, or, where folders share it, in
tests/helpers.py (inputs and records of ``batchgen run``) or tests/support/ (tiny random models, FP8
checkpoints, paged-cache logits, chat templates)."""
