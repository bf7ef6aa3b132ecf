"""What a user chooses among when editing a checkpoint, importable without torch: ``attnid balance
--help`` and ``attnid prune-biases --help`` list these before any module that acts on them (and imports
torch) is loaded."""

from __future__ import annotations

# attnid balance --target: imbalance 0 for every pair (mu = 0), or the I_0 that attnid train stored
BALANCE_TARGETS = ("balanced", "initial")
# --dtype: what an edited Llama-family folder may be stored in instead of its own dtype (a bfloat16 or
# float16 weight is exact in float32); attnid.edits.hf_llama.STORED_DTYPES maps each to its torch dtype
STORED_DTYPE_NAMES = ("float32",)
# attnid rotate --moves: the function-preserving moves it can make, in the order it makes them
# (docs/design.md §16); residual implies fuse-norms
ROTATE_MOVES = ("fuse-norms", "residual", "qk", "ov", "smooth")
# --residual: QuaRot's randomized Hadamard transform, or a Haar-random rotation
RESIDUAL_KINDS = ("hadamard", "random")
# --ov / --qk: attnid's choice on calibration text, or a seeded random element of the group
# (--ov hadamard: a randomized Hadamard rotation per group, QuaRot's R2)
OV_KINDS = ("optimized", "hadamard", "random")
QK_KINDS = ("optimized", "random")
# attnid quant-report's settings when none are named
DEFAULT_QUANT_SETTINGS = ("W4", "W8", "A4", "A8", "KV4", "KV3")
