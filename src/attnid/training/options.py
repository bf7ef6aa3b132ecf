"""What ``attnid train`` chooses among in the training layer, importable without torch (see
:mod:`attnid.model.options`)."""

from __future__ import annotations

# --device
DEVICES = ("auto", "cpu", "cuda")
# --dtype, besides auto: the training precisions (attnid.training.precision)
DTYPES = ("bf16", "float32", "float64")
# --rebalance-moments: what happens to the attention weights' AdamW moments at a rebalance
# (attnid.training.moments, docs/design.md §15)
REBALANCE_MOMENTS = ("keep", "first-moment", "reset")
# Retired values of --rebalance-moments: each gives one line that says what to use instead
RETIRED_MOMENTS = {
    "transport": "--rebalance-moments transport was retired: its map of the second moment is exact only for "
    "diagonal moves (docs/design.md §15); use first-moment (the first moment mapped with the move, the "
    "second kept) or reset",
}
