"""What ``attnid train`` chooses among in the model layer, importable without torch: its ``--help`` and
the pipeline config's schema (:mod:`attnid.plan.schema`) list these before any module that acts on them
(and imports torch) is loaded."""

from __future__ import annotations

# --rebalance-target: the imbalance a rebalance restores, I_0 or 0 (docs/design.md §4)
REBALANCE_TARGETS = ("initial", "balanced")
# --initial-point: where training starts on the orbit, and where the gauge arm's blocks are fixed: at the
# initialisation's own values, or at the gauge point (moved there along the orbit, each block c I; §14)
GAUGE_POINT, INITIAL_VALUES = "gauge", "init"
INITIAL_POINTS = (INITIAL_VALUES, GAUGE_POINT)
