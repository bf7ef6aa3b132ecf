"""attnid: reproducible pipeline for *Multi-Head Self Attention is a Parameter
Identification Mechanism* (W. R. Morrow, arXiv:2609.01231).

The package is layered; a layer imports only the layers below it (``import-linter``
checks this in the tests, docs/design.md §6 maps every module):

- ``cli``       the ``attnid`` command line (top)
- ``reports``   tables, claims, figures, the LaTeX appendix
  ``edits``     reading user checkpoints safely; function-preserving edits
- ``plan``      what a pipeline config trains: every run and its settings, the config's checks
- ``training``  data, the optimizer cases, the training loop, the run directory
- ``measure``   ρ, β, τ, μ and the exact drift split, measured on a model
- ``model``     the nanoGPT-compatible GPT, its factor pairs and orbit moves
- ``theory``    factor-pair geometry, orbit types, closed-form counts, the nullity check
- ``common``    errors, file handling and the output rule, shapes, memory, progress (bottom)
"""

__version__ = "0.1.0"
