"""The shape of one attention layer: the one type every part of the package describes attention with.

Notation (docs/design.md §1): embedding ``E = n_embd``, query heads ``H = n_head``, key/value groups
``G = n_kv_head`` (``G = H`` is plain multi-head attention, ``G = 1`` multi-query), query/key width
``D = head_dim``, value width ``C = value_dim``; RoPE on queries and keys; biases on the query, key and
value projections (``bias``) and on the output projection (``out_bias``). Query head ``h`` reads the
keys and values of group ``h // (H/G)``.

Who builds one: :func:`layer_shape` from settings (filling ``G = H``, ``D = E/H``, ``C = D``); a GPT's
config (:attr:`attnid.model.gpt.GPTConfig.attention`), ``attnid train``'s options
(:attr:`attnid.training.config.TrainConfig.attention`), a checkpoint (``Checkpoint.attention``), a
study point, a nullity case and a whole model hold or give one. The closed forms of
:mod:`attnid.theory.counts` take it, and :mod:`attnid.model.layout` cuts a model's factor pairs by it.

A model can be built with shapes the closed forms do not cover (heads wider than ``E``);
:func:`check_closed_form_domain` refuses those where a count is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerShape:
    """The shape of one attention layer; build it from settings with :func:`layer_shape`."""

    n_embd: int  # E
    n_head: int  # H, query heads
    n_kv_head: int  # G, key/value groups; divides H
    head_dim: int  # D, query/key width per head
    value_dim: int  # C, value width per head
    rope: bool  # rotary position embedding on queries and keys
    bias: bool  # biases on the query, key and value projections
    out_bias: bool  # bias on the output projection

    @property
    def heads_per_group(self) -> int:
        """``H/G``: the query heads that read one key/value group."""
        return self.n_head // self.n_kv_head


def check_closed_form_domain(shape: LayerShape) -> LayerShape:
    """``shape`` itself, if the closed forms of :mod:`attnid.theory.counts` cover it; else ValueError.

    Refused: a size that is not a positive integer, ``G`` not dividing ``H``, ``D > E`` or ``C > E``
    (wider-than-embedding heads have a different, rank-deficient count; no real model has them), odd
    ``D`` with RoPE.
    """
    for name in ("n_embd", "n_head", "n_kv_head", "head_dim", "value_dim"):
        value = getattr(shape, name)
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if shape.n_head % shape.n_kv_head:
        raise ValueError(f"n_kv_head={shape.n_kv_head} must divide n_head={shape.n_head}")
    if shape.head_dim > shape.n_embd or shape.value_dim > shape.n_embd:
        raise ValueError(
            f"head_dim={shape.head_dim} and value_dim={shape.value_dim} must not exceed n_embd={shape.n_embd}"
        )
    if shape.rope and shape.head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {shape.head_dim}")
    return shape


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
    """Fill the defaults (``G = H``, ``D = E/H``, ``C = D``, output bias = ``bias``) and validate
    (:func:`check_closed_form_domain`; ValueError for a shape the formulas do not cover)."""
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    if head_dim is None:
        if n_head <= 0 or n_embd % n_head:
            raise ValueError(f"head_dim not given and n_embd={n_embd} is not a multiple of n_head={n_head}")
        head_dim = n_embd // n_head
    value_dim = head_dim if value_dim is None else value_dim
    out_bias = bias if out_bias is None else out_bias
    check_closed_form_domain(LayerShape(n_embd, n_head, n_kv_head, head_dim, value_dim, rope, bias, out_bias))
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
