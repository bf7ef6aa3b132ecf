"""Measurement on a model: ρ, β, τ, μ (:mod:`.metrics`), the exact first/second-order drift split
(:mod:`.drift`), τ across orbit moves (:mod:`.rebalancing`) and what ``attnid inspect`` reports
(:mod:`.inspect`). May import: ``model``, ``theory``, ``common``."""
