"""Measurement on a model: ρ, β, τ, μ (:mod:`.metrics`), the exact first/second-order drift split
(:mod:`.drift`), τ across orbit moves (:mod:`.rebalancing`) and what ``attnid inspect`` reports
(:mod:`.inspect`), the loss barrier of a line between two models (:mod:`.line`). May import:
``model``, ``theory``, ``common``."""
