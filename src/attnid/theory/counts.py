"""Closed-form counts of (un)identified attention parameters (claims T1-T6).

Notation (docs/design.md §1): embedding ``E = n_embd``, query heads ``H = n_head``,
key/value groups ``G = n_kv_head`` (``G = H`` is plain multi-head attention,
``G = 1`` multi-query), query/key width ``D = head_dim``, value width
``C = value_dim`` (``D = C = E/H`` by default). Query head ``h`` reads the keys
and values of group ``h // (H/G)``.

Every count here is the dimension of the set of parameter directions that leave
the attention layer's function unchanged (the nullity of the Jacobian of
parameters -> outputs at a generic point); ``attnid verify`` (nullity.py)
checks each formula against that Jacobian numerically.

Where the counts come from:

* A factor pair ``(A, B)``, ``A in R^{D x n_a}``, ``B in R^{D x n_b}``, that
  acts only through ``A^T B`` loses ``D^2`` parameters to ``A -> S A``,
  ``B -> S^{-T} B`` when ``D <= min(n_a, n_b)`` (Lemma 4.1, 4.3, Cor. 4.4).
* Query-key: each key group is one pair, ``A`` = the group's query heads
  side by side, ``B`` = its shared keys, so GQA leaves ``G D^2`` (§4.9).
  RoPE puts a relative rotation ``R_{j-i}`` between query and key; only
  ``S`` that commute with every rotation survive: ``D/2`` blocks ``a I + b J``,
  i.e. ``D`` per group (Prop. 4.8).
* Output-value: same per key/value group with the group's output columns
  stacked: ``G C^2`` (Lemma 4.6; with GQA the shared value is the pair's
  one side, so it is per group, not per head).
* Biases (§4.7): a key bias adds a per-query constant to every score of that
  query, which softmax cancels: ``G D`` unidentified. With RoPE it does not:
  ``q_i^T R_{j-i} b_K`` changes with the key position ``j``, so RoPE key biases
  are identified (0 unidentified). A value bias reaches the output only as
  ``sum_h W_O^h b_V^{g(h)}`` (attention rows sum to one) plus the output bias:
  with an output bias all ``G C`` value biases are unidentified; without one
  only ``max(0, G C - E)`` are (the kernel of that linear map).
* §4.10 (T6): the paper's single head has ``W_Q``, ``W_K`` and a square value
  layer, all ``E_0 x E_0``, and no output projection: ``3 E_0^2`` parameters,
  ``E_0^2`` unidentified (its query-key pair). The embedding ``E_0`` that
  matches a multi-head layer comes in two readings (docs/design.md §10):
  :func:`single_head_match_equal_identified` (the counts as stated) and
  :func:`single_head_match_half_identified` (the one that gives the paper's
  "roughly 60 %").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class LayerShape:
    """The shape of one attention layer; build it with :func:`layer_shape`."""

    n_embd: int  # E
    n_head: int  # H, query heads
    n_kv_head: int  # G, key/value groups; divides H
    head_dim: int  # D, query/key width per head
    value_dim: int  # C, value width per head
    rope: bool  # rotary position embedding on queries and keys
    bias: bool  # biases on the query, key and value projections
    out_bias: bool  # bias on the output projection


def layer_shape(
    n_embd: int,
    n_head: int,
    n_kv_head: int | None = None,
    head_dim: int | None = None,
    value_dim: int | None = None,
    rope: bool = False,
    bias: bool = False,
    out_bias: bool | None = None,
) -> LayerShape:
    """Fill the defaults (``G = H``, ``D = E/H``, ``C = D``, output bias = ``bias``) and validate.

    Raises ValueError for shapes the formulas do not cover (``D > E`` or
    ``C > E``, ``G`` not dividing ``H``, odd ``D`` with RoPE).
    """
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    if head_dim is None:
        if n_head <= 0 or n_embd % n_head:
            raise ValueError(f"head_dim not given and n_embd={n_embd} is not a multiple of n_head={n_head}")
        head_dim = n_embd // n_head
    value_dim = head_dim if value_dim is None else value_dim
    out_bias = bias if out_bias is None else out_bias
    for name, value in (
        ("n_embd", n_embd),
        ("n_head", n_head),
        ("n_kv_head", n_kv_head),
        ("head_dim", head_dim),
        ("value_dim", value_dim),
    ):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_head % n_kv_head:
        raise ValueError(f"n_kv_head={n_kv_head} must divide n_head={n_head}")
    if head_dim > n_embd or value_dim > n_embd:
        # Wider-than-embedding heads have a different (rank-deficient) count; no real model has them.
        raise ValueError(f"head_dim={head_dim} and value_dim={value_dim} must not exceed n_embd={n_embd}")
    if rope and head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return LayerShape(
        int(n_embd),
        int(n_head),
        int(n_kv_head),
        int(head_dim),
        int(value_dim),
        bool(rope),
        bool(bias),
        bool(out_bias),
    )


# ---------------------------------------------------------------------------------------------
# The building block


def factor_pair_nullity(rank_dim: int, n_a: int, n_b: int) -> int:
    """Unidentified parameters of a factor pair ``A in R^{D x n_a}``, ``B in R^{D x n_b}`` seen through
    ``A^T B``.

    Lemma 4.1 / 4.3 and Cor. 4.4: the product is invariant under ``A -> S A``,
    ``B -> S^{-T} B``, ``S in GL_D``, so ``D^2`` of the ``D (n_a + n_b)``
    parameters are unidentified when ``D <= min(n_a, n_b)``. In general the
    products form the rank-``r`` matrices, ``r = min(D, n_a, n_b)``, a manifold of
    dimension ``r (n_a + n_b - r)``; the nullity is what is left over.
    """
    rank = min(rank_dim, n_a, n_b)
    return rank_dim * (n_a + n_b) - rank * (n_a + n_b - rank)


def rope_commutant_dim(head_dim: int) -> int:
    """Dimension of the matrices commuting with every RoPE rotation of one head (Prop. 4.8).

    The rotations are ``D/2`` planar blocks with distinct frequencies; a matrix
    commuting with all of them is block diagonal with blocks ``a I + b J`` (a
    complex scalar per plane): 2 numbers per block, ``D`` in all.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return head_dim


# ---------------------------------------------------------------------------------------------
# Per-layer counts


def attention_weights_per_layer(shape: LayerShape) -> int:
    """Weights of W_Q (HD x E), W_K (GD x E), W_V (GC x E), W_O (E x HC); ``4 E^2`` for plain MHA (§4.5)."""
    e, h, g, d, c = shape.n_embd, shape.n_head, shape.n_kv_head, shape.head_dim, shape.value_dim
    return e * (h * d + g * d + g * c + h * c)


def attention_biases_per_layer(shape: LayerShape) -> int:
    """Biases b_Q (HD), b_K (GD), b_V (GC) if ``bias``, and b_O (E) if ``out_bias``."""
    qkv = shape.n_head * shape.head_dim + shape.n_kv_head * (shape.head_dim + shape.value_dim)
    return (qkv if shape.bias else 0) + (shape.n_embd if shape.out_bias else 0)


def attention_params_per_layer(shape: LayerShape) -> int:
    return attention_weights_per_layer(shape) + attention_biases_per_layer(shape)


def unidentified_qk_params(shape: LayerShape) -> int:
    """Unidentified query-key parameters of one layer (T1, T5).

    Lemma 4.3 / Cor. 4.4: ``D^2`` per key group (``H D^2`` for MHA, ``G D^2``
    with GQA, §4.9: a group's shared key moves with one ``S`` for all its query
    heads). With RoPE only ``S`` commuting with the rotations survive: ``D`` per
    group (Prop. 4.8). A query bias is one more column of the query side of the
    pair and does not change the count.
    """
    if shape.rope:
        return shape.n_kv_head * rope_commutant_dim(shape.head_dim)
    heads_per_group = shape.n_head // shape.n_kv_head
    query_columns = heads_per_group * (shape.n_embd + (1 if shape.bias else 0))
    return shape.n_kv_head * factor_pair_nullity(shape.head_dim, query_columns, shape.n_embd)


def unidentified_ov_params(shape: LayerShape) -> int:
    """Unidentified output-value weights of one layer (T2, Lemma 4.6).

    ``C^2`` per key/value group: the group's value ``W_V^g`` (C x E) is one side
    of the pair, the output columns ``W_O^h`` of all its heads stacked the other,
    so GQA's shared values give ``G C^2``, not ``H C^2``.
    """
    heads_per_group = shape.n_head // shape.n_kv_head
    return shape.n_kv_head * factor_pair_nullity(
        shape.value_dim, shape.n_embd, heads_per_group * shape.n_embd
    )


def unidentified_key_bias_params(shape: LayerShape) -> int:
    """Key biases with no effect (T4, §4.7): all ``G D`` without RoPE, none with RoPE.

    Without RoPE, ``q_i . b_K`` is the same for every key ``j`` of query ``i``,
    and softmax is blind to a per-row constant. With RoPE the term is
    ``q_i^T R_{j-i} b_K``, which varies with ``j`` (every RoPE frequency is
    nonzero), so the key bias is identified.
    """
    if not shape.bias or shape.rope:
        return 0
    return shape.n_kv_head * shape.head_dim


def unidentified_value_bias_params(shape: LayerShape) -> int:
    """Value biases lost in pooling (T4, §4.7).

    Attention rows sum to one, so the value biases reach the output only as the
    constant ``b_O + sum_h W_O^h b_V^{g(h)}`` (an E-vector). With an output bias
    all ``G C`` value biases are redundant; without one the redundant ones are
    the kernel of ``b_V -> sum_h W_O^h b_V^{g(h)}``: ``max(0, G C - E)``.
    """
    if not shape.bias:
        return 0
    value_biases = shape.n_kv_head * shape.value_dim
    return value_biases if shape.out_bias else max(0, value_biases - shape.n_embd)


def unidentified_bias_params(shape: LayerShape) -> int:
    return unidentified_key_bias_params(shape) + unidentified_value_bias_params(shape)


def unidentified_params_per_layer(shape: LayerShape) -> int:
    """Total nullity of one attention layer: query-key + output-value + biases."""
    return unidentified_qk_params(shape) + unidentified_ov_params(shape) + unidentified_bias_params(shape)


def identified_fraction(
    n_embd: int,
    n_head: int,
    n_kv_head: int | None = None,
    head_dim: int | None = None,
    rope: bool = False,
    bias: bool = False,
    value_dim: int | None = None,
    out_bias: bool | None = None,
) -> float:
    """Identified share of one attention layer's parameters (weights + biases) (T3, §4.5).

    For plain MHA with ``D = E/H`` this is ``1 - 2 H D^2 / (4 E^2) = 1 - 1/(2H)``
    (15/16 at 8 heads, 1/2 for one full-width head). Pure; for Figure 1's curves.
    """
    shape = layer_shape(n_embd, n_head, n_kv_head, head_dim, value_dim, rope, bias, out_bias)
    return 1.0 - unidentified_params_per_layer(shape) / attention_params_per_layer(shape)


def layer_counts(shape: LayerShape) -> dict:
    """Every per-layer count, plus the query-key count the same shape would have as
    plain MHA (``H D^2``), with GQA alone (``G D^2``) and with RoPE alone (``H D``),
    so the paper's GQA/RoPE comparisons (§4.9) can be read off one row."""
    weights = attention_weights_per_layer(shape)
    params = attention_params_per_layer(shape)
    unidentified = unidentified_params_per_layer(shape)
    qk_ov = unidentified_qk_params(shape) + unidentified_ov_params(shape)
    plain = LayerShape(
        shape.n_embd, shape.n_head, shape.n_head, shape.head_dim, shape.value_dim, False, False, False
    )
    gqa_only = LayerShape(
        shape.n_embd, shape.n_head, shape.n_kv_head, shape.head_dim, shape.value_dim, False, False, False
    )
    rope_only = LayerShape(
        shape.n_embd,
        shape.n_head,
        shape.n_head,
        shape.head_dim,
        shape.value_dim,
        shape.head_dim % 2 == 0,
        False,
        False,
    )
    return {
        "attn_weights_per_layer": weights,
        "attn_biases_per_layer": attention_biases_per_layer(shape),
        "attn_params_per_layer": params,
        "unidentified_qk_per_layer": unidentified_qk_params(shape),
        "unidentified_ov_per_layer": unidentified_ov_params(shape),
        "unidentified_key_bias_per_layer": unidentified_key_bias_params(shape),
        "unidentified_value_bias_per_layer": unidentified_value_bias_params(shape),
        "unidentified_bias_per_layer": unidentified_bias_params(shape),
        "unidentified_per_layer": unidentified,
        "identified_fraction": 1.0 - unidentified / params,
        "identified_weight_fraction": 1.0 - qk_ov / weights,
        "qk_if_mha_per_layer": unidentified_qk_params(plain),
        "qk_with_gqa_only_per_layer": unidentified_qk_params(gqa_only),
        "qk_with_rope_only_per_layer": unidentified_qk_params(rope_only),
    }


# ---------------------------------------------------------------------------------------------
# §4.10: the single-head layer that matches a multi-head one (T6, docs/design.md §10)


def single_head_params(e0: int) -> int:
    """Parameters of the paper's single head (§4.10): ``W_Q``, ``W_K`` (``D_0 = E_0``) and a
    square value layer, each ``E_0 x E_0``, no separate output projection: ``3 E_0^2``."""
    return 3 * e0 * e0


def single_head_unidentified_params(e0: int) -> int:
    """Unidentified parameters of the paper's single head: ``E_0^2``, the ``GL_{E_0}`` of its
    query-key pair (Lemma 4.3). Its value layer is a single factor, hence identified."""
    return factor_pair_nullity(e0, e0, e0)


def multi_head_identified_share(n_head: int) -> Fraction:
    """Identified weights of a plain ``H``-head layer (``D = C = E/H``) in units of ``E^2``:
    ``4 - 2/H`` (§4.5: ``4E^2`` weights, ``2 H D^2 = 2E^2/H`` unidentified)."""
    return Fraction(4) - Fraction(2, n_head)


def single_head_ratio_sq_equal_identified(n_head: int) -> Fraction:
    """``(E_0/E)^2`` for equal identified counts as stated: ``2 E_0^2 = (4 - 2/H) E^2``, so ``2 - 1/H``.

    The single head's identified count ``3E_0^2 - E_0^2 = 2E_0^2`` (§4.10)."""
    return multi_head_identified_share(n_head) / 2


def single_head_ratio_sq_half_identified(n_head: int) -> Fraction:
    """``(E_0/E)^2`` when the single head's identified count is taken as half of ``3E_0^2``:
    ``1.5 E_0^2 = (4 - 2/H) E^2``, so ``(8H - 4) / (3H)``.

    This reading reproduces the paper's "roughly 60 % larger" at ``H = 12`` but
    contradicts the paper's own count of ``E_0^2`` unidentified (which leaves
    ``2E_0^2`` identified, not ``1.5 E_0^2``); it is reported as the likely
    source of the paper's number, not as the correct matching.
    """
    return multi_head_identified_share(n_head) / Fraction(3, 2)


def single_head_match_equal_identified(n_embd: int, n_head: int) -> float:
    """``E_0`` of the paper's single head with as many identified weights as an ``H``-head layer
    of width ``E`` (§4.10): ``E_0 = E sqrt(2 - 1/H)``, never ``E`` for ``H > 1`` (no single
    head of the same embedding matches); 1.384 E at ``H = 12``."""
    return n_embd * math.sqrt(single_head_ratio_sq_equal_identified(n_head))


def single_head_match_half_identified(n_embd: int, n_head: int) -> float:
    """``E_0`` under the half-identified reading (:func:`single_head_ratio_sq_half_identified`):
    ``E_0 = E sqrt((8H - 4) / (3H))``, 1.599 E at ``H = 12`` (the paper's "roughly 60 %")."""
    return n_embd * math.sqrt(single_head_ratio_sq_half_identified(n_head))


def single_head_row(n_embd: int, n_head: int) -> dict:
    """One row of the §4.10 table (A3) for a plain ``H``-head layer of width ``E`` (``D = E/H``).

    Parameter ratios compare the single head's ``3 E_0^2`` with the multi-head layer's ``4 E^2``.
    """
    ratio_sq = single_head_ratio_sq_equal_identified(n_head)
    ratio_sq_half = single_head_ratio_sq_half_identified(n_head)
    identified = multi_head_identified_share(n_head) * n_embd**2  # whole whenever H divides E
    return {
        "n_embd": n_embd,
        "n_head": n_head,
        "params_multi_head": 4 * n_embd**2,
        "identified_multi_head": int(identified) if identified.denominator == 1 else float(identified),
        "e0_equal_identified": single_head_match_equal_identified(n_embd, n_head),
        "e0_ratio_equal_identified": math.sqrt(ratio_sq),
        "param_ratio_equal_identified": float(Fraction(3, 4) * ratio_sq),
        "e0_half_identified": single_head_match_half_identified(n_embd, n_head),
        "e0_ratio_half_identified": math.sqrt(ratio_sq_half),
        "param_ratio_half_identified": float(Fraction(3, 4) * ratio_sq_half),
    }


# ---------------------------------------------------------------------------------------------
# An architecture entry's attention (the fields of architectures.yaml, attnid.theory.architectures)


def architecture_shape(spec: dict) -> LayerShape:
    """The attention layer of an architecture entry (``n_embd``, ``n_head``, ``n_kv_head``, ``head_dim``,
    ``value_dim``, ``rope``, ``bias``, ``out_bias``); ValueError for a shape outside the closed forms."""
    return layer_shape(
        spec["n_embd"],
        spec["n_head"],
        spec.get("n_kv_head"),
        spec.get("head_dim"),
        spec.get("value_dim"),
        spec.get("rope", False),
        spec.get("bias", False),
        spec.get("out_bias"),
    )
