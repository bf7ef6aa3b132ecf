"""The two circuits of an attention head, each a factor pair (docs/design.md §2.1).

- ``qk``, query-key: the scores see ``W_Q`` and ``W_K`` only through ``W_Q^T W_K``
  (Lemma 4.1, 4.3, Cor. 4.4);
- ``ov``, output-value: the output sees ``W_V`` and ``W_O`` only through ``W_O W_V``
  (Lemma 4.6).

Torch-free, so that the reports can name the circuits without importing torch.
"""

from __future__ import annotations

CIRCUITS = ("qk", "ov")


def check_circuit(circuit: str) -> str:
    """``circuit`` itself, or ValueError for a name that is not one of :data:`CIRCUITS`."""
    if circuit not in CIRCUITS:
        raise ValueError(f"unknown circuit {circuit!r}; expected one of {CIRCUITS}")
    return circuit
