"""What ``attnid train`` chooses among in the training layer, importable without torch (see
:mod:`attnid.model.options`)."""

from __future__ import annotations

# --device
DEVICES = ("auto", "cpu", "cuda")
# --dtype, besides auto: the training precisions (attnid.training.precision)
DTYPES = ("bf16", "float32", "float64")
# --rebalance-moments: what happens to the attention weights' AdamW moments at a rebalance
# (attnid.training.moments, docs/design.md §15)
REBALANCE_MOMENTS = ("keep", "transport", "reset")
