"""What a user chooses among when editing a checkpoint, importable without torch: ``attnid balance
--help`` and ``attnid prune-biases --help`` list these before any module that acts on them (and imports
torch) is loaded."""

from __future__ import annotations

# attnid balance --target: imbalance 0 for every pair (mu = 0), or the I_0 that attnid train stored
BALANCE_TARGETS = ("balanced", "initial")
# --dtype: what an edited Llama-family folder may be stored in instead of its own dtype (a bfloat16 or
# float16 weight is exact in float32); attnid.edits.hf_llama.STORED_DTYPES maps each to its torch dtype
STORED_DTYPE_NAMES = ("float32",)
