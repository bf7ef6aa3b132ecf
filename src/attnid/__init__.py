"""attnid: reproducible pipeline for *Multi-Head Self Attention is a Parameter
Identification Mechanism* (W. R. Morrow, arXiv:2609.01231).

Modules, one concern each (see ``docs/design.md`` §6):

- ``counts``    closed-form parameter counts (T1-T6)
- ``nullity``   Jacobian-nullity verification of those counts
- ``latex``     jinja2 rendering of the LaTeX appendix
- ``symmetry``  one head's factor pairs and the GL_D geometry: tangent projection, rebalancing (§2, §4)
- ``orbits``    the orbit of each architecture (MHA, GQA, RoPE): a model's pairs, rho/beta/mu maths,
                and every orbit move of a model (rebalancing, the tau probe's move) (docs/design.md §8)
- ``orbit``     tau measured across a training run's orbit moves
- ``drift``     the exact first/second-order split of the imbalance drift (docs/design.md §7)
- ``precision`` training dtype policy: bf16 / float32 / float64, TF32 off for metrics
- ``checkpoints`` / ``edits`` / ``hf_config``  reading user checkpoints safely; bias pruning and balancing (§9)
- ``gpu_slots`` one training job per GPU on a multi-GPU machine
- ``metrics``   rho, beta, tau, mu (docs/design.md §3)
- ``model``     nanoGPT-compatible GPT
- ``data``      fetch + character-level prepare
- ``cases``     the optimizer cases: one record each (optimizer, default lr, plot style)
- ``config``    the options of ``attnid train`` (flags, --config file, validation)
- ``train``     the training loop
- ``batches``   training and eval batches
- ``rundir``    the run directory: metrics.csv, run.json, ckpt.pt, finding and loading runs
- ``tables`` / ``figures``  gathering runs into tables and figures 1-5
- ``cli``       the ``attnid`` command line
"""

__version__ = "0.1.0"
