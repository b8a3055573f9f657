"""Weights: where they come from (``sources``) and how a projection stores and multiplies them
(``formats``: dense today; quantized formats beside it)."""
