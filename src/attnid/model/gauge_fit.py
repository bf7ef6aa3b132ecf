"""Which attention shapes the gauge-fixed parametrisation (:mod:`attnid.model.gauge`) fits, importable
without torch: the pipeline's plan checks every gauge-fixed run's shape when the workflow is parsed, and a
cluster job parses it again, so the check must not cost a torch import (docs/cluster.md)."""

from __future__ import annotations

from attnid.common.errors import UserError
from attnid.theory.shape import LayerShape


def check_gauge_layout(layout: LayerShape) -> None:
    """One line for an attention shape this gauge does not fit."""
    if layout.rope:
        raise UserError(
            "the gauge-fixed parametrisation does not support --rope: the RoPE query-key orbit is the "
            "rotations' commutant, which cannot move a D x D block of W_K to c I "
            "(docs/design.md §14)"
        )
    if layout.head_dim > layout.n_embd:
        raise UserError(
            f"the gauge-fixed parametrisation needs head_dim <= n_embd for a D x D block of W_K and W_V, got "
            f"D = {layout.head_dim} > E = {layout.n_embd}"
        )
