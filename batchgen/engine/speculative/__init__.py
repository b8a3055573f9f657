"""Speculative decoding: guesses verified in one step, accepted while they equal what decoding samples.

``speculator.py`` (what the engine calls: guesses for a step, acceptance), ``ngram.py`` (prompt lookup),
``policy.py`` (when a verify step pays, and how many tokens a row guesses). A new proposer (a draft model,
an EAGLE-style head) is a ``speculator.Proposer``: guesses for a step's rows at once, its per-row state in
``RowDrafts.state``; the verify step, the acceptance and the rollback stay as they are.
"""
